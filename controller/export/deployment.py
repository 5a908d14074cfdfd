"""``--format deployment``: one YAML file describing the whole deployment (docs/export.md)."""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from controller.export.layout import InstanceView, Options
from controller.plan import Plan

FORMAT_VERSION = 1

HEADER = """\
# HeroServe deployment (heroserve export --format deployment; fields: docs/export.md).
# One entry per serving-engine instance: its role, GPUs by server and CUDA index, TP/PP,
# batch limit, KV-transfer peers and paths, the INA groups of its stages (aggregation switch
# and slots, rails for hierarchical INA), and the environment of its processes on each
# server. gpu_agents: one heroserve-gpu-agent per server, which publishes each group's
# policy table in shared memory for the NCCL tuner plugin. NCCL_ALGO and NCCL_PROTO are
# never set: they would override the tuner.
"""


def shm_segment(group: str, prefix: str) -> str:
    """Where the GPU agent publishes a group's table (csrc/README.md, "Shared memory")."""
    return f"/dev/shm/heroserve-{prefix}{group.replace('/', '.')}"


def _instance(v: InstanceView) -> dict[str, Any]:
    return {
        "name": v.name,
        "role": v.role,
        "tp": v.tp,
        "pp": v.pp,
        "batch": v.batch,
        "rate_rps": v.rate,
        "gpu_type": v.gpu_type,
        "stages": v.stages,
        "servers": [
            {"server": p.server, "gpus": p.cuda, "gpu_ids": p.gpu_ids, "env": p.env}
            for p in v.servers
        ],
        "groups": [
            {
                "group": gr.name,
                "stage": gr.stage,
                "gpus": gr.gpus,
                "scheme": gr.scheme,
                **({"switch": gr.switch, "slots": gr.slots} if gr.scheme == "ina" else {}),
                **({"rails": gr.rails} if gr.scheme == "hier" else {}),
                "why": gr.reason,
            }
            for gr in v.groups
        ],
        "kv_peers": [{"instance": p.instance, "transfers": p.transfers} for p in v.kv_peers],
        "notes": v.notes,
    }


def gpu_agents(views: list[InstanceView], opts: Options) -> list[dict[str, Any]]:
    by_server: dict[str, dict[str, Any]] = {}
    ina: set[str] = set()  # servers whose engines name the CollNet plugin
    for v in views:
        for part in v.servers:
            a = by_server.setdefault(
                part.server,
                {"server": part.server, "gpus": [], "groups": [], "nvlink": part.nvlink},
            )
            a["gpus"] += [f"{gid}:{idx}" for gid, idx in zip(part.gpu_ids, part.cuda, strict=True)]
            a["groups"] += part.groups
            if "HEROSERVE_INA_CONFIG" in part.env:
                ina.add(part.server)
    out = []
    for a in by_server.values():
        argv = ["heroserve-gpu-agent", "--controller", opts.controller, "--node-id", a["server"]]
        for gpu in a["gpus"]:
            argv += ["--gpu", gpu]
        argv += a["nvlink"]  # how its board's NVLink links are named (layout.nvlink_args)
        if a["server"] in ina:  # its engines' CollNet plugin reads the groups written there
            argv += ["--ina-config", opts.ina_config]
        out.append(
            {
                **a,
                "ina_config": a["server"] in ina,
                "command": shlex.join(argv),
                "shm": [shm_segment(gr, opts.shm_prefix) for gr in a["groups"]],
            }
        )
    return out


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a transfer listed under both of its peers is written out twice, not as an
    anchor and an alias that a reader has to chase."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    # lists of plain values (GPU indices, paths) on one line: [srv0-gpu0, s1, srv2-gpu0]
    flow = all(isinstance(x, str | int | float) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _list)


def render(plan: Plan, views: list[InstanceView], opts: Options) -> str:
    doc = {
        "heroserve_deployment": FORMAT_VERSION,
        "plan": {
            "planner": plan.planner,
            "topology": plan.topology,
            "model": plan.model,
            "workload": plan.workload,
            "sla": plan.sla.to_dict(),
            "predicted": {
                "ttft_s": plan.predicted.ttft_s,
                "tpot_s": plan.predicted.tpot_s,
                "rate_rps": plan.predicted.rate,
                "gpus_used": plan.predicted.gpus_used,
            },
        },
        "nccl_tuner_plugin": opts.tuner_plugin,
        "controller": opts.controller,
        "instances": [_instance(v) for v in views],
        "gpu_agents": gpu_agents(views, opts),
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100)
