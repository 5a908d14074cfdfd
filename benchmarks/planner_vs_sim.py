"""The planner's predicted capacity against the simulator's: for each scenario (the testbed, and
2tracks and 8tracks at the sizes given), chatbot and summarization, HeroServe's plan's
predicted H, the simulated largest rate at which the SLA's share of requests meets it, and
their ratio (simulated / predicted; 1 is a planner that knows its cluster). The rate is
bracketed around H (:func:`bracket`), so the ratio is printed as the bracket it lies in:
``lo-hi`` means ``lo * H`` met the SLA's share and ``hi * H`` did not. Also the TTFT and TPOT
90th percentiles at H, predicted and simulated (the same rate, so a knee between the two
rates cannot hide a disagreement), to show which side binds; and the simulated
throughput at saturation (``saturated``: offered 1.5x the simulated rate, completions per
second over the middle half of the arrivals) over H, which separates the planner's capacity
(sat/H) from the margin the SLA's attainment needs below saturation (sim/sat: requests queue
for decode room as the rate nears capacity).

    PYTHONPATH=. .venv/bin/python benchmarks/planner_vs_sim.py [--topologies testbed,2tracks]
        [--sizes 24,96] [--workloads chatbot,summarization] [--steps 4] [--lives 30]
        [--admission engine] [--planner distserve-paper]

``--steps``: bisections inside the first bracket (its ends 1.25x apart), so the ratio's
bracket is 1.25^(1/2^steps) wide: 1.4% with 4 steps.

``--admission``: how the simulator's prefill instances batch (``engine``, the default: vLLM's
admission under the export's request limit, which the planner prices; or ``stage``, the
rule before; docs/simulator.md).

``--lives``: request lives of arrivals per simulated point (the evaluation's 30 by default;
fewer is faster and overstates attainment near capacity). ``--fast``: every point on the
simulator's fast path (docs/simulator.md "The fast path"), which the 1,200-server rows need.
``--planner``: check another planner's plan the same way (HeroServe's by default).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from controller.evaluation import scenarios as sc
from controller.planner import PLANNERS, PlannerOptions, plan
from controller.sim import (
    SimOptions,
    SimResult,
    build_model,
    run_at,
)
from controller.sim.model import PlanModel
from controller.workload import Workload

TARGET = 0.9  # the SLA's attainment, as the evaluation measures it
OVERLOAD = 1.5  # offered rate over the simulated one when measuring saturation
SAT_LIVES = 6  # request lives of a saturation run: one to fill the queues, then steady
STRIDE = 1.25  # ratio of a first bracket's ends (the planner is expected within [0.8, 1.25])
MAX_STRIDES = 8  # strides tried outward from H before the bracket is given up (0.17-5.96 H)


def bracket(att, h: float, steps: int) -> tuple[float, float]:
    """(lo, hi): attainment at ``lo`` meets TARGET and at ``hi`` misses it; the first bracket
    is H and its neighbour by a factor STRIDE (stepped outward until the attainment
    changes), then bisected ``steps`` times. Starting at H, not at [0, 2H] as
    ``related.compare.sla_rate`` does, spends the points where the answer is expected:
    4 steps bracket the ratio to 1.4% in 6 points, where [0, 2H] needs 7 for 1.6%.
    ``lo`` is 0 when even H / STRIDE^MAX_STRIDES misses; ``hi`` is inf when H *
    STRIDE^MAX_STRIDES meets it."""
    up = att(h) >= TARGET
    lo, hi = (h, math.inf) if up else (0.0, h)
    for _ in range(MAX_STRIDES):
        nxt = (lo if up else hi) * (STRIDE if up else 1 / STRIDE)
        if (att(nxt) >= TARGET) == up:
            lo, hi = (nxt, hi) if up else (lo, nxt)
            continue
        lo, hi = (lo, nxt) if up else (nxt, hi)
        break
    if lo == 0.0 or math.isinf(hi):
        return lo, hi
    for _ in range(steps):
        mid = math.sqrt(lo * hi)  # the bracket's ends are a ratio apart: halve it
        if att(mid) >= TARGET:
            lo = mid
        else:
            hi = mid
    return lo, hi


def saturated(
    model: PlanModel, opts: SimOptions, w: Workload, rate: float, n: int, seed: int
) -> float:
    """Completions per second over the middle half of the arrival span when ``rate`` exceeds
    what the plan serves (the queues grow, every instance of the binding phase stays busy)."""
    res = run_at(model, w, rate, n, seed, options=opts)
    last = max(res.per_request["arrival_s"])
    fin = np.asarray(res.per_request["finish_s"], dtype=float)
    lo, hi = 0.25 * last, 0.75 * last
    return float(np.count_nonzero((fin >= lo) & (fin <= hi))) / (hi - lo)


def row(
    name: str,
    servers: int | None,
    steps: int,
    lives: float,
    seed: int,
    admission: str,
    fast: bool = False,
    planner: str = "heroserve",
) -> str:
    s = sc.scenario(name, servers=servers)
    g, w, sla = s.cluster(), s.load(), s.sla()
    t0 = time.perf_counter()
    p = plan(g, s.model_spec(), w, sla, PlannerOptions(), planner=planner)
    t_plan = time.perf_counter() - t0

    def count(rate: float) -> int:
        return max(sc.MIN_REQUESTS, math.ceil(rate * lives * s.life_s()))

    t0 = time.perf_counter()
    model = build_model(p, g, w)
    opts = SimOptions(seed=seed, prefill_admission=admission, fast=fast)
    h = p.predicted.rate
    at_h: list[SimResult] = []

    def att(rate: float) -> float:
        t1 = time.perf_counter()
        n = count(rate)
        res = run_at(model, w, rate, n, seed, options=opts)
        if rate == h:  # the latencies at H, beside the predicted ones there
            at_h.append(res)
        print(
            f"  {g.name} {s.workload}: {rate / h:.4f} H, {n} requests, attainment "
            f"{res.attainment:.4f} ({time.perf_counter() - t1:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        return res.attainment

    sim_rate, miss = bracket(att, h, steps)
    t_sim = time.perf_counter() - t0
    top = OVERLOAD * max(sim_rate, h)
    sat = saturated(
        model, opts, w, top, max(sc.MIN_REQUESTS, math.ceil(top * SAT_LIVES * s.life_s())), seed
    )
    q = at_h[0].per_request
    ttft = float(np.percentile(q["ttft_s"], 100 * TARGET))
    tpot = float(np.percentile(q["tpot_s"], 100 * TARGET))
    ratio = f"{sim_rate / h:.3f}-{miss / h:.3f}" if h > 0 else "nan"
    return (
        f"{g.name:<14} {s.workload:<13} {h:>9.3f} {sim_rate:>9.3f} {ratio:>11} "
        f"{sat / h if h > 0 else math.nan:>6.2f}  "
        f"{p.predicted.ttft_s:>6.2f} {ttft:>6.2f}  {p.predicted.tpot_s * 1e3:>6.1f} "
        f"{tpot * 1e3:>6.1f}  {p.prefill.tp}x{p.prefill.pp}x{len(p.prefill.instances)}"
        f"/{p.decode.tp}x{p.decode.pp}x{len(p.decode.instances)}  "
        f"{t_plan:>5.1f} {t_sim:>6.1f}"
        + ("  (plan stopped at the planner's time limit)" if p.time_limit_reached else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="testbed,2tracks,8tracks")
    ap.add_argument("--sizes", default="24,96", help="track cluster sizes in servers")
    ap.add_argument("--workloads", default="chatbot,summarization")
    ap.add_argument("--steps", type=int, default=4, help="bisections of the first bracket")
    ap.add_argument("--lives", type=float, default=sc.LIVES, help="request lives per point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--admission",
        choices=("stage", "engine"),
        default=SimOptions.prefill_admission,
        help="how prefill instances batch (SimOptions.prefill_admission)",
    )
    ap.add_argument(
        "--fast",
        action="store_true",
        help="simulate on the fast path (SimOptions.fast; docs/simulator.md), as the "
        "1,200-server rows are",
    )
    ap.add_argument(
        "--planner",
        choices=[x for x in PLANNERS if x != "exhaustive"],
        default="heroserve",
        help="whose plan to check (a baseline's, as heroserve evaluate simulates it)",
    )
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",") if x]
    print(
        f"{'cluster':<14} {'workload':<13} {'H pred':>9} {'H sim':>9} {'sim/H':>11} {'sat/H':>6}  "
        f"{'TTFT p90 at H, pred/sim (s)':>13}  {'TPOT p90 at H, pred/sim (ms)':>13}  "
        f"prefill/decode "
        f"TPxPPxN  plan s, sim s",
        flush=True,
    )
    for topo in a.topologies.split(","):
        for wl in a.workloads.split(","):
            name = f"{topo}-{wl}"
            for n in [None] if topo == "testbed" else sizes:
                print(
                    row(name, n, a.steps, a.lives, a.seed, a.admission, a.fast, a.planner),
                    flush=True,
                )


if __name__ == "__main__":
    main()
