"""Planning time and peak memory of every planner of `heroserve plan --planner all` on the
testbed and on the 2tracks and 8tracks 1,200-server clusters (9,600 GPUs each).

Each (cluster, planner) plans in a process of its own, so the peak resident memory printed
is that planner's alone; times are wall-clock and printed beside their ratio to the same
planner's testbed time (the machine's load cancels out of the ratio, not of the seconds).

    .venv/bin/python benchmarks/planner_time.py [--skip-large] [--planners heroserve,distserve]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

ALL = ("heroserve", "distserve", "ds-atp", "ds-switchml", "distserve-paper")
CLUSTERS = {"testbed": ("OPT-66B", "testbed"), "2tracks": ("OPT-175B", "large"),
            "8tracks": ("OPT-175B", "large")}  # fmt: skip


def one(cluster: str, planner: str) -> tuple[float, float, str]:
    """(plan seconds, peak resident GiB of this process, a summary of the plan)."""
    from controller.errors import InputError
    from controller.models import model_spec
    from controller.planner import plan
    from controller.topology import resolve_topology
    from controller.workload import chatbot, default_sla

    model, scale = CLUSTERS[cluster]
    g = resolve_topology(cluster)
    t0 = time.perf_counter()
    try:
        p = plan(g, model_spec(model), chatbot(), default_sla("chatbot", scale), planner=planner)
        what = (
            f"prefill {p.prefill.tp}x{p.prefill.pp}, decode {p.decode.tp}x{p.decode.pp}, "
            f"{p.predicted.gpus_used} GPUs, H {p.predicted.rate:.3f} req/s"
        )
    except InputError as e:
        what = f"no plan ({e})"
    took = time.perf_counter() - t0
    return took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-large", action="store_true", help="the testbed only")
    ap.add_argument("--planners", default=",".join(ALL), help="comma-separated planners")
    a = ap.parse_args()
    planners = [x.strip() for x in a.planners.split(",") if x.strip()]
    clusters = ["testbed"] if a.skip_large else list(CLUSTERS)
    ctx = mp.get_context("spawn")
    base: dict[str, float] = {}
    print(f"{'cluster':<8} {'planner':<16} {'plan s':>8} {'x testbed':>9} {'peak GiB':>8}  plan")
    for cluster in clusters:
        for planner in planners:
            with ctx.Pool(1) as pool:
                took, peak, what = pool.apply(one, (cluster, planner))
            if cluster == "testbed":
                base[planner] = took
            ratio = (
                f"{took / base[planner]:.0f}x" if cluster != "testbed" and planner in base else "-"
            )
            print(
                f"{cluster:<8} {planner:<16} {took:8.2f} {ratio:>9} {peak:8.2f}  {what}", flush=True
            )


if __name__ == "__main__":
    main()
