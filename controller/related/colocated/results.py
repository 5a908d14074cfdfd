"""What a colocated simulator run reports: :class:`ColocatedResult` and
:func:`colocated_result`, which computes it from the run's requests and counters (latency
percentiles, SLA attainment, throughput, node utilisation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from controller.related.colocated.model import ColocatedModel, RequestState
from controller.related.colocated.options import ColocatedOptions
from controller.sim.metrics import percentiles


@dataclass
class ColocatedResult:
    """What one run reports (seconds; rates per second; utilisation a fraction)."""

    requests: int
    finished: int
    offered_rate: float
    duration_s: float
    gpus_used: int
    sla: dict[str, float]
    attainment: float
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    e2e_s: dict[str, float]
    throughput_rps: float  # finished requests / (last finish - first arrival)
    tokens_per_s: float  # prompt and output tokens processed per second over the run
    decode_tokens_per_s: float  # output tokens per second over the run
    # output tokens/s from ``window_after_s`` until the horizon (or while requests still waited)
    window_decode_tokens_per_s: float
    preemptions: int
    node_util: dict[str, float]
    replica_last_finish_s: list[float]
    events: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def colocated_result(
    m: ColocatedModel,
    o: ColocatedOptions,
    reqs: Sequence[RequestState],
    *,
    emitted: list[float],
    now: float,
    last_wait: float,
    preemptions: int,
    rep_last: list[float],
    wall: float,
    events: int,
) -> ColocatedResult:
    """The report of a finished run: ``emitted`` holds every output token's time, ``now``
    when the run stopped, ``last_wait`` when the last request left a queue, ``rep_last``
    each replica's last finish."""
    arr = np.array([r.arrival for r in reqs])
    first = np.array([r.first for r in reqs])
    fin = np.array([r.finish for r in reqs])
    out = np.array([r.out for r in reqs], dtype=float)
    inp = np.array([r.inp for r in reqs], dtype=float)
    done = ~np.isnan(fin)
    ttft = first - arr
    tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), 0.0)
    sla = m.plan.sla.to_dict()
    ok = done & (ttft <= sla["ttft_s"]) & (tpot <= sla["tpot_s"])
    t0 = float(arr.min())
    t1 = float(np.nanmax(fin)) if done.any() else now
    span = max(t1 - t0, 1e-12)
    n = len(arr)
    arr_span = float(arr.max() - t0)
    em = np.asarray(emitted)
    w0 = t0 + o.window_after_s
    w1 = now if o.horizon_s is not None else max(last_wait, w0)
    window = float(np.count_nonzero((em >= w0) & (em <= w1)) / (w1 - w0)) if w1 > w0 else math.nan
    return ColocatedResult(
        requests=n,
        finished=int(done.sum()),
        offered_rate=(n - 1) / arr_span if arr_span > 0 else math.inf,
        duration_s=span,
        gpus_used=m.gpus_used,
        sla=sla,
        attainment=float(ok.mean()),
        ttft_s=percentiles(ttft[done]),
        tpot_s=percentiles(tpot[done & (out > 1)]),
        e2e_s=percentiles((fin - arr)[done]),
        throughput_rps=float(done.sum()) / span,
        tokens_per_s=float(np.sum((inp + out)[done])) / span,
        decode_tokens_per_s=float(em.size) / span,
        window_decode_tokens_per_s=window,
        preemptions=preemptions,
        node_util={x.name: x.busy_s / span for x in m.nodes},
        replica_last_finish_s=[x - t0 if x else math.nan for x in rep_last],
        events=events,
        wall_s=wall,
    )
