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
import time
from collections.abc import Callable
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
    from controller.cli.progress import ProgressLine  # tqdm: not for --help (test_startup)
    from controller.related.clusters import resolve_cluster

    names = a.planners
    g, model, workload, sla = resolve_inputs(a, resolve_cluster)
    opts = Options(planner=PlannerOptions(seed=a.seed), related=related_options(a))
    line = None if a.quiet else ProgressLine()  # stages and a heartbeat (cli/progress.py)
    say = line or (lambda m: None)
    # the planners' own steps only for the heartbeat to quote: a line each would be hundreds
    detail = line.note if line is not None else None

    life = float(workload.mean_output) * sla.tpot_s  # a request's life at the SLA, s

    def count(rate: float) -> int:
        """Requests of a point: its arrivals last ``lives`` request lives (runs shorter than a
        life are bursts, not a rate; docs/simulator.md), within [requests, max_requests]."""
        return int(min(a.max_requests, max(a.requests, math.ceil(rate * a.lives * life))))

    try:
        rows = _rows(a, names, g, model, workload, sla, opts, count, say, detail)
    finally:
        if line is not None:
            line.close()
    print(
        f"Planners on {g.name}, model {model.name}, workload {workload.name}, SLA TTFT "
        f"{sla.ttft_s} s / TPOT {sla.tpot_s} s ({sla.attainment:.0%})\n"
    )
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"\nrows written to {a.json}")
    return 0


def _rows(
    a: argparse.Namespace,
    names: list[str],
    g: Any,
    model: Any,
    workload: Any,
    sla: Any,
    opts: Options,
    count: Callable[[float], int],
    say: Callable[[str], None],
    detail: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    """Each planner's row: planned, then simulated unless ``--no-sim``; stages to ``say``,
    the planners' steps to ``detail``."""
    from controller.related.compare import attainment_at_rate, sla_rate

    rows: list[dict[str, Any]] = []
    for i, name in enumerate(names, 1):
        say(f"planner {i}/{len(names)}: {name}")  # a stage line (cli/progress.py)
        t0 = time.perf_counter()
        try:
            p = REGISTRY[name].plan(g, model, workload, sla, opts, detail)
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
    return rows


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
