"""Does a simulated point hold as the run grows? For one scenario, HeroServe's plan simulated
at fractions of its predicted H with the evaluation's request lives (30) times each
multiplier: the SLA's attainment and the TTFT percentiles. Near saturation a queue settles
over many lives, so a short run overstates attainment; docs/planner.md ("Thirty lives
overstate a point near saturation") reports what this prints.

    PYTHONPATH=. .venv/bin/python benchmarks/long_runs.py testbed-summarization
        [--servers 24] [--loads 1.0,1.06] [--lives 1,3,10,30]
"""

from __future__ import annotations

import argparse
import time

from controller.evaluation.scenarios import MIN_REQUESTS, SCENARIOS
from controller.planner import PlannerOptions, plan
from controller.sim import SimOptions, Simulator, build_model, make_requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--servers", type=int, default=0, help="track clusters: servers")
    ap.add_argument("--loads", default="1.0", help="fractions of H")
    ap.add_argument("--lives", default="1,3,10", help="multiples of the evaluation's point")
    a = ap.parse_args()
    base = SCENARIOS[a.scenario]
    sc = type(base)(**{**base.__dict__, "servers": a.servers}) if a.servers else base
    g, load = sc.cluster(), sc.load()
    p = plan(g, sc.model_spec(), load, sc.sla(), PlannerOptions())
    h, model = p.predicted.rate, build_model(p, g, load)
    n = sc.requests_at(h)
    print(f"{a.scenario} {a.servers or ''}: H {h:.3f} req/s, predicted TTFT p90 "
          f"{p.predicted.ttft_s:.2f} s, {n} requests a point at H (30 lives, at least "
          f"{MIN_REQUESTS})", flush=True)  # fmt: skip
    for f in (float(x) for x in a.loads.split(",")):
        for k in (float(x) for x in a.lives.split(",")):
            t0 = time.process_time()
            r = Simulator(model, SimOptions()).run(make_requests(load, f * h, int(n * k), seed=0))
            t = r.ttft_s
            print(
                f"  {f:.3f} H  x{k:g} ({int(n * k)} requests): attainment "
                f"{r.attainment:.4f}  TTFT mean {t['mean']:.2f} p50 {t['p50']:.2f} p90 "
                f"{t['p90']:.2f} p99 {t['p99']:.2f} s  ({time.process_time() - t0:.0f} CPU s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
