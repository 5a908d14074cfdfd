"""Eq. 1: which of two evaluated phases' instances to deploy.

- ``Combination``: the deployment chosen (instance counts) and its predicted figures.
- ``combine``: the counts that maximise H, the SLA-meeting rate, with the fewest GPUs at
  equal H; the predicted TTFT is the SLA's percentile of the busiest prefill instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.costmodel.queueing import pipeline_ttft_quantile, pk_queue_delay
from controller.planner.results import PhaseResult


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
    p = sorted([i for i in pre.instances if i.rate > 0], key=lambda i: -i.rate)
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
    chosen = p[:i]
    total = sum(x.rate for x in chosen)
    ttft = 0.0
    for x in chosen:  # each prefill instance takes load in proportion to its capacity
        lam = rate * x.rate / total if total > 0 else 0.0
        if x.ttft is not None:  # the SLA's percentile of its FIFO pipeline
            t = pipeline_ttft_quantile(lam, x.ttft)
        else:
            t = x.serve_s + pk_queue_delay(lam, x.bottleneck_s)
        ttft = max(ttft, t)
    tpot = max(x.tpot_s for x in d[:j])
    if not math.isfinite(ttft):
        ttft = sla_ttft
    return Combination(i, j, rate, rate / gpus, gpus, ttft, tpot)
