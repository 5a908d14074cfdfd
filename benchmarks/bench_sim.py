"""Simulator speed: simulated requests and events per CPU second and per wall second.

Targets: 10,000 requests of the testbed-chatbot scenario (HeroServe's plan, near its max rate)
in under 10 s; one point of a 2tracks scenario (30 request lives of arrivals, as an evaluation
point holds) at the paper's 1200 servers in about a minute. Planning the cluster and pricing
its plan are reported apart; the point is the simulation. The machine is shared, so wall time
moves with everyone else's load: CPU seconds are the figure to compare.

``--servers N`` adds a 2tracks-chatbot point at N servers (repeatable). Its size is
``--lives`` request lives of arrivals at the rate (default 30, what ``Scenario.requests_at``
gives an evaluation point), or ``--big-requests`` requests when given. Each line prints the
attainment and mean TTFT and TPOT beside the speed, so two runs of the same point (before and
after a change to the simulator) can be checked for the same answer.

    .venv/bin/python benchmarks/bench_sim.py [--requests 10000] [--servers N ...]
                                             [--lives 30 | --big-requests N] [--rate R]
"""

from __future__ import annotations

import argparse
import math
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


def bench(
    name: str,
    requests: int | None,
    lives: float,
    servers: int | None,
    rate_per_gpu: float | None,
) -> None:
    """Plan ``name`` (at ``servers``), price the plan, run one point and print its speed."""
    s = scenario(name, servers=servers or None)
    c0 = cpu_s()
    g = s.cluster()
    p = plan(g, s.model_spec(), s.load(), s.sla(), PlannerOptions(), planner="heroserve")
    c_plan = cpu_s() - c0
    c0 = cpu_s()
    model = build_model(p, g, s.load())
    c_build = cpu_s() - c0
    rpg = rate_per_gpu or 0.7 * p.predicted.rate_per_gpu  # near the simulated max rate
    rate = rpg * model.gpus_used
    n = requests or max(1, math.ceil(rate * lives * s.life_s()))
    reqs = make_requests(s.load(), rate, n, seed=0)
    c0, w0 = cpu_s(), time.perf_counter()
    res = Simulator(model, SimOptions()).run(reqs)
    cpu, wall = cpu_s() - c0, time.perf_counter() - w0
    print(
        f"{name} on {g.name} ({model.gpus_used} GPUs used): {n} requests at {rpg:.4g} "
        f"req/s/GPU ({n / rate / s.life_s():.2f} request lives) -> {cpu:.2f} s CPU, "
        f"{wall:.2f} s wall; {n / cpu:,.0f} requests and {res.events / cpu:,.0f} events per "
        f"CPU s ({res.events:,} events, {res.events / wall:,.0f} per wall s); "
        f"{res.duration_s:.0f} s simulated; attainment {res.attainment:.2%}, mean TTFT "
        f"{res.ttft_s['mean'] * 1e3:.1f} ms, mean TPOT {res.tpot_s['mean'] * 1e3:.2f} ms; "
        f"planning {c_plan:.1f} s CPU, pricing the plan {c_build:.2f} s CPU",
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
    a = ap.parse_args()
    bench("testbed-chatbot", a.requests, a.lives, None, a.rate)
    for n in a.servers:
        bench("2tracks-chatbot", a.big_requests, a.lives, n, a.rate)


if __name__ == "__main__":
    main()
