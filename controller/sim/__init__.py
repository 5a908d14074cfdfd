"""Discrete-event simulator of a disaggregated prefill/decode cluster running a plan
(docs/design.md §7). ``simulate(plan, cluster, workload, rate, n)`` is the one-call entry;
``build_model`` + ``run_at`` (or ``Simulator``) reuse a priced plan across runs (rate sweeps).

Holds :func:`make_requests` (a workload's requests at a rate, or a trace's own arrivals) and
:func:`simulate`. Modules: ``model`` (the plan priced by the planner's functions),
``flows`` (what an activity moves and its time), ``network`` (link sharing: the fluid
network), ``engine`` (the event loop, prefill, stage iterations), ``decode`` (KV transfers,
continuous batching, preemption), ``scheduler`` (the online scheduler inside a run),
``metrics`` (what a run reports), ``options`` (a run's settings)."""

from __future__ import annotations

import networkx as nx
import numpy as np

from controller.errors import InputError
from controller.plan import Plan
from controller.sim.engine import Simulator
from controller.sim.fastpath import FastSimulator
from controller.sim.metrics import SimResult
from controller.sim.model import PlanModel, build_model
from controller.sim.options import SimOptions
from controller.workload import Request, Workload


def make_requests(
    workload: Workload, rate: float, n: int, seed: int = 0, cv: float = 1.0
) -> list[Request]:
    """``n`` requests at ``rate`` req/s (Poisson when cv = 1, gamma otherwise). A trace with
    timestamps keeps its own arrival times, rescaled to ``rate``."""
    times, inputs, outputs = request_arrays(workload, rate, n, seed, cv)
    return [
        Request(float(t), int(i), int(o)) for t, i, o in zip(times, inputs, outputs, strict=True)
    ]


def request_arrays(
    workload: Workload, rate: float, n: int, seed: int = 0, cv: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_requests`` as three arrays (arrival s, input and output tokens), the fast
    path's input."""
    if not rate > 0:
        raise InputError(f"request rate must be positive, got {rate}")
    if cv <= 0:
        raise InputError(f"arrival CV must be positive, got {cv}")
    if workload.arrivals is not None and len(workload.arrivals) > 1:
        t = workload.arrivals - workload.arrivals.min()
        span = float(t.max())
        k = min(n, len(t))
        order = np.argsort(t, kind="stable")[:k]
        scale = ((k - 1) / rate) / float(t[order[-1]]) if span > 0 else 1.0
        return (
            t[order].astype(float) * scale,
            np.asarray(workload.inputs)[order].astype(np.int64),
            np.asarray(workload.outputs)[order].astype(np.int64),
        )
    return workload.arrays(rate, n, seed, cv)


def simulate(
    plan: Plan,
    cluster: nx.Graph,
    workload: Workload,
    rate: float,
    n: int = 2000,
    seed: int = 0,
    cv: float = 1.0,
    options: SimOptions | None = None,
) -> SimResult:
    """Price ``plan`` on ``cluster`` and run ``n`` requests of ``workload`` at ``rate``."""
    return run_at(build_model(plan, cluster, workload), workload, rate, n, seed, cv, options)


def run_at(
    model: PlanModel,
    workload: Workload,
    rate: float,
    n: int,
    seed: int = 0,
    cv: float = 1.0,
    options: SimOptions | None = None,
) -> SimResult:
    """Run ``n`` requests of ``workload`` at ``rate`` on the priced plan ``model``, on the
    simulator ``options`` ask for; the fast path takes them as arrays (not a million
    ``Request`` objects) and keeps its tables on the model for the next run."""
    o = options or SimOptions()
    if o.fast:
        return FastSimulator(model, o).run_arrays(*request_arrays(workload, rate, n, seed, cv))
    return Simulator(model, o).run(make_requests(workload, rate, n, seed, cv))


def simulator_for(model: PlanModel, options: SimOptions | None = None) -> Simulator | FastSimulator:
    """The simulator ``options`` ask for: the fast path with ``fast``, else the event
    simulator (both ``.run(requests) -> SimResult``)."""
    if options is not None and options.fast:
        return FastSimulator(model, options)
    return Simulator(model, options)


__all__ = [
    "FastSimulator",
    "PlanModel",
    "SimOptions",
    "SimResult",
    "Simulator",
    "build_model",
    "make_requests",
    "request_arrays",
    "run_at",
    "simulate",
    "simulator_for",
]
