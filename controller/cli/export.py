"""``heroserve export``: from a plan to what a serving cluster runs (docs/export.md).

    heroserve export --plan PLAN.json --format deployment|vllm|sglang [--out DIR]
                     [--topology NAME|FILE] [--controller ADDR] [--tuner-plugin PATH] ...

The plan is checked against its topology first; one format is written into ``--out``
(default: the current folder).
"""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

from controller.cli.common import cluster_for_plan
from controller.errors import InputError
from controller.export import FORMATS, Options, export
from controller.export.layout import DEFAULT_TUNER
from controller.inputs.plan_checks import load_plan
from controller.topology.graph import servers

HELP = "turn a plan into a deployment file or vLLM/SGLang launch commands (docs/export.md)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan JSON (heroserve plan --json PATH)")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--out", default=".", help="folder to write into (created if missing)")
    p.add_argument(
        "--topology",
        default=None,
        help="cluster the plan runs on (built-in name or topology file); default: the built-in "
        "the plan names (a plan never opens a file)",
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
    p.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        help="--format k8s: the engine the pods run (default: the one the plan was made for)",
    )
    p.add_argument("--image", default="", help="--format k8s: the engines' container image")
    p.add_argument("--router-image", default="", help="--format k8s: the routers' image")
    p.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="SERVER=IP",
        help="a server's address (repeat per server); default: each server's start script "
        "resolves its own name",
    )


def run(a: argparse.Namespace) -> int:
    checked = Options(a.tuner_plugin, a.controller, a.shm_prefix, a.model_path, a.base_port)
    checked.check()  # before the plan is read: a bad flag is named whatever the plan holds
    plan = load_plan(a.plan)
    g = cluster_for_plan(plan, a.topology, a.plan)
    addresses = {}
    for item in a.address:
        server, sep, ip = item.partition("=")
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            sep = ""
        if not sep or server not in servers(g):
            raise InputError(
                f"--address {item!r}: SERVER=IP with SERVER a server of the plan's cluster"
            )
        addresses[server] = ip
    opts = Options(
        tuner_plugin=a.tuner_plugin,
        controller=a.controller,
        shm_prefix=a.shm_prefix,
        model_path=a.model_path,
        base_port=a.base_port,
        addresses=addresses,
        image=a.image,
        router_image=a.router_image,
    )
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
