"""Simulator speed: simulated requests per second of wall time.

Targets: 10,000 requests of the testbed-chatbot scenario (HeroServe's plan, near its max rate)
in under 10 s; one point of a 2tracks scenario in under 5 minutes (the full 1200 servers with
``--servers 1200``). Planning that cluster and pricing its plan are reported apart; the point
is the simulation. ``--big-requests`` sets the point's size (default 100,000: about one
request life of arrivals at 1200 servers; a point of the evaluation, 30 lives, is ~30x more).

    .venv/bin/python benchmarks/bench_sim.py [--requests 10000] [--servers 0|N]
                                             [--big-requests N] [--rate R]
"""

from __future__ import annotations

import argparse
import resource
import time

from controller.evaluation.scenarios import scenario
from controller.planner import PlannerOptions, plan
from controller.sim import SimOptions, Simulator, build_model, make_requests


def cpu_s() -> float:
    """CPU seconds of this process: the figure to compare on a shared machine, where wall
    time moves with everyone else's load."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench(name: str, requests: int, servers: int | None, rate_per_gpu: float | None) -> None:
    s = scenario(name, servers=servers or None)
    t0 = time.perf_counter()
    g = s.cluster()
    p = plan(g, s.model_spec(), s.load(), s.sla(), PlannerOptions(), planner="heroserve")
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build_model(p, g, s.load())
    t_build = time.perf_counter() - t0
    rpg = rate_per_gpu or 0.7 * p.predicted.rate_per_gpu  # near the simulated max rate
    rate = rpg * model.gpus_used
    reqs = make_requests(s.load(), rate, requests, seed=0)
    c0 = cpu_s()
    res = Simulator(model, SimOptions()).run(reqs)
    cpu = cpu_s() - c0
    lives = requests / rate / s.life_s()
    print(
        f"{name} on {g.name} ({model.gpus_used} GPUs used): {requests} requests at "
        f"{rpg:.4g} req/s/GPU ({lives:.1f} request lives of arrivals) -> {res.wall_s:.2f} s "
        f"wall ({cpu:.2f} s CPU, {requests / cpu:,.0f} requests per CPU s), "
        f"{res.requests_per_wall_s:,.0f} requests/s, {res.events:,} events "
        f"({res.events / res.wall_s:,.0f} events/s), {res.duration_s:.0f} s simulated, "
        f"attainment {res.attainment:.1%}; planning {t_plan:.1f} s, pricing the plan "
        f"{t_build:.2f} s",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--servers", type=int, default=None, help="2tracks servers (default: skip)")
    ap.add_argument("--big-requests", type=int, default=100_000, help="2tracks point size")
    ap.add_argument("--rate", type=float, default=None, help="req/s per GPU")
    a = ap.parse_args()
    bench("testbed-chatbot", a.requests, None, a.rate)
    if a.servers:
        bench("2tracks-chatbot", a.big_requests, a.servers, a.rate)


if __name__ == "__main__":
    main()
