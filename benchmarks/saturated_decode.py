"""A saturated decode instance: the planner's decode rate against the simulator's, per decode
layout, with the KV transfers contending for links as the simulator models them and, as the
baseline in the same run, with every KV transfer taking its time alone (no link shared).

The testbed, OPT-66B, chatbot SLA; every request a 20-token prompt and 11 output tokens (10
decode steps), offered at twice the plan's decode rate so that every micro-batch stays full
(the setting of tests/controller/planner/test_decode_model.py). The simulated rate is the
least-squares slope of finished requests over time on the middle half of the requests
(requests of one length finish in bursts, one cohort per step end). Prints, per layout, the
plan's decode rate, the simulated rate and their ratio, both ways, and the CPU seconds.

A ratio below 1 with contention and about 1 without is the decode step stretched by the KV
transfers that share its links (a tensor group over two servers shares its NICs with the KV
transfers into it). The planner prices that sharing for KV transfers that arrive at random
(docs/costmodel.md "An all-reduce beside the KV transfers"); here every request has the same
length, so a cohort finishes at one step end and the next cohort's transfers arrive
together, in bursts it does not price (docs/planner.md).

    .venv/bin/python benchmarks/saturated_decode.py [--layouts plan,4x2,8x1] [--requests N]
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np

from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.sim import Simulator, build_model, make_requests
from controller.sim.network import FluidNetwork
from controller.topology import testbed as make_testbed
from controller.workload import Workload, default_sla


@contextmanager
def kv_alone():
    """Every KV transfer a plain timed event of its time alone: it shares no link."""
    start = FluidNetwork.start

    def alone(self, a, now):
        if isinstance(a.chan, tuple) and a.chan[0] == "kv":
            return self.delay(a.work.time_alone(a.fixed_s, a.scale), None, a.on_done, now)
        return start(self, a, now)

    FluidNetwork.start = alone  # type: ignore[method-assign]
    try:
        yield
    finally:
        FluidNetwork.start = start  # type: ignore[method-assign]


def served(m, load: Workload, rate: float, n: int) -> float:
    fin = np.sort(
        np.asarray(Simulator(m).run(make_requests(load, rate, n, seed=1)).per_request["finish_s"])
    )
    mid = fin[n // 4 : 3 * n // 4]
    return float(np.polyfit(mid, np.arange(len(mid)), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="plan,4x2,8x1", help="'plan' or TPxPP, comma-separated")
    ap.add_argument("--requests", type=int, default=4000)
    a = ap.parse_args()
    load = Workload("fixed", np.full(10, 20), np.full(10, 11))
    g = make_testbed()
    print(
        "layout  decode (TP x PP)  servers  planner req/s  sim req/s  ratio  KV alone  ratio  CPU s"
    )
    for name in a.layouts.split(","):
        par = None if name == "plan" else tuple(int(x) for x in name.split("x"))
        t0 = time.process_time()
        p = plan(
            g, model_spec("OPT-66B"), load, default_sla("chatbot"), PlannerOptions(decode_par=par)
        )
        rate = sum(i.rate for i in p.decode.instances)
        m = build_model(p, g, load)
        shared = served(m, load, 2 * rate, a.requests)
        with kv_alone():
            alone = served(build_model(p, g, load), load, 2 * rate, a.requests)
        servers = sorted(
            {g.nodes[x]["server"] for i in p.decode.instances for s in i.stages for x in s}
        )
        print(
            f"{name:6}  {p.decode.tp} x {p.decode.pp:<13}  {','.join(servers):8} {rate:13.1f}"
            f"  {shared:9.1f}  {shared / rate:5.3f}  {alone:8.1f}  {alone / rate:5.3f}"
            f"  {time.process_time() - t0:5.1f}"
        )


if __name__ == "__main__":
    main()
