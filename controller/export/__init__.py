"""From a plan to what a serving cluster runs (docs/design.md §13); ``heroserve export``
(``controller/cli/export.py``) is its command line.

The plan is checked against its topology first (:func:`check.check_plan`): a GPU that is
missing or used twice, a weight shard that does not fit, a path that is not made of the
topology's links is refused, naming it; so is a plan the chosen engine cannot run
(``engines.check_engine``, by its profile in ``controller/models/engines.py``). Then
:func:`export` renders one format: ``deployment.yaml`` (``deployment``), or ``vllm.sh`` +
``vllm.json`` (``vllm``), or ``sglang.sh`` + ``sglang.json`` (``sglang``), start scripts and
JSON rendered by ``script``, or ``k8s.yaml`` (``k8s``), the same deployment as Kubernetes
manifests. Options the files cannot carry (a controller address that is not HOST:PORT, a
shared-memory prefix with a path in it) are refused first (:meth:`layout.Options.check`).
docs/export.md describes every field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.errors import InputError
from controller.export.options import FORMATS, Options

if TYPE_CHECKING:  # the renderers (and networkx) are imported when a plan is exported
    import networkx as nx

    from controller.plan import Plan


def export(
    plan: Plan, g: nx.Graph, fmt: str, opts: Options, engine: str | None = None
) -> dict[str, str]:
    """File name -> contents for ``fmt``; raises :class:`InputError` when ``plan`` does not
    match ``g``, or when the engine (``fmt``'s own, for k8s ``engine`` or the plan's) cannot
    run it (the rule it breaks)."""
    from controller.export.check import check_plan
    from controller.export.deployment import render as render_deployment
    from controller.export.engines import check_engine, check_servers
    from controller.export.k8s import render_k8s
    from controller.export.layout import layout
    from controller.export.script import render_json, render_shell
    from controller.export.sglang import sglang_commands
    from controller.export.vllm import vllm_commands

    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    opts.check()
    check_plan(plan, g)
    if fmt == "deployment":
        return {"deployment.yaml": render_deployment(plan, layout(plan, g, opts), opts)}
    if fmt == "k8s":
        engine = engine or plan.options.get("engine")
        if engine is None:
            raise InputError("--format k8s: pass --engine vllm|sglang (the plan is for none)")
    else:
        engine = fmt
    profile = check_engine(plan, g, engine)
    views = layout(plan, g, opts)
    if fmt != "k8s":  # the start scripts name each server as a host
        check_servers(list(dict.fromkeys(p.server for v in views for p in v.servers)), opts)
    make = vllm_commands if engine == "vllm" else sglang_commands
    cmds = make(views, plan.model, opts)
    if fmt == "k8s":
        return {"k8s.yaml": render_k8s(profile, cmds, views, opts, plan, g)}
    return {
        f"{fmt}.sh": render_shell(fmt, profile, cmds, views, opts),
        f"{fmt}.json": render_json(fmt, profile, cmds, views, opts),
    }
