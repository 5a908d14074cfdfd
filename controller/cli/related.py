"""Command-line parts of the seed planners (docs/related-planners.md):

- :func:`add_related_args`, :func:`related_options`: the options ``heroserve plan`` and
  ``heroserve compare`` gain for them;
- :func:`run_related_plan`, :func:`colocated_summary`: ``heroserve plan --planner
  helix|costeff|hetero-search`` (and Helix's baselines);
- :func:`run_colocated`, :func:`colocated_report`: ``heroserve simulate`` of a colocated plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from controller.cli.report import fmt_seconds, text_table
from controller.inputs.flags import add_flags, build
from controller.plan import Plan
from controller.planner.options import DEFAULT_TIME_LIMIT_S
from controller.related.options import RelatedOptions


def add_related_args(p: argparse.ArgumentParser) -> None:
    """Options of the seed planners (docs/related-planners.md): ``RelatedOptions``' flags."""
    add_flags(p.add_argument_group("seed planners (helix, costeff, hetero-search)"), RelatedOptions)


def related_options(a: argparse.Namespace) -> RelatedOptions:
    return build(
        RelatedOptions,
        a,
        seed=a.seed,
        planner_time_limit_s=getattr(a, "planner_time_limit", DEFAULT_TIME_LIMIT_S),
    )


def run_related_plan(a: argparse.Namespace) -> int:
    """``heroserve plan --planner helix|costeff|hetero-search|swarm|helix-sp|helix-petals``."""
    from controller.cli.common import resolve_inputs
    from controller.cli.planners import REGISTRY, Options
    from controller.related.clusters import resolve_cluster

    g, model, workload, sla = resolve_inputs(a, resolve_cluster)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not a.quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    opts = Options(related=related_options(a))
    plan = REGISTRY[a.planner].plan(g, model, workload, sla, opts, progress)
    elapsed = time.perf_counter() - t0
    print(
        f"{a.planner} plan: topology {g.name}, model {model.name}, workload {workload.name} "
        f"({elapsed:.1f} s to plan)\n"
    )
    print(colocated_summary(plan))
    if a.json:
        plan.save(a.json)
        print(f"\nplan written to {a.json}")
    return 0


def colocated_summary(plan: Plan, limit: int = 40) -> str:
    """A colocated plan for the terminal: predicted figures, nodes, replicas, notes."""
    col = plan.colocated
    assert col is not None
    pr = plan.predicted
    lines = [
        f"optimises   {col.objective}",
        f"predicted   {pr.rate:.3f} req/s ({pr.rate_per_gpu:.4f} per GPU, {pr.gpus_used} GPUs), "
        f"TTFT {fmt_seconds(pr.ttft_s)}, TPOT {fmt_seconds(pr.tpot_s)}, "
        f"{col.tokens_per_s:.0f} tokens/s",
        f"scheduler   {col.scheduler}"
        + (", partial inference" if col.partial_inference and col.flows else ""),
        "",
    ]
    through: dict[str, float] = {}
    for f in col.flows:
        if f.dst != "sink":
            through[f.dst] = through.get(f.dst, 0.0) + f.flow
    rows = [["node", "GPUs", "layers", "tokens/s", "flow in"]]
    for n in col.nodes[:limit]:
        rows.append([
            n.name, ",".join(n.gpus), f"[{n.start}, {n.end})", f"{n.tokens_per_s:.0f}",
            f"{through[n.name]:.0f}" if n.name in through else "-",
        ])  # fmt: skip
    lines.append(text_table(rows))
    if len(col.nodes) > limit:
        lines.append(f"... {len(col.nodes) - limit} more nodes (see --json)")
    if col.replicas:
        lines.append("")
        rows = [["replica", "nodes", "rate req/s", "share"]]
        for k, r in enumerate(col.replicas[:limit]):
            share = ", ".join(f"{c} {v:.2f}" for c, v in r.share.items() if v > 0) or "-"
            rows.append([str(k), "->".join(r.nodes), f"{r.rate:.3f}", share])
        lines.append(text_table(rows))
    lines.append("")
    lines += [f"note: {n}" for n in plan.notes]
    if plan.time_limit_reached:
        lines.append("time limit reached: the best plan found by then")
    lines += [f"idle: {e.gpus} GPU(s), {e.reason}" for e in plan.idle]
    return "\n".join(lines)


# -- heroserve simulate, colocated -------------------------------------------------------------
def run_colocated(a: argparse.Namespace, plan: Plan) -> int:
    """``heroserve simulate`` of a colocated plan (the flags of controller/cli/simulate.py)."""
    from controller.cli.common import offered_work, plan_cluster, workload_for_plan
    from controller.related.clusters import CLUSTERS, resolve_cluster
    from controller.related.colocated import ColocatedOptions, ColocatedSim, build_colocated
    from controller.topology import BUILTIN

    g = plan_cluster(plan, a.topology, a.plan, resolve_cluster, {**BUILTIN, **CLUSTERS})
    w = workload_for_plan(plan, a.workload, a.plan)
    model = build_colocated(plan, g, w)
    rate, reqs = offered_work(a, plan, w, model.gpus_used)
    print(
        f"simulating {a.requests} {w.name} requests at {rate:.4g} req/s "
        f"({rate / model.gpus_used:.4g} per GPU, {model.gpus_used} GPUs) on {g.name}, "
        f"colocated plan by {plan.planner} ({model.col.scheduler})",
        file=sys.stderr,
    )
    res = ColocatedSim(model, ColocatedOptions(seed=a.seed)).run(reqs)
    print(colocated_report(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res.to_dict(), indent=1) + "\n")
        print(f"result written to {a.json}")
    return 0


def colocated_report(res) -> str:
    ms = 1e3
    lines = [
        f"requests        {res.finished}/{res.requests} finished in {res.duration_s:.1f} s "
        f"(offered {res.offered_rate:.4g} req/s, {res.offered_rate / res.gpus_used:.4g} per GPU)",
        f"SLA attainment  {res.attainment:.1%} (TTFT <= {res.sla['ttft_s']} s and "
        f"TPOT <= {res.sla['tpot_s']} s)",
    ]
    for name, d in (("TTFT", res.ttft_s), ("TPOT", res.tpot_s), ("end to end", res.e2e_s)):
        lines.append(
            f"{name:<15} mean {d['mean'] * ms:8.1f} ms  p50 {d['p50'] * ms:8.1f}  "
            f"p90 {d['p90'] * ms:8.1f}  p99 {d['p99'] * ms:8.1f}"
        )
    busy = sorted(res.node_util.values())
    lines += [
        f"throughput      {res.throughput_rps:.3f} req/s, {res.decode_tokens_per_s:.0f} output "
        f"tokens/s, {res.tokens_per_s:.0f} tokens/s",
        f"preemptions     {res.preemptions}",
        f"node busy       min {busy[0]:.0%}  max {busy[-1]:.0%} over {len(busy)} nodes",
        f"simulated       {res.events} events in {res.wall_s:.2f} s",
    ]
    return "\n".join(lines)
