"""Eq. 1: which of two evaluated phases' instances to deploy.

- ``Combination``: the deployment chosen (instance counts) and its predicted figures.
- ``combine``: the counts that maximise H, the SLA-meeting rate, with the fewest GPUs at
  equal H.
- ``deployed_ttft``: the predicted TTFT at a rate, the SLA's percentile of the busiest
  prefill instance; ``best_prefill``: the prefill instances a combination deploys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.costmodel.queueing import pipeline_ttft_quantile, pk_queue_delay
from controller.planner.results import InstanceEval, PhaseResult


@dataclass
class Combination:
    """The deployment chosen from two evaluated phases: how many of the best instances of each
    to run (the planner decides replica counts), and the predicted figures (Eq. 1)."""

    n_prefill: int
    n_decode: int
    rate: float  # H: requests/s the deployment serves within the SLA
    rate_per_gpu: float  # H / GPUs used
    gpus_used: int
    ttft_s: float
    tpot_s: float

    def better_than(self, other: Combination | None) -> bool:
        """Eq. 1's order: more H; at equal H (within 1e-9), fewer GPUs."""
        if other is None:
            return True
        if self.rate > other.rate * (1 + 1e-9):
            return True
        return self.rate >= other.rate * (1 - 1e-9) and self.gpus_used < other.gpus_used


def combine(
    pre: PhaseResult, dec: PhaseResult, sla_ttft: float, max_gpus: int | None = None
) -> Combination | None:
    """Eq. 1: maximise the total SLA-meeting rate H = min(sum of the prefill instances' rates,
    sum of the decode instances' rates) over how many of each to run (best instances first),
    with at most ``max_gpus`` GPUs; at equal H, the fewest GPUs, so an instance that would
    add no rate stays idle. O(I_p log I_d)."""
    p = best_prefill(pre, len(pre.instances))
    d = sorted([i for i in dec.instances if i.rate > 0], key=lambda i: -i.rate)
    if not p or not d:
        return None
    g_p, g_d = pre.tp * pre.pp, dec.tp * dec.pp
    cp = np.cumsum([i.rate for i in p])
    cd = np.cumsum([i.rate for i in d])
    cap = max_gpus if max_gpus is not None else math.inf
    best: tuple[float, int, int, int] | None = None  # (H, GPUs, i, j)
    for i in range(1, len(p) + 1):
        room = (cap - i * g_p) // g_d if cap < math.inf else len(d)
        if room < 1:
            break
        top = int(min(len(d), room))
        # the fewest decode instances that keep up with these i prefill instances
        j = min(top, int(np.searchsorted(cd, cp[i - 1] * (1 - 1e-12))) + 1)
        for jj in {j, max(1, j - 1)}:
            rate = float(min(cp[i - 1], cd[jj - 1]))
            gpus = i * g_p + jj * g_d
            if (
                best is None
                or rate > best[0] * (1 + 1e-9)
                or (rate >= best[0] * (1 - 1e-9) and gpus < best[1])
            ):
                best = (rate, gpus, i, jj)
    if best is None:
        return None
    rate, gpus, i, j = best
    ttft = deployed_ttft(p[:i], rate, sla_ttft)
    tpot = max(x.tpot_s for x in d[:j])
    return Combination(i, j, rate, rate / gpus, gpus, ttft, tpot)


def deployed_ttft(chosen: list[InstanceEval], rate: float, sla_ttft: float) -> float:
    """The predicted TTFT (s) of the prefill instances ``chosen`` serving ``rate`` requests/s
    together: each takes load in proportion to its capacity, and the TTFT is the SLA's
    percentile of the busiest one's FIFO pipeline (``pipeline_ttft_quantile``); ``sla_ttft``
    where a pipeline saturates. Called again at a lower rate than the combination's when the
    KV transfer bounds H (``deployment.settle_kv``): the TTFT is the one at the rate served.
    O(len(chosen)) percentiles, each memoised per rate."""
    total = sum(x.rate for x in chosen)
    ttft = 0.0
    for x in chosen:
        lam = rate * x.rate / total if total > 0 else 0.0
        if x.ttft is not None:  # the SLA's percentile of its FIFO pipeline
            t = pipeline_ttft_quantile(lam, x.ttft)
        else:
            t = x.serve_s + pk_queue_delay(lam, x.bottleneck_s)
        ttft = max(ttft, t)
    return ttft if math.isfinite(ttft) else sla_ttft


def best_prefill(pre: PhaseResult, n: int) -> list[InstanceEval]:
    """The ``n`` prefill instances ``combine`` deploys: the fastest first (a stable sort, so
    equal rates keep the phase's order)."""
    return sorted([i for i in pre.instances if i.rate > 0], key=lambda i: -i.rate)[:n]
