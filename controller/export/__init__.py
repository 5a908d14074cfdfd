"""``heroserve export``: from a plan to what a serving cluster runs (docs/design.md §13).

    heroserve export --plan PLAN.json --format deployment|vllm|sglang [--out DIR]
                     [--topology NAME|FILE] [--controller ADDR] [--tuner-plugin PATH] ...

The plan is checked against its topology first (:func:`check.check_plan`): a GPU that is
missing or used twice, a weight shard that does not fit, a path that is not made of the
topology's links is refused, naming it (exit 2). Then one format is written into ``--out``
(default: the current folder): ``deployment.yaml``, or ``vllm.sh`` + ``vllm.json``, or
``sglang.sh`` + ``sglang.json``. docs/export.md describes every field.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import networkx as nx

from controller.errors import InputError
from controller.export.check import check_plan
from controller.export.deployment import render as render_deployment
from controller.export.engines import (
    render_json,
    render_shell,
    sglang_commands,
    vllm_commands,
)
from controller.export.layout import DEFAULT_TUNER, Options, layout
from controller.plan import Plan

FORMATS = ("deployment", "vllm", "sglang")


def export(plan: Plan, g: nx.Graph, fmt: str, opts: Options) -> dict[str, str]:
    """File name -> contents for ``fmt``; raises :class:`InputError` when ``plan`` does not
    match ``g``."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    check_plan(plan, g)
    views = layout(plan, g, opts)
    if fmt == "deployment":
        return {"deployment.yaml": render_deployment(plan, views, opts)}
    make = vllm_commands if fmt == "vllm" else sglang_commands
    cmds = make(views, plan.model, opts)
    return {
        f"{fmt}.sh": render_shell(fmt, cmds, views),
        f"{fmt}.json": render_json(fmt, cmds, views),
    }


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan JSON (heroserve plan --json PATH)")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--out", default=".", help="folder to write into (created if missing)")
    p.add_argument(
        "--topology",
        default=None,
        help="cluster the plan runs on (built-in name or topology file); default: the plan's own",
    )
    p.add_argument(
        "--controller", default="127.0.0.1:50051", help="controller address the GPU agents dial"
    )
    p.add_argument(
        "--tuner-plugin",
        default=DEFAULT_TUNER,
        help="NCCL_TUNER_PLUGIN value: the plugin's path on the servers",
    )
    p.add_argument("--shm-prefix", default="", help="HEROSERVE_SHM_PREFIX of agents and engines")
    p.add_argument(
        "--model-path",
        default="",
        help="checkpoint the engines load (default: the plan's model's public checkpoint)",
    )
    p.add_argument(
        "--base-port", type=int, default=8100, help="HTTP port of the first instance (+1 each)"
    )


def run(a: argparse.Namespace) -> int:
    from controller.cli.simulate import load_plan
    from controller.topology import resolve_topology

    plan = load_plan(a.plan)
    if not 1 <= a.base_port <= 65535 - 1024:
        raise InputError(f"--base-port {a.base_port} is not in 1..64511")
    try:
        g = resolve_topology(a.topology or plan.topology)
    except InputError as e:
        if a.topology is None:
            raise InputError(f"plan's topology {plan.topology!r}: {e}; pass --topology") from None
        raise
    opts = Options(a.tuner_plugin, a.controller, a.shm_prefix, a.model_path, a.base_port)
    files = export(plan, g, a.format, opts)
    out = Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
    except OSError as e:
        raise InputError(f"cannot write into {out}: {e.strerror}") from None
    print(f"{a.format}: wrote {', '.join(str(out / n) for n in files)}")
    return 0
