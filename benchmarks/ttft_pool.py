"""The plan's TTFT percentile against the simulator's below the knee: for each scenario,
HeroServe's plan, and at each fraction of its predicted H the SLA's percentile of TTFT by
the search's closed form (one FIFO pipeline per instance, ``combine.deployed_ttft``), by the
prefill pool that the plan's TTFT comes from (``planner.ttft.pool_ttft``), and simulated
(``SimOptions()``, the engines' admission), with the CPU seconds of the pool and the run.

    PYTHONPATH=. .venv/bin/python benchmarks/ttft_pool.py [--scenarios testbed-chatbot,...]
        [--servers 16] [--fractions 0.5,0.7,0.85,0.95] [--lives 10]

``--servers`` applies to the track scenarios; ``--lives``: request lives of arrivals per
simulated point (at least the evaluation's minimum number of requests).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from controller.evaluation import scenarios as sc
from controller.planner import PlannerOptions, plan
from controller.planner.combine import deployed_ttft
from controller.planner.ttft import pool_ttft
from controller.sim import SimOptions, Simulator, build_model, make_requests

DEFAULT = "testbed-chatbot,testbed-summarization,8tracks-chatbot,8tracks-summarization"


def rows(name: str, servers: int | None, fractions: list[float], lives: float) -> None:
    s = sc.scenario(name, servers=None if name.startswith("testbed") else servers)
    g, w, sla = s.cluster(), s.load(), s.sla()
    p = plan(g, s.model_spec(), w, sla, PlannerOptions(), planner="heroserve")
    m = build_model(p, g, w)
    ev = m.evaluator
    stages = [i.stages for i in p.prefill.instances]
    insts = [ev.prefill_instance(x) for x in stages]
    h = p.predicted.rate
    print(
        f"{g.name} {s.workload}: H {h:.3f} req/s, prefill TP {p.prefill.tp} x PP "
        f"{p.prefill.pp} x {len(stages)}",
        flush=True,
    )
    for f in fractions:
        rate = f * h
        closed = deployed_ttft(insts, rate, math.inf)
        t0 = time.process_time()
        pool = pool_ttft(ev, stages, rate)
        t_pool = time.process_time() - t0
        n = max(sc.MIN_REQUESTS, math.ceil(rate * lives * s.life_s()))
        t0 = time.process_time()
        r = Simulator(m, SimOptions()).run(make_requests(w, rate, n, 0))
        t_sim = time.process_time() - t0
        sim = float(np.percentile(r.per_request["ttft_s"], 100 * sla.attainment))
        print(
            f"  {f:.2f} H: closed form {closed:7.3f}  pool {pool:7.3f}  simulated {sim:7.3f} s"
            f"  (pool/sim {pool / sim:.2f}; {n} requests; pool {t_pool:.2f} s, sim "
            f"{t_sim:.1f} s CPU)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=DEFAULT)
    ap.add_argument("--servers", type=int, default=16)
    ap.add_argument("--fractions", default="0.5,0.7,0.85,0.95")
    ap.add_argument("--lives", type=float, default=10.0)
    a = ap.parse_args()
    fractions = [float(x) for x in a.fractions.split(",") if x]
    for name in a.scenarios.split(","):
        rows(name, a.servers, fractions, a.lives)


if __name__ == "__main__":
    main()
