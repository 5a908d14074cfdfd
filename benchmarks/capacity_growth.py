"""Does predicted capacity grow with the cluster? HeroServe planned on the track clusters at
about half and at the paper's full size (1,200 servers), chatbot on OPT-175B (the
scenarios of ``heroserve evaluate``).

For each cluster it prints H (req/s), the GPUs used and left idle, the planner's CPU
seconds, the busiest KV link the plan names (its load at H), and the ratio of H at full
size to H at half size. Where the ratio is below the servers' ratio, the KV note names
the link that binds. 8tracks comes in whole units of 16 servers, so its half size is 592
(37 units), not 600.

    .venv/bin/python benchmarks/capacity_growth.py [--clusters 2tracks,8tracks]
        [--sizes 600,1200] [--workload chatbot]
"""

from __future__ import annotations

import argparse
import time

from controller.evaluation.scenarios import SCENARIOS
from controller.planner import PlannerOptions, plan

HALF = {"2tracks": 600, "8tracks": 592}  # whole units: 6 and 16 servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", default="2tracks,8tracks")
    ap.add_argument("--workload", choices=("chatbot", "summarization"), default="chatbot")
    ap.add_argument("--sizes", default="", help="servers, comma-separated (default: half, 1200)")
    a = ap.parse_args()
    for topo in a.clusters.split(","):
        base = SCENARIOS[f"{topo}-{a.workload}"]
        sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [HALF[topo], 1200]
        hs = []
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
            print(
                f"{topo:8} {n:5} servers  H {p.predicted.rate:10.3f} req/s  GPUs {used:5} "
                f"(idle {idle:4})  {cpu:6.1f} CPU s\n    {kv}",
                flush=True,
            )
        if len(hs) == 2 and hs[0] > 0:
            print(
                f"{topo:8} H({sizes[1]}) / H({sizes[0]}) = {hs[1] / hs[0]:.2f}x "
                f"for {sizes[1] / sizes[0]:.2f}x the servers",
                flush=True,
            )


if __name__ == "__main__":
    main()
