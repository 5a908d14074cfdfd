"""Does predicted capacity grow with the cluster? HeroServe planned on the track clusters at
about half and at the paper's full size (1,200 servers), on OPT-175B (the scenarios of
``heroserve evaluate``; chatbot, or ``--workload summarization``).

For each cluster it prints H (req/s), the GPUs used and left idle (and why, the plan's
``idle`` entries), the planner's CPU seconds, the busiest KV link the plan names (its load at
H), and the ratio of H at full size to H at half size. Where the ratio is below the servers'
ratio, the KV note names the link that binds. 8tracks comes in whole units of 16 servers,
so its half size is 592 (37 units), not 600.

``--simulate`` checks the growth in the simulator too, with few points (30 request lives
each, as an evaluation point): at the smaller size it steps up from H by ``STEP`` until the
SLA's attainment fails (a rate above the simulated capacity, ``miss``); at the larger size
it simulates ``GROWTH x miss``. Where that meets the SLA, the simulated capacity grew at
least ``GROWTH``-fold (attainment falls as the rate rises). Each point prints to stderr.

    .venv/bin/python benchmarks/capacity_growth.py [--clusters 2tracks,8tracks]
        [--sizes 600,1200] [--workload chatbot] [--simulate [--fast]]

``--fast`` simulates on the fast path (docs/simulator.md), a 1,200-server point in about a
minute.
"""

from __future__ import annotations

import argparse
import sys
import time

import networkx as nx

from controller.evaluation.scenarios import SCENARIOS, Scenario
from controller.plan import Plan
from controller.planner import PlannerOptions, plan
from controller.sim import (
    PlanModel,
    SimOptions,
    build_model,
    run_at,
)

HALF = {"2tracks": 600, "8tracks": 592}  # whole units: 6 and 16 servers
TARGET = 0.9  # the SLA's attainment, as the evaluation measures it
GROWTH = 1.8  # the growth to check for twice the servers (10% short of proportional)
STEP = 1.05  # ratio between the smaller size's points above H
MAX_STEPS = 12  # points tried above H at the smaller size (up to 1.05^12 = 1.8 H)


def attainment(
    sc: Scenario, g: nx.Graph, p: Plan, model: PlanModel, rate: float, fast: bool = False
) -> float:
    """The SLA's attainment of ``p`` (priced as ``model``) simulated at ``rate`` req/s (30
    request lives), on the simulator's fast path with ``fast``."""
    t0 = time.process_time()
    n = sc.requests_at(rate)
    res = run_at(model, sc.load(), rate, n, seed=0, options=SimOptions(fast=fast))
    print(
        f"  {g.name} {sc.workload}: {rate:.3f} req/s ({rate / p.predicted.rate:.3f} H), {n} "
        f"requests, attainment {res.attainment:.4f} ({time.process_time() - t0:.0f} CPU s)",
        file=sys.stderr,
        flush=True,
    )
    return res.attainment


def simulated_growth(runs: list[tuple[Scenario, nx.Graph, Plan]], fast: bool = False) -> str:
    """The simulated half of the check (``--simulate``): a rate the smaller cluster misses,
    then ``GROWTH`` times it on the larger one."""
    (s0, g0, p0), (s1, g1, p1) = runs
    m0 = build_model(p0, g0, s0.load())
    miss = p0.predicted.rate
    for _ in range(MAX_STEPS):
        if attainment(s0, g0, p0, m0, miss, fast) < TARGET:
            break
        miss *= STEP
    else:
        return f"{g0.name} meets the SLA up to {miss:.3f} req/s: no upper bound found"
    r = GROWTH * miss
    met = attainment(s1, g1, p1, build_model(p1, g1, s1.load()), r, fast) >= TARGET
    return (
        f"simulated: {g0.name} misses the SLA at {miss:.3f} req/s; {g1.name} "
        + (f"meets it at {GROWTH} x that ({r:.3f}): grew at least {GROWTH}x"
           if met else f"misses it at {GROWTH} x that ({r:.3f}): growth not shown")
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", default="2tracks,8tracks")
    ap.add_argument("--workload", choices=("chatbot", "summarization"), default="chatbot")
    ap.add_argument("--sizes", default="", help="servers, comma-separated (default: half, 1200)")
    ap.add_argument("--simulate", action="store_true", help="check the growth in the simulator")
    ap.add_argument("--fast", action="store_true", help="simulate on the fast path")
    a = ap.parse_args()
    for topo in a.clusters.split(","):
        base = SCENARIOS[f"{topo}-{a.workload}"]
        sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [HALF[topo], 1200]
        hs, runs = [], []
        for n in sizes:
            sc = type(base)(**{**base.__dict__, "servers": n})
            g = sc.cluster()
            t0 = time.process_time()
            p = plan(g, sc.model_spec(), sc.load(), sc.sla(), PlannerOptions())
            cpu = time.process_time() - t0
            used = sum(len(s) for ph in (p.prefill, p.decode) for i in ph.instances
                       for s in i.stages)  # fmt: skip
            idle = sum(x.gpus for x in p.idle)
            kv = next((x for x in p.notes if x.startswith("KV transfer: busiest link")), "-")
            hs.append(p.predicted.rate)
            runs.append((sc, g, p))
            why = "".join(f"\n    idle: {x.gpus} {x.role} GPUs, {x.reason}" for x in p.idle)
            print(
                f"{topo:8} {n:5} servers  H {p.predicted.rate:10.3f} req/s  GPUs {used:5} "
                f"(idle {idle:4})  {cpu:6.1f} CPU s"
                f"{' (stopped at the time limit)' if p.time_limit_reached else ''}\n    {kv}{why}",
                flush=True,
            )
        if len(hs) == 2 and hs[0] > 0:
            print(
                f"{topo:8} H({sizes[1]}) / H({sizes[0]}) = {hs[1] / hs[0]:.2f}x "
                f"for {sizes[1] / sizes[0]:.2f}x the servers",
                flush=True,
            )
        if a.simulate and len(runs) == 2:
            print(f"{topo:8} {simulated_growth(runs, a.fast)}", flush=True)


if __name__ == "__main__":
    main()
