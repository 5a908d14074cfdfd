"""``heroserve compare``: every planner side by side on one cluster.

For each planner: what it optimises (its own objective differs from HeroServe's: Helix and
the heterogeneous search maximise throughput and serve without disaggregation, the
cost-efficiency planner minimises a makespan under a budget, renting GPUs), GPUs used,
planning time, its predicted rate, and the simulated rate: the largest request rate at which
the simulator (``controller.sim`` for disaggregated plans, ``controller.related.colocated`` for
colocated ones) still serves the SLA's share of requests (90% by default) within the TTFT
and TPOT bounds, by bisection. One measure for every plan: Eq. 1's H, whatever each planner
aimed at.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from controller.cli.config import CompareCommand, PlanInputs
from controller.cli.planners import REGISTRY, Options
from controller.cli.related import add_related_args, related_options
from controller.cli.report import text_table
from controller.errors import InputError
from controller.inputs.flags import add_flags
from controller.planner.options import PlannerOptions


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Every planner side by side on one cluster: what it optimises, GPUs, "
        "planning time, predicted and simulated SLA-meeting rate."
    )
    add_flags(p.add_argument_group("inputs"), PlanInputs)
    add_flags(p, CompareCommand)
    add_related_args(p)


def run(a: argparse.Namespace) -> int:
    from controller.cli.common import resolve_inputs
    from controller.related.clusters import resolve_cluster
    from controller.related.compare import attainment_at_rate, sla_rate

    names = a.planners
    g, model, workload, sla = resolve_inputs(a, resolve_cluster)
    opts = Options(planner=PlannerOptions(seed=a.seed), related=related_options(a))
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        if not a.quiet:
            print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    life = float(workload.mean_output) * sla.tpot_s  # a request's life at the SLA, s

    def count(rate: float) -> int:
        """Requests of a point: its arrivals last ``lives`` request lives (runs shorter than a
        life are bursts, not a rate; docs/simulator.md), within [requests, max_requests]."""
        return int(min(a.max_requests, max(a.requests, math.ceil(rate * a.lives * life))))

    rows: list[dict[str, Any]] = []
    for name in names:
        say(f"planning with {name}")
        t0 = time.perf_counter()
        try:
            p = REGISTRY[name].plan(g, model, workload, sla, opts)
        except InputError as e:
            rows.append({"planner": name, "error": str(e)})
            continue
        row: dict[str, Any] = {
            "planner": name,
            "layout": p.layout,
            "optimises": p.colocated.objective if p.colocated else REGISTRY[name].optimises,
            "gpus": p.predicted.gpus_used,
            "plan_s": time.perf_counter() - t0,
            "predicted_rate": p.predicted.rate,
            "predicted_rate_per_gpu": p.predicted.rate_per_gpu,
        }
        if p.colocated is not None and p.colocated.solver:
            row["solver"] = p.colocated.solver.get("status")
        if not a.no_sim:
            say(f"simulating {name}'s plan")
            at = attainment_at_rate(p, g, workload, count, a.seed, sla.attainment)
            rate, att = sla_rate(at, p.predicted.rate, sla.attainment, a.steps)
            row["simulated_rate"] = rate
            row["simulated_rate_per_gpu"] = rate / p.predicted.gpus_used if rate else 0.0
            row["attainment"] = att
        rows.append(row)
    print(
        f"Planners on {g.name}, model {model.name}, workload {workload.name}, SLA TTFT "
        f"{sla.ttft_s} s / TPOT {sla.tpot_s} s ({sla.attainment:.0%})\n"
    )
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"\nrows written to {a.json}")
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    out = [["planner", "layout", "optimises", "GPUs", "plan s", "pred r/s", "pred r/s/GPU",
            "sim r/s", "sim r/s/GPU"]]  # fmt: skip
    notes = []
    for r in rows:
        if "error" in r:
            notes.append(f"{r['planner']}: no plan ({r['error']})")
            continue
        sim = r.get("simulated_rate")
        out.append([
            r["planner"], r["layout"], REGISTRY[r["planner"]].short, str(r["gpus"]),
            f"{r['plan_s']:.1f}", f"{r['predicted_rate']:.3f}",
            f"{r['predicted_rate_per_gpu']:.4f}",
            "-" if sim is None else f"{sim:.3f}",
            "-" if sim is None else f"{r['simulated_rate_per_gpu']:.4f}",
        ])  # fmt: skip
        notes.append(f"{r['planner']} optimises: {r['optimises']}")
    text = text_table(out) if len(out) > 1 else "(no plan)"
    legend = (
        "\nsim r/s: the largest request rate the simulator serves with the SLA's attainment "
        "(the same measure for every plan, Eq. 1's H)\n"
    )
    return text + "\n" + legend + "\n".join(notes)
