"""What every export format says about a plan, computed once: per instance its role, GPUs by
server and CUDA index, TP/PP, batch limit, KV peers, groups and the environment its processes
need (docs/design.md §13). The formats (deployment YAML, vLLM, SGLang) only render this."""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from controller.export.check import instance_name
from controller.export.options import DEFAULT_TUNER as DEFAULT_TUNER
from controller.export.options import Options
from controller.plan import Group, PhasePlan, Plan

# Variables that override any tuner plugin (csrc/README.md, "The plugin"): never exported.
FORBIDDEN_ENV = ("NCCL_ALGO", "NCCL_PROTO")


@dataclass
class ServerPart:
    """The GPUs of one instance on one server."""

    server: str
    gpu_ids: list[str]
    cuda: list[int]  # CUDA device indices, in the instance's rank order
    groups: list[str]  # groups (``role/instance/stage``) with an all-reduce on this server
    env: dict[str, str] = field(default_factory=dict)
    # what the GPU agent needs to name this server's NVLink links as the topology does
    # (``nvlink_args``): ["--nvlink-mesh"] on a mesh board, none with a fabric node
    nvlink: list[str] = field(default_factory=list)


@dataclass
class KvPeer:
    instance: str
    transfers: list[dict]  # {src, dst, bytes, path} as the plan prices them


@dataclass
class GroupView:
    name: str
    stage: int
    gpus: list[str]
    scheme: str
    switch: str | None
    slots: dict | None
    rails: list[dict]
    reason: str


@dataclass
class InstanceView:
    name: str  # "prefill/0"
    role: str
    index: int
    tp: int
    pp: int
    batch: int  # continuous-batching limit (prefill: requests per batch)
    rate: float
    gpu_type: str
    stages: list[list[str]]
    servers: list[ServerPart]
    groups: list[GroupView]
    kv_peers: list[KvPeer]
    port: int
    notes: list[str] = field(default_factory=list)

    @property
    def head(self) -> ServerPart:
        return self.servers[0]

    @property
    def uses_ina(self) -> bool:
        return any(g.scheme in ("ina", "hier") for g in self.groups)


def group_name(role: str, grp: Group) -> str:
    """The group id of docs/policy-table.md and the controller: ``role/instance/stage``."""
    return f"{role}/{grp.instance}/{grp.stage}"


def _group_view(role: str, grp: Group) -> GroupView:
    slots = {"start": grp.slots.start, "count": grp.slots.count} if grp.slots else None
    rails = [
        {
            "shard": r.shard,
            "shards": r.shards,
            "switch": r.switch,
            "members": list(r.members),
            "slots": {"start": r.slots.start, "count": r.slots.count} if r.slots else None,
            "group": f"{group_name(role, grp)}/rail{k}",
        }
        for k, r in enumerate(grp.rails)
    ]
    return GroupView(
        group_name(role, grp),
        grp.stage,
        list(grp.gpus),
        grp.scheme,
        grp.switch,
        slots,
        rails,
        grp.reason,
    )


def nvlink_args(g: nx.Graph, gpu: str) -> list[str]:
    """The GPU agent's NVLink options for ``gpu``'s server: ``--nvlink-mesh`` when its GPUs
    are linked to each other (a mesh board: the testbed's 4-GPU A100 and V100 servers have
    no fabric node, and the agent's default link ``GPU|SERVER-nvsw`` is not in the
    topology); none when they reach a fabric node, the agent's default."""
    server = g.nodes[gpu].get("server", gpu)
    for peer in g.neighbors(gpu):
        d = g.nodes[peer]
        if d.get("kind") == "gpu" and d.get("server", peer) == server:
            return ["--nvlink-mesh"]
    return []


def _servers(g: nx.Graph, stages: list[list[str]]) -> list[ServerPart]:
    """GPUs grouped by server in rank order (stage 0 first), servers in first-use order."""
    parts: dict[str, ServerPart] = {}
    for stage in stages:
        for gpu in stage:
            node = g.nodes[gpu]
            server = str(node.get("server", gpu))
            part = parts.get(server)
            if part is None:
                part = parts[server] = ServerPart(server, [], [], [], nvlink=nvlink_args(g, gpu))
            part.gpu_ids.append(gpu)
            part.cuda.append(int(node.get("index", len(part.cuda))))
    return list(parts.values())


def _env(part: ServerPart, inst: InstanceView, opts: Options) -> dict[str, str]:
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in part.cuda),
        "NCCL_TUNER_PLUGIN": opts.tuner_plugin,
    }
    if opts.shm_prefix:
        env["HEROSERVE_SHM_PREFIX"] = opts.shm_prefix
    # The tuner reads one HEROSERVE_GROUP per process; every process an engine starts on
    # this server inherits this environment, so it names a group only when exactly one group
    # with an all-reduce has GPUs here.
    if len(part.groups) == 1:
        env["HEROSERVE_GROUP"] = part.groups[0]
    elif len(part.groups) > 1:
        inst.notes.append(
            f"{part.server} holds GPUs of groups {', '.join(part.groups)}: one environment "
            "cannot name each process's group, so HEROSERVE_GROUP is left unset there and NCCL "
            "chooses for those all-reduces"
        )
    if any(g.scheme in ("ina", "hier") and g.name in part.groups for g in inst.groups):
        # NCCL offers its CollNet algorithms (the tuner's INA mapping) only when enabled, and
        # only from a net plugin with a CollNet: ours, which aggregates in the switch with the
        # groups the GPU agent writes. Naming it moves this server's point-to-point traffic
        # to the plugin's TCP net too (csrc/README.md), so only servers with INA groups get it.
        env["NCCL_COLLNET_ENABLE"] = "1"
        env["NCCL_NET_PLUGIN"] = opts.net_plugin
        env["HEROSERVE_INA_CONFIG"] = opts.ina_config
    return env


def _phase(
    g: nx.Graph, plan: Plan, phase: PhasePlan, port0: int, opts: Options
) -> list[InstanceView]:
    out = []
    for i, inst in enumerate(phase.instances):
        groups = [_group_view(phase.role, grp) for grp in phase.groups if grp.instance == i]
        groups.sort(key=lambda v: v.stage)
        view = InstanceView(
            name=instance_name(phase.role, i),
            role=phase.role,
            index=i,
            tp=phase.tp,
            pp=phase.pp,
            batch=inst.batch or phase.batch_size,
            rate=inst.rate or phase.rate_per_instance,
            gpu_type=phase.gpu_type,
            stages=[list(s) for s in inst.stages],
            servers=_servers(g, inst.stages),
            groups=groups,
            kv_peers=[],
            port=opts.base_port + port0 + i,
        )
        allreduce = {v.name for v in groups if len(v.gpus) > 1}
        for part in view.servers:
            part.groups = [
                v.name for v in groups if v.name in allreduce and set(v.gpus) & set(part.gpu_ids)
            ]
            part.env = _env(part, view, opts)
        out.append(view)
    return out


def layout(plan: Plan, g: nx.Graph, opts: Options) -> list[InstanceView]:
    """Every instance of ``plan`` (prefill first), with the KV pairs the plan prices it in.
    ``plan`` must have passed :func:`controller.export.check.check_plan` against ``g``."""
    pre = _phase(g, plan, plan.prefill, 0, opts)
    dec = _phase(g, plan, plan.decode, len(pre), opts)
    owner = {gpu: v for v in pre + dec for st in v.stages for gpu in st}
    pairs: dict[tuple[str, str], list[dict]] = {}
    for kv in plan.kv_transfer:
        p, d = owner[kv.src], owner[kv.dst]
        pairs.setdefault((p.name, d.name), []).append(
            {"src": kv.src, "dst": kv.dst, "bytes": kv.bytes, "path": list(kv.path)}
        )
    by_name = {v.name: v for v in pre + dec}
    for (p, d), transfers in sorted(pairs.items()):
        by_name[p].kv_peers.append(KvPeer(d, transfers))
        by_name[d].kv_peers.append(KvPeer(p, transfers))
    for v in pre + dec:
        if not v.kv_peers:
            v.notes.append(
                "the plan prices no KV transfer for this instance (the router still "
                "pairs it with the other phase's instances by load)"
            )
    return pre + dec


def pools(views: list[InstanceView]) -> list[tuple[list[InstanceView], list[InstanceView]]]:
    """(prefills, decodes) per router: one router over every instance, as the simulator
    routes (docs/planner.md, "KV pairing"): it sends a request to any prefill instance and
    its KV cache to any decode instance, by load. The plan's KV pairs (``kv_peers``) are the
    sample of that traffic the planner prices the links with, not a limit on the router."""
    return [
        (
            [v for v in views if v.role == "prefill"],
            [v for v in views if v.role == "decode"],
        )
    ]
