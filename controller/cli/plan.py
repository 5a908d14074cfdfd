"""``heroserve plan``: plan a disaggregated deployment with HeroServe and its baselines and
print them side by side (or one planner's plan, the seed papers' planners too).

Bad input prints one line naming the problem and exits 2 (``controller/cli/__init__.py``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from controller.cli.config import PlanCommand, PlanInputs
from controller.cli.related import add_related_args
from controller.errors import InputError
from controller.inputs.args import write_text
from controller.inputs.flags import add_flags, build
from controller.inputs.limits import MAX_PLAN_BYTES
from controller.planner.options import PlannerOptions


def add_args(p: argparse.ArgumentParser) -> None:
    add_flags(p.add_argument_group("inputs"), PlanInputs)
    add_flags(p, PlanCommand)
    add_flags(p.add_argument_group("planner (HeroServe's family)"), PlannerOptions)
    add_related_args(p)


def run(a: argparse.Namespace) -> int:
    from controller.cli.common import profile_compute, resolve_inputs, say_extrapolated
    from controller.cli.planners import REGISTRY, Options
    from controller.cli.progress import ProgressLine
    from controller.cli.related import run_related_plan
    from controller.cli.report import comparison_table, groups_table, idle_lines
    from controller.topology import resolve_topology

    if a.planner != "all" and REGISTRY[a.planner].family == "seed":  # colocated plans
        if a.profile:
            raise InputError("--profile prices HeroServe's family; the seed planners' own")
        return run_related_plan(a)  # docs/related-planners.md
    names = [n for n, p in REGISTRY.items() if p.in_all] if a.planner == "all" else [a.planner]
    t0, cpu0 = time.perf_counter(), time.process_time()  # the time limit covers the whole run
    g, model, workload, sla = resolve_inputs(a, resolve_topology)
    n_gpus = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    verbose = not a.quiet and (a.verbose or n_gpus > 64)  # small clusters plan in a blink
    line = None if a.quiet else ProgressLine()  # stages and a heartbeat (cli/progress.py)

    def progress(msg: str) -> None:
        if line is not None:  # a small cluster's only for a heartbeat to quote (one >10 s)
            (line if verbose else line.note)(msg)

    try:  # the heartbeat thread must end with the command, whatever ends it
        progress(
            f"cluster {g.name}: {n_gpus} GPUs, {g.number_of_nodes()} nodes, "
            f"{g.number_of_edges()} links"
        )
        (compute, source), fit = profile_compute(a.profile, model, g)
        opts = Options(
            planner=build(PlannerOptions, a, seed=a.seed, compute=compute, compute_source=source),
            started=cpu0,
        )
        plans = {}
        failed: dict[str, str] = {}
        limit = opts.planner.time_limit_s
        for i, n in enumerate(names, 1):
            if i > 1 and limit is not None and time.process_time() - cpu0 > limit:
                # the limit covers the whole run: a baseline not yet started is not planned
                # (each would still plan to its first deployment, minutes at 65,536 GPUs)
                failed[n] = f"not planned: the time limit of {limit:g} CPU-s came first"
                continue
            progress(f"planner {i}/{len(names)}: {n}")  # a stage line (cli/progress.py)
            try:
                plans[n] = REGISTRY[n].plan(g, model, workload, sla, opts, progress)
            except InputError as e:
                if n == names[0]:
                    raise
                failed[n] = str(e)  # a baseline with no feasible plan is a result, not an error
    finally:
        if line is not None:
            line.close()
    head = names[0]
    texts = _plan_texts(plans, names) if a.json else {}
    print(
        f"HeroServe offline plan: topology {g.name} ({n_gpus} GPUs), model {model.name}, "
        f"workload {workload.name}, SLA TTFT {sla.ttft_s} s / TPOT {sla.tpot_s} s "
        f"({sla.attainment:.0%})\n"
    )
    print(comparison_table(plans, reference=head))
    idle = idle_lines(plans)
    if idle:
        print(f"\nGPUs left idle (docs/planner.md):\n{idle}")
    for n, why in failed.items():
        print(f"{n}: no plan ({why})")
    say_extrapolated(fit, plans[head], workload)
    print(f"\nGroups of the {head} plan (scheme per group and why):\n")
    print(groups_table(plans[head]))
    if a.json:
        path = Path(a.json)
        for n, text in texts.items():
            write_text(
                path if n == head else path.with_name(f"{path.stem}.{n}.json"), text, "--json"
            )
        print(f"\nplan written to {path}")
    if verbose:
        print(f"planned in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _plan_texts(plans: dict, names: list[str]) -> dict[str, str]:
    """Each plan's JSON, in ``names``' order; a plan larger than every other command reads
    (``MAX_PLAN_BYTES``: validate, export, the controller) is refused before anything is
    written (a 65,536-GPU plan is 77 MB)."""
    out = {}
    for n in names:
        if n in plans:
            text = plans[n].to_json() + "\n"
            size = len(text.encode())
            if size > MAX_PLAN_BYTES:
                raise InputError(
                    f"--json: the {n} plan is {size:,} bytes, above the {MAX_PLAN_BYTES:,} "
                    "every other command reads (plan a smaller cluster)"
                )
            out[n] = text
    return out
