"""``--format vllm``: per instance ``vllm serve`` with the NIXL KV connector, a Ray cluster of
its own where it spans servers, and one ``vllm-router`` per pool (docs/export.md, "vLLM").

Every flag's source: TP/PP from the plan; ``--max-num-seqs`` the instance's batch, at least PP
for a pipelined prefill (``in_flight``); ``--kv-transfer-config`` NixlConnector with
``kv_producer`` (prefill) or ``kv_consumer`` (decode); ``VLLM_NIXL_SIDE_CHANNEL_HOST`` the
server's address (vLLM binds and advertises it; its default, localhost, is unreachable from
the other phase's servers) and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` one port per rank from 5600;
for TP > 1 ``--disable-custom-all-reduce`` and ``VLLM_ALLREDUCE_USE_SYMM_MEM=0`` (vLLM's own
all-reduce kernels bypass NCCL and the tuner plugin that applies the plan's scheme).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from controller.errors import InputError
from controller.export.engines import (
    RAY_BLOCK,
    RAY_BLOCK_BASE,
    RUN,
    Command,
    checked_port,
    model_path,
    own_address,
    reach,
    request_limit,
    routers,
    url,
)
from controller.export.layout import InstanceView, Options
from controller.models.engines import VLLM

# Offsets inside an instance's block of Ray ports (engines.RAY_BLOCK): the head's GCS, the
# dashboard, the Ray client server, and each node's fixed ports; workers take the rest.
RAY_PORTS = {
    "--port": 0,
    "--dashboard-port": 1,
    "--ray-client-server-port": 2,
}
RAY_NODE_PORTS = {
    "--node-manager-port": 3,
    "--object-manager-port": 4,
    "--dashboard-agent-listen-port": 5,
    "--dashboard-agent-grpc-port": 6,
    "--runtime-env-agent-port": 7,
    "--metrics-export-port": 8,
}
RAY_WORKER_PORTS = (100, RAY_BLOCK - 1)
# Ray blocks that fit below 65536: 20000 + 45 * 1000 - 1 = 64999.
RAY_BLOCKS = (65536 - RAY_BLOCK_BASE) // RAY_BLOCK


# What vLLM's Ray executor must not copy from the head's environment to workers on other
# servers (it copies all but a few, vllm/ray/ray_env.py): each server binds its own side
# channel, the tuner reads that server's group, and only servers with INA groups name the
# CollNet plugin (and its configuration). vLLM reads the list from
# $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json on the head.
NON_CARRY_OVER = [
    VLLM.side_channel_host_env,
    "HEROSERVE_GROUP",
    "NCCL_COLLNET_ENABLE",
    "NCCL_NET_PLUGIN",
    "HEROSERVE_INA_CONFIG",
]


def ray_blocks(views: list[InstanceView]) -> dict[str, int]:
    """Instance name -> the first of its Ray ports, for each instance that spans servers.
    Two instances need different blocks only when they share a server, so each takes the
    lowest block none of its servers' instances holds (a 1,024-GPU plan's 30 multi-server
    decodes on distinct servers all take block 0); InputError when one needs more than
    RAY_BLOCKS."""
    taken: dict[str, set[int]] = {}  # server -> blocks its instances hold
    out = {}
    for v in views:
        if len(v.servers) < 2:
            continue
        names = [p.server for p in v.servers]
        used = set().union(*(taken.get(s, set()) for s in names))
        k = min(set(range(len(used) + 1)) - used)
        if k >= RAY_BLOCKS:
            raise InputError(
                f"{v.name}: its servers hold {k} other multi-server instances, and Ray ports "
                f"fit {RAY_BLOCKS} blocks of {RAY_BLOCK} below 65536"
            )
        for s in names:
            taken.setdefault(s, set()).add(k)
        out[v.name] = RAY_BLOCK_BASE + k * RAY_BLOCK
    return out


def _ray(
    v: InstanceView, opts: Options, serve: list[str], env: Callable[[str], dict], base: int
) -> list[Command]:
    """Ray head on the instance's first server, workers on the others, then ``vllm serve``
    on the head with ``RAY_ADDRESS`` naming its own cluster; its Ray ports from ``base``."""
    gcs = f"{reach(v.head.server, opts)}:{base}"
    node = [x for flag, off in RAY_NODE_PORTS.items() for x in (flag, str(base + off))]
    node += ["--min-worker-port", str(base + RAY_WORKER_PORTS[0])]
    node += ["--max-worker-port", str(base + RAY_WORKER_PORTS[1])]
    cmds = []
    for k, part in enumerate(v.servers):
        argv = ["ray", "start", "--node-ip-address", own_address(part.server, opts)]
        if k == 0:
            argv += ["--head"] + [x for f, off in RAY_PORTS.items() for x in (f, str(base + off))]
        else:
            argv += ["--address", gcs]
        argv += node + ["--num-gpus", str(len(part.cuda))]
        cmds.append(
            Command(
                part.server,
                v.name,
                argv,
                env(part.server) | part.env,
                "ray head" if k == 0 else "ray worker",
                stage=0 if k == 0 else 1,
                after="" if k == 0 else gcs,
            )
        )
    # in the run's own folder (engines.RUN), made new here: nothing another user planted
    config = f"{RUN}/vllm-{v.role}-{v.index}"
    write = 'umask 077 && mkdir -- "$1" && printf "%s\\n" "$2" > "$1/$3"'
    cmds.append(
        Command(
            v.head.server,
            v.name,
            ["bash", "-c", write, "vllm-config", config, json.dumps(NON_CARRY_OVER),
             "ray_non_carry_over_env_vars.json"],
            what="vllm config",
            stage=1,
        )
    )  # fmt: skip
    cmds.append(
        Command(
            v.head.server,
            v.name,
            serve + ["--distributed-executor-backend", "ray"],
            env(v.head.server) | v.head.env | {"RAY_ADDRESS": gcs, "VLLM_CONFIG_ROOT": config},
            health=url(v.head.server, v.port, opts),
        )
    )
    v.notes.append(
        "vLLM's Ray executor orders ranks by node and GPU id, not in the plan's order: "
        f"check with `RAY_ADDRESS={gcs} ray status` that each server holds the GPUs the plan "
        "gives it"
    )
    return cmds


def _instance(
    v: InstanceView, model: str, opts: Options, side_channel: int, ray: dict[str, int]
) -> list[Command]:
    kv = {
        "kv_connector": VLLM.kv_connector,
        "kv_role": "kv_producer" if v.role == "prefill" else "kv_consumer",
    }
    seqs = request_limit(v, VLLM, "--max-num-seqs")
    checked_port(side_channel + v.tp * v.pp - 1, f"{v.name} NIXL side channel")  # one per rank
    serve = [
        "vllm", "serve", model_path(model, opts),
        "--host", "0.0.0.0",
        "--port", str(v.port),
        "--tensor-parallel-size", str(v.tp),
        "--pipeline-parallel-size", str(v.pp),
        "--max-num-seqs", str(seqs),
        "--kv-transfer-config", json.dumps(kv, separators=(",", ":")),
    ]  # fmt: skip

    def env(server: str) -> dict[str, str]:
        out = {
            VLLM.side_channel_host_env: own_address(server, opts),
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel),
            "VLLM_HOST_IP": own_address(server, opts),
        }
        if v.tp > 1:
            out["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
        return out

    if v.tp > 1:
        serve.append("--disable-custom-all-reduce")
    if len(v.servers) > 1:
        return _ray(v, opts, serve, env, ray[v.name])
    health = url(v.head.server, v.port, opts)
    return [Command(v.head.server, v.name, serve, v.head.env | env(v.head.server), health=health)]


def vllm_commands(views: list[InstanceView], model: str, opts: Options) -> list[Command]:
    """Every instance's processes, then one router per pool (``layout.pools``)."""
    out, port, ray = [], VLLM.ports.kv_side_channel, ray_blocks(views)
    for v in views:
        out += _instance(v, model, opts, port, ray)
        port += v.tp * v.pp  # one side-channel port per rank
    return out + routers(views, opts, VLLM, ["vllm-router", "--vllm-pd-disaggregation"])
