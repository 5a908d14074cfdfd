"""Simulator speed: simulated requests and events per CPU second and per wall second.

Targets: 10,000 requests of the testbed-chatbot scenario (HeroServe's plan, near its max rate)
in under 10 s; one point of a 2tracks scenario (30 request lives of arrivals, as an evaluation
point holds) at the paper's 1200 servers in about a minute. Planning the cluster and pricing
its plan are reported apart; the point is the simulation. The machine is shared, so wall time
moves with everyone else's load: CPU seconds are the figure to compare.

``--servers N`` adds a point of ``--scenario`` (2tracks-chatbot) at N servers (repeatable).
Its size is ``--lives`` request lives of arrivals at the rate (default 30, what
``Scenario.requests_at`` gives an evaluation point), or ``--big-requests`` requests when
given. Each line prints the attainment and mean TTFT and TPOT beside the speed, so two runs
of the same point (before and after a change to the simulator) can be checked for the same
answer. ``--plans DIR`` keeps
each cluster's plan there (planning 1,200 servers takes minutes): loaded when present,
planned and saved otherwise. ``--paths`` runs every point on each path given, in order:
``event`` (the event simulator with its exact shortcuts), ``exact`` (without them, the
unabridged run, ``SimOptions.shortcuts``), ``fast`` (the compiled fast path,
``SimOptions.fast``; its tables and compilation count as pricing), and prints each later
path's agreement with the first (attainment points, mean TTFT and TPOT) and the speed ratio.

    .venv/bin/python benchmarks/bench_sim.py [--requests 10000] [--servers N ...]
                                             [--scenario 2tracks-chatbot] [--no-testbed]
                                             [--lives 30 | --big-requests N]
                                             [--rate R | --fraction 0.7]
                                             [--plans DIR] [--paths event,exact,fast]
"""

from __future__ import annotations

import argparse
import math
import resource
import time
from pathlib import Path

from controller.evaluation.scenarios import scenario
from controller.inputs.plan_checks import load_plan
from controller.planner import PlannerOptions, plan
from controller.sim import (
    FastSimulator,
    SimOptions,
    SimResult,
    Simulator,
    build_model,
    make_requests,
    request_arrays,
)


def cpu_s() -> float:
    """CPU seconds of this process: the figure to compare on a shared machine, where wall
    time moves with everyone else's load."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


PATHS = ("event", "exact", "fast")  # the event simulator, unabridged, the fast path


def bench(
    name: str,
    requests: int | None,
    lives: float,
    servers: int | None,
    rate_per_gpu: float | None,
    plans: Path | None = None,
    paths: tuple[str, ...] = ("event",),
    fraction: float = 0.7,
) -> None:
    """Plan ``name`` (at ``servers``; reuse the plan kept in ``plans``), price the plan, run
    one point on each of ``paths`` and print its speed, then each path's agreement with
    the first."""
    s = scenario(name, servers=servers or None)
    c0 = cpu_s()
    g = s.cluster()
    kept = plans / f"{name}-{servers or 'default'}.json" if plans else None
    if kept is not None and kept.exists():
        p = load_plan(kept)
    else:
        p = plan(g, s.model_spec(), s.load(), s.sla(), PlannerOptions(), planner="heroserve")
        if kept is not None:
            p.save(kept)
    c_plan = cpu_s() - c0
    rpg = rate_per_gpu or fraction * p.predicted.rate_per_gpu
    gpus = build_model(p, g, s.load()).gpus_used
    rate = rpg * gpus
    n = requests or max(1, math.ceil(rate * lives * s.life_s()))
    arrays = request_arrays(s.load(), rate, n, seed=0)
    head = (
        f"{name} on {g.name} ({gpus} GPUs used): {n} requests at {rpg:.4g} "
        f"req/s/GPU ({n / rate / s.life_s():.2f} request lives)"
    )
    done: list[tuple[str, SimResult, float]] = []
    for label in paths:
        c0 = cpu_s()
        model = build_model(p, g, s.load())  # priced anew: a run keeps the KV routes it built
        c_build = cpu_s() - c0
        c0, w0 = cpu_s(), time.perf_counter()
        if label == "fast":
            sim = FastSimulator(model, SimOptions(fast=True))
            sim.run_arrays(*(a[:1] for a in arrays))  # the tables (and the compiled core)
            c_build += cpu_s() - c0
            c0, w0 = cpu_s(), time.perf_counter()
            res = sim.run_arrays(*arrays)
        else:
            reqs = make_requests(s.load(), rate, n, seed=0)
            res = Simulator(model, SimOptions(shortcuts=label == "event")).run(reqs)
        cpu, wall = cpu_s() - c0, time.perf_counter() - w0
        done.append((label, res, cpu))
        print(
            f"{head}, {label} -> {cpu:.2f} s CPU, "
            f"{wall:.2f} s wall; {n / cpu:,.0f} requests and {res.events / cpu:,.0f} events per "
            f"CPU s ({res.events:,} events, {res.events / wall:,.0f} per wall s); "
            f"{res.duration_s:.0f} s simulated; busiest Ethernet link "
            f"{res.ethernet_util['max']:.1%}; attainment {res.attainment:.2%}, mean TTFT "
            f"{res.ttft_s['mean'] * 1e3:.1f} ms, mean TPOT {res.tpot_s['mean'] * 1e3:.2f} ms; "
            f"planning {c_plan:.1f} s CPU, pricing the plan {c_build:.2f} s CPU",
            flush=True,
        )
    (ref, base, c_ref), *others = done
    for label, res, cpu in others:
        print(
            f"{head}: {label} against {ref}: attainment "
            f"{(res.attainment - base.attainment) * 100:+.3f} points, mean TTFT "
            f"{res.ttft_s['mean'] / base.ttft_s['mean'] - 1:+.2e}, mean TPOT "
            f"{res.tpot_s['mean'] / base.tpot_s['mean'] - 1:+.2e} (relative); "
            f"{c_ref / cpu:.2f}x faster",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10000, help="testbed point size")
    ap.add_argument(
        "--servers", type=int, action="append", default=[], help="a 2tracks point at N servers"
    )
    ap.add_argument("--lives", type=float, default=30.0, help="2tracks point: request lives")
    ap.add_argument("--big-requests", type=int, default=None, help="2tracks point: requests")
    ap.add_argument("--rate", type=float, default=None, help="req/s per GPU")
    ap.add_argument(
        "--fraction",
        type=float,
        default=0.7,
        help="without --rate: this share of the plan's predicted rate (0.7, below its knee)",
    )
    ap.add_argument("--plans", type=Path, default=None, help="keep and reuse plans here")
    ap.add_argument(
        "--paths",
        default="event",
        help=f"comma-separated, run in this order and compared with the first: {', '.join(PATHS)}",
    )
    ap.add_argument("--scenario", default="2tracks-chatbot", help="of the --servers points")
    ap.add_argument("--no-testbed", action="store_true", help="skip the testbed point")
    a = ap.parse_args()
    paths = tuple(x for x in a.paths.split(",") if x)
    if not paths or any(x not in PATHS for x in paths):
        ap.error(f"--paths takes {', '.join(PATHS)}")
    if a.plans is not None:
        a.plans.mkdir(parents=True, exist_ok=True)
    if not a.no_testbed:
        bench("testbed-chatbot", a.requests, a.lives, None, a.rate, a.plans, paths, a.fraction)
    for n in a.servers:
        bench(a.scenario, a.big_requests, a.lives, n, a.rate, a.plans, paths, a.fraction)


if __name__ == "__main__":
    main()
