"""What a simulation run reports (docs/design.md §7): per-request TTFT, TPOT and end-to-end latency,
SLA attainment, percentiles, INA throughput, link utilisation and KV-cache memory.

Holds :func:`percentiles` (the mean/p50/p90/p99 summary every simulator reports, the
colocated one included), :class:`SimResult` (a run's report), :class:`RunRecord` (what a
finished run hands over: plain data, so this module needs nothing of the engine) and
:func:`summarise` (the one from the other).

Units: seconds, bytes, bytes/s; utilisation and attainment are fractions."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from controller.sim.model import PlanModel
from controller.topology.graph import link_id


def percentiles(x: np.ndarray) -> dict[str, float]:
    """Mean, p50, p90 and p99 of ``x`` (all NaN when ``x`` is empty)."""
    if x.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    return {
        "mean": float(np.mean(x)),
        "p50": float(np.percentile(x, 50)),
        "p90": float(np.percentile(x, 90)),
        "p99": float(np.percentile(x, 99)),
    }


@dataclass
class SimResult:
    requests: int
    finished: int
    offered_rate: float  # requests/s of the arrivals (n - 1 over the arrival span)
    duration_s: float  # first arrival to last finish
    gpus_used: int
    sla: dict[str, float]
    attainment: float  # fraction meeting TTFT and TPOT bounds
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    e2e_s: dict[str, float]
    kv_transfer_s: dict[str, float]
    ina_throughput_Bps: float  # bytes of all-reduce messages aggregated in switches per second
    allreduce_throughput_Bps: float  # all-reduce message bytes per second, any scheme
    policy_use: dict[str, int]  # stage iterations per all-reduce policy
    peak_kv_bytes_per_gpu: float  # KV cache on the busiest decode GPU at its peak
    peak_kv_fraction: float  # of that instance's KV room
    kv_overflow_events: int  # times a decode instance held more KV than its room
    preemptions: int  # requests swapped out of a full decode cache (and back in later)
    ethernet_util: dict[str, float]  # over Ethernet links that carried traffic: mean, max, cv
    little: dict[str, float]  # prefill queue and whole system: L, lambda, W, L / (lambda W)
    wall_s: float
    events: int
    rerates: int  # activities re-rated by contention mid-flight
    kv_timeline: list[tuple[float, float]] = field(default_factory=list)
    per_request: dict[str, list[float]] = field(default_factory=dict)
    link_util: dict[str, float] = field(default_factory=dict)  # undirected id -> busier way

    def to_dict(self, per_request: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not per_request:
            d.pop("per_request")
            d.pop("link_util")
        return d

    @property
    def requests_per_wall_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else math.inf


@dataclass
class RunRecord:
    """What one finished run hands to :func:`summarise`: per request (in the order given to
    the run; NaN where the request never got there) and the run's counters."""

    arrival: list[float]
    start_prefill: list[float]  # left the prefill queue
    first_token: list[float]
    kv_done: list[float]  # its KV cache reached the decode instance
    finish: list[float]
    output_tokens: list[int]
    end_s: float  # simulated time when the run stopped
    q_area: float  # prefill queue length integrated over time, request-seconds
    sys_area: float  # requests in the system integrated over time
    ina_bytes: float  # all-reduce message bytes aggregated in switches
    allreduce_bytes: float  # all-reduce message bytes, any scheme
    policy_use: dict[str, int]  # stage iterations per all-reduce policy
    kv_peak_tokens_gpu: float  # KV tokens on the busiest decode GPU at its peak
    kv_peak_fraction: float
    kv_overflow: int
    preemptions: int
    rerates: int
    kv_timeline: list[tuple[float, float]]


def summarise(m: PlanModel, run: RunRecord, wall_s: float, events: int) -> SimResult:
    """The report of ``run`` on ``m`` (link bytes are read from ``m.links``)."""
    arr = np.asarray(run.arrival, dtype=float)
    first = np.asarray(run.first_token, dtype=float)
    fin = np.asarray(run.finish, dtype=float)
    out = np.asarray(run.output_tokens, dtype=float)
    kvd = np.asarray(run.kv_done, dtype=float)
    start = np.asarray(run.start_prefill, dtype=float)
    done = ~np.isnan(fin)
    ttft = first - arr
    tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), 0.0)
    e2e = fin - arr
    sla = m.plan.sla.to_dict()
    ok = done & (ttft <= sla["ttft_s"]) & (tpot <= sla["tpot_s"])
    t_begin = float(np.min(arr))
    t_end = float(np.nanmax(fin)) if done.any() else float(run.end_s)
    span = max(t_end - t_begin, 1e-12)
    n = len(arr)
    arr_span = float(np.max(arr) - t_begin)
    offered = (n - 1) / arr_span if arr_span > 0 else math.inf
    # Little's law on the prefill queue over the whole run (queue empty at both ends)
    wait = start - arr
    lam = n / span
    w_q = float(np.nanmean(wait))
    l_q = run.q_area / span
    l_sys = run.sys_area / span
    w_sys = float(np.nanmean(e2e))
    little = {
        "L": l_q,
        "lambda": lam,
        "W": w_q,
        "ratio": l_q / (lam * w_q) if lam * w_q > 0 else 1.0,
        "L_system": l_sys,
        "W_system": w_sys,
        "ratio_system": l_sys / (lam * w_sys) if lam * w_sys > 0 else 1.0,
    }
    lk = m.links
    util: dict[str, float] = {}
    eth = []
    for e, (u, v) in enumerate(lk.ends):
        if lk.bytes[e] <= 0:
            continue
        x = lk.bytes[e] / (lk.capacity[e] * span)
        lid = link_id(u, v)
        util[lid] = max(util.get(lid, 0.0), x)
        if m.cluster.edges[u, v]["link"] == "ethernet":
            eth.append(x)
    ev = np.asarray(eth)
    ethernet = {
        "links": float(ev.size),
        "mean": float(ev.mean()) if ev.size else 0.0,
        "max": float(ev.max()) if ev.size else 0.0,
        "cv": float(ev.std() / ev.mean()) if ev.size and ev.mean() > 0 else 0.0,
    }
    kvpt = m.model.kv_bytes_per_token()
    return SimResult(
        requests=n,
        finished=int(done.sum()),
        offered_rate=offered,
        duration_s=span,
        gpus_used=m.gpus_used,
        sla=sla,
        attainment=float(ok.mean()),
        ttft_s=percentiles(ttft[done]),
        tpot_s=percentiles(tpot[done & (out > 1)]),
        e2e_s=percentiles(e2e[done]),
        kv_transfer_s=percentiles((kvd - first)[~np.isnan(kvd)]),
        ina_throughput_Bps=run.ina_bytes / span,
        allreduce_throughput_Bps=run.allreduce_bytes / span,
        policy_use=dict(sorted(run.policy_use.items())),
        peak_kv_bytes_per_gpu=run.kv_peak_tokens_gpu * kvpt,
        peak_kv_fraction=run.kv_peak_fraction,
        kv_overflow_events=run.kv_overflow,
        preemptions=run.preemptions,
        ethernet_util=ethernet,
        little=little,
        wall_s=wall_s,
        events=events,
        rerates=run.rerates,
        kv_timeline=run.kv_timeline,
        per_request={
            "arrival_s": arr.tolist(),
            "ttft_s": ttft.tolist(),
            "tpot_s": tpot.tolist(),
            "e2e_s": e2e.tolist(),
            "first_token_s": first.tolist(),
            "kv_done_s": kvd.tolist(),
            "finish_s": fin.tolist(),
        },
        link_util=util,
    )
