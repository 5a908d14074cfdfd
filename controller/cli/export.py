"""``heroserve export``: from a plan to what a serving cluster runs (docs/export.md).

    heroserve export --plan PLAN.json --format deployment|vllm|sglang [--out DIR]
                     [--topology NAME|FILE] [--controller ADDR] [--tuner-plugin PATH] ...

The plan is checked against its topology first; one format is written into ``--out``
(default: the current folder).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.cli.config import ExportCommand
from controller.errors import InputError
from controller.export.options import Options, address_problem
from controller.inputs.flags import add_flags, build


def add_args(p: argparse.ArgumentParser) -> None:
    add_flags(p, ExportCommand)
    add_flags(p.add_argument_group("what the files carry"), Options)


def run(a: argparse.Namespace) -> int:
    from controller.cli.common import cluster_for_plan
    from controller.export import export
    from controller.inputs.plan_checks import load_plan
    from controller.topology.graph import servers

    build(Options, a).check()  # before the plan is read: a bad flag is named whatever it holds
    plan = load_plan(a.plan)
    g = cluster_for_plan(plan, a.topology, a.plan)
    addresses: dict[str, str] = {}
    for item in a.address:
        server, sep, ip = item.partition("=")
        if not sep or server not in servers(g):
            raise InputError(
                f"--address {item!r}: SERVER=IP with SERVER a server of the plan's cluster"
            )
        if server in addresses:
            raise InputError(f"--address {item!r}: {server} was given an address already")
        if why := address_problem(ip):
            raise InputError(f"--address {item!r}: {why}")
        addresses[server] = ip
    opts = build(Options, a, addresses=addresses)
    files = export(plan, g, a.format, opts, a.engine)
    out = Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
    except OSError as e:
        raise InputError(f"cannot write into {out}: {e.strerror}") from None
    print(f"{a.format}: wrote {', '.join(str(out / n) for n in files)}")
    return 0
