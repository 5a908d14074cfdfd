"""The planner's predicted capacity against the simulator's: for each scenario (the testbed, and
2tracks and 8tracks at the sizes given), chatbot and summarization, HeroServe's plan's
predicted H, the simulated largest rate at which the SLA's share of requests meets it (the
rate bisected with the simulator, ``related.compare.sla_rate``), and their ratio (simulated /
predicted; 1 is a planner that knows its cluster). Also the predicted TTFT and TPOT at H and
the simulated ones at the simulated rate, to show which side binds; and the simulated
throughput at saturation (``saturated``: offered 1.5x the simulated rate, completions per
second over the middle half of the arrivals) over H, which separates the planner's capacity
(sat/H) from the margin the SLA's attainment needs below saturation (sim/sat: requests queue
for decode room as the rate nears capacity).

    PYTHONPATH=. .venv/bin/python benchmarks/planner_vs_sim.py [--topologies testbed,2tracks]
        [--sizes 24,96] [--workloads chatbot,summarization] [--steps 6] [--lives 30]

``--lives``: request lives of arrivals per simulated point (the evaluation's 30 by default;
fewer is faster and overstates attainment near capacity). The track clusters at 384 and 1,200
servers need the fast simulator; the sizes are a flag.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from controller.evaluation import scenarios as sc
from controller.planner import PlannerOptions, plan
from controller.related.compare import attainment_at_rate, sla_rate
from controller.sim import SimOptions, Simulator, build_model, make_requests
from controller.workload import Workload

TARGET = 0.9  # the SLA's attainment, as the evaluation measures it
OVERLOAD = 1.5  # offered rate over the simulated one when measuring saturation
SAT_LIVES = 6  # request lives of a saturation run: one to fill the queues, then steady


def saturated(sim: Simulator, w: Workload, rate: float, n: int, seed: int) -> float:
    """Completions per second over the middle half of the arrival span when ``rate`` exceeds
    what the plan serves (the queues grow, every instance of the binding phase stays busy)."""
    reqs = make_requests(w, rate, n, seed)
    fin = np.asarray(sim.run(reqs).per_request["finish_s"], dtype=float)
    lo, hi = 0.25 * reqs[-1].arrival_s, 0.75 * reqs[-1].arrival_s
    return float(np.count_nonzero((fin >= lo) & (fin <= hi))) / (hi - lo)


def row(name: str, servers: int | None, steps: int, lives: float, seed: int) -> str:
    s = sc.scenario(name, servers=servers)
    g, w, sla = s.cluster(), s.load(), s.sla()
    t0 = time.perf_counter()
    p = plan(g, s.model_spec(), w, sla, PlannerOptions(), planner="heroserve")
    t_plan = time.perf_counter() - t0

    def count(rate: float) -> int:
        return max(sc.MIN_REQUESTS, math.ceil(rate * lives * s.life_s()))

    t0 = time.perf_counter()
    att = attainment_at_rate(p, g, w, count, seed, TARGET)
    h = p.predicted.rate
    sim_rate, _ = sla_rate(att, h, TARGET, steps)
    t_sim = time.perf_counter() - t0
    # latencies at the simulated rate, beside the predicted ones at H
    sim = Simulator(build_model(p, g, w), SimOptions(seed=seed))
    res = sim.run(make_requests(w, sim_rate, count(sim_rate), seed))
    top = OVERLOAD * max(sim_rate, h)
    sat = saturated(
        sim, w, top, max(sc.MIN_REQUESTS, math.ceil(top * SAT_LIVES * s.life_s())), seed
    )
    q = res.per_request
    ttft = float(np.percentile(q["ttft_s"], 100 * TARGET))
    tpot = float(np.percentile(q["tpot_s"], 100 * TARGET))
    ratio = sim_rate / h if h > 0 else math.nan
    return (
        f"{g.name:<14} {s.workload:<13} {h:>9.3f} {sim_rate:>9.3f} {ratio:>6.2f} "
        f"{sat / h if h > 0 else math.nan:>6.2f}  "
        f"{p.predicted.ttft_s:>6.2f} {ttft:>6.2f}  {p.predicted.tpot_s * 1e3:>6.1f} "
        f"{tpot * 1e3:>6.1f}  {p.prefill.tp}x{p.prefill.pp}x{len(p.prefill.instances)}"
        f"/{p.decode.tp}x{p.decode.pp}x{len(p.decode.instances)}  "
        f"{t_plan:>5.1f} {t_sim:>6.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="testbed,2tracks,8tracks")
    ap.add_argument("--sizes", default="24,96", help="track cluster sizes in servers")
    ap.add_argument("--workloads", default="chatbot,summarization")
    ap.add_argument("--steps", type=int, default=6, help="bisection steps of the rate")
    ap.add_argument("--lives", type=float, default=sc.LIVES, help="request lives per point")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",") if x]
    print(
        f"{'cluster':<14} {'workload':<13} {'H pred':>9} {'H sim':>9} {'sim/H':>6} {'sat/H':>6}  "
        f"{'TTFT p90 pred/sim (s)':>13}  {'TPOT p90 pred/sim (ms)':>13}  prefill/decode "
        f"TPxPPxN  plan s, sim s",
        flush=True,
    )
    for topo in a.topologies.split(","):
        for wl in a.workloads.split(","):
            name = f"{topo}-{wl}"
            for n in [None] if topo == "testbed" else sizes:
                print(row(name, n, a.steps, a.lives, a.seed), flush=True)


if __name__ == "__main__":
    main()
