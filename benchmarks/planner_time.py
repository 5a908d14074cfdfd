"""Planning time and peak memory of every planner `heroserve plan` offers, on the testbed and
on the 2tracks and 8tracks 1,200-server clusters (9,600 GPUs each): heroserve and the four
baselines of `--planner all`, and the seed papers' helix, costeff and hetero-search.

Each (cluster, planner) plans in a process of its own, so the peak resident memory printed
is that planner's alone. Wall and CPU seconds (``resource.getrusage`` of that process: user
plus system) are printed side by side: on a shared machine the wall time carries the load,
the CPU time much less of it; the ratio is to the same planner's testbed CPU time. A planner
that reached its time limit (``--limit``, `heroserve plan --planner-time-limit`) is marked.
``--save DIR`` writes each plan's JSON to DIR/<cluster>.<planner>.json (after the timing), so
that the plans of two commits can be compared byte for byte (``cmp``): a speed-up that
only caches or vectorises must leave them unchanged. ``--workload`` plans for chatbot (the
default) or summarization requests, whose plans deploy many more prefill instances.

``--servers N`` sizes the track clusters (``2tracks-N``, as `heroserve plan --servers`); the
default is their full 1,200 servers. The machine's load average (``os.getloadavg``) is
printed at the start and end: the wall times mean little without it.

    .venv/bin/python benchmarks/planner_time.py [--skip-large] [--clusters 2tracks]
        [--planners heroserve,helix] [--limit 300] [--save DIR] [--workload summarization]
        [--servers 240]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

# the tree this script is in, not an installed copy: run as a file, Python puts benchmarks/
# on the path and the virtual environment's editable install would plan with another checkout
# (spawned children run this too, so they plan with the same tree)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL = ("heroserve", "distserve", "ds-atp", "ds-switchml", "distserve-paper")
SEED = ("helix", "costeff", "hetero-search")
CLUSTERS = {"testbed": ("OPT-66B", "testbed"), "2tracks": ("OPT-175B", "large"),
            "8tracks": ("OPT-175B", "large")}  # fmt: skip


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(
    cluster: str,
    planner: str,
    limit: float,
    save: str | None = None,
    workload: str = "chatbot",
    servers: int | None = None,
) -> tuple[float, float, float, str]:
    """(plan wall s, plan CPU s, peak resident GiB of this process, a summary of the plan);
    the plan's JSON written under ``save`` when given."""
    from controller.errors import InputError
    from controller.models import model_spec
    from controller.planner import PlannerOptions, plan
    from controller.related import RelatedOptions, plan_related
    from controller.related.clusters import resolve_cluster
    from controller.workload import chatbot, default_sla, summarization

    model, scale = CLUSTERS[cluster]
    g = resolve_cluster(f"{cluster}-{servers}" if servers and cluster != "testbed" else cluster)
    sla = default_sla(workload, scale)
    load = summarization() if workload == "summarization" else chatbot()
    t0, c0 = time.perf_counter(), _cpu()
    try:
        if planner in SEED:
            opts = RelatedOptions(planner_time_limit_s=limit)
            p = plan_related(planner, g, model_spec(model), load, sla, opts)
            shape = f"{len(p.colocated.nodes)} nodes" if p.colocated else ""
        else:
            opts = PlannerOptions(time_limit_s=limit)
            p = plan(g, model_spec(model), load, sla, opts, planner=planner)
            shape = f"prefill {p.prefill.tp}x{p.prefill.pp}, decode {p.decode.tp}x{p.decode.pp}"
        idle = sum(e.gpus for e in p.idle)
        what = (
            f"{shape}, {p.predicted.gpus_used} GPUs ({idle} idle), H {p.predicted.rate:.3f} req/s"
            + (", time limit reached" if p.time_limit_reached else "")
        )
    except InputError as e:
        what, p = f"no plan ({e})", None
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    if save is not None and p is not None:
        (Path(save) / f"{cluster}.{planner}.json").write_text(p.to_json() + "\n")
    return took, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-large", action="store_true", help="the testbed only")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated clusters")
    ap.add_argument("--planners", default=",".join(ALL + SEED), help="comma-separated planners")
    ap.add_argument("--limit", type=float, default=300.0, help="each planner's time limit, s")
    ap.add_argument("--save", metavar="DIR", help="write each plan's JSON here")
    ap.add_argument("--workload", choices=("chatbot", "summarization"), default="chatbot")
    ap.add_argument("--servers", type=int, default=None, help="track clusters' servers")
    a = ap.parse_args()
    if a.save is not None:
        Path(a.save).mkdir(parents=True, exist_ok=True)
    planners = [x.strip() for x in a.planners.split(",") if x.strip()]
    clusters = ["testbed"] if a.skip_large else [x.strip() for x in a.clusters.split(",")]
    ctx = mp.get_context("spawn")
    base: dict[str, float] = {}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; track clusters of "
          f"{a.servers or 1200} servers")  # fmt: skip
    print(
        f"{'cluster':<8} {'planner':<16} {'wall s':>8} {'CPU s':>8} {'x testbed':>9} "
        f"{'peak GiB':>8}  plan"
    )
    for cluster in clusters:
        for planner in planners:
            with ctx.Pool(1) as pool:
                took, cpu, peak, what = pool.apply(
                    one, (cluster, planner, a.limit, a.save, a.workload, a.servers)
                )
            if cluster == "testbed":
                base[planner] = cpu
            ratio = (
                f"{cpu / base[planner]:.0f}x" if cluster != "testbed" and base.get(planner) else "-"
            )
            print(
                f"{cluster:<8} {planner:<16} {took:8.2f} {cpu:8.2f} {ratio:>9} {peak:8.2f}  {what}",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
