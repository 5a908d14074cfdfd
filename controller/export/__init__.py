"""From a plan to what a serving cluster runs (docs/design.md §13); ``heroserve export``
(``controller/cli/export.py``) is its command line.

The plan is checked against its topology first (:func:`check.check_plan`): a GPU that is
missing or used twice, a weight shard that does not fit, a path that is not made of the
topology's links is refused, naming it. Then :func:`export` renders one format:
``deployment.yaml``, or ``vllm.sh`` + ``vllm.json``, or ``sglang.sh`` + ``sglang.json``.
Options the files cannot carry (a controller address that is not HOST:PORT, a shared-memory
prefix with a path in it) are refused first (:meth:`layout.Options.check`).
docs/export.md describes every field.
"""

from __future__ import annotations

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
from controller.export.layout import Options, layout
from controller.plan import Plan

FORMATS = ("deployment", "vllm", "sglang")


def export(plan: Plan, g: nx.Graph, fmt: str, opts: Options) -> dict[str, str]:
    """File name -> contents for ``fmt``; raises :class:`InputError` when ``plan`` does not
    match ``g``."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    opts.check()
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
