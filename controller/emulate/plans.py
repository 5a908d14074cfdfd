"""Which plan an emulation runs, and whether its groups can run on the emulated network.

``heroserve plan`` prices INA against ring on the real links and may choose no INA group at
all (on the testbed, NVLink rings win). The emulation needs groups of each kind, so without
``--plan`` it builds one for the purpose (:func:`emulation_plan`): a flat INA group, a ring
group and, when the controller can install it, a hierarchical-INA group, each from GPUs the
emulated data plane can serve. The data plane delivers a result to one worker per switch
port (docs/dataplane.md), so every INA member must reach its aggregation switch through its
own NIC; :func:`check_plan` refuses a plan that asks for more, naming the member.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from controller.costmodel.netparams import NetParams
from controller.costmodel.ring import ring_order, ring_pattern
from controller.emulate.spec import NetworkSpec, ring_route
from controller.errors import InputError
from controller.plan import SLA, Group, Instance, PhasePlan, Plan, Predicted, Rail, SlotRange
from controller.topology.fabric import Fabric
from controller.topology.graph import gpu_sort_key, servers

DEFAULT_WINDOW = 128  # aggregator indices per group: the in-flight chunks of one member


@dataclass(frozen=True)
class GroupRun:
    """One all-reduce group of a plan, as the emulation runs it."""

    name: str  # "<role>/<instance>/<stage>", as the controller names it
    group: Group

    @property
    def schemes(self) -> tuple[str, ...]:
        """What is measured: the planned scheme, and ring beside INA for comparison."""
        if self.group.scheme == "ring":
            return ("ring",)
        return (self.group.scheme, "ring")


def group_runs(plan: Plan) -> list[GroupRun]:
    """Every group with an all-reduce (two GPUs or more), prefill first."""
    out = []
    for phase in (plan.prefill, plan.decode):
        for g in phase.groups:
            if len(g.gpus) > 1:
                out.append(GroupRun(f"{phase.role}/{g.instance}/{g.stage}", g))
    return out


def own_nic_switch(g: nx.Graph, gpu: str) -> str | None:
    sw = [v for v in g.neighbors(gpu) if g.nodes[v]["kind"] == "switch"]
    return sw[0] if len(sw) == 1 else None


def check_plan(plan: Plan, g: nx.Graph, spec: NetworkSpec) -> None:
    """Refuse (InputError, naming the group and member) what the emulation cannot run."""
    runs = group_runs(plan)
    if not any(r.group.scheme in ("ina", "hier") for r in runs):
        raise InputError(
            "the plan has no INA group: nothing to compare with ring "
            "(run without --plan for a plan made for the emulation)"
        )
    for r in runs:
        grp = r.group
        for gpu in grp.gpus:
            if gpu not in spec.hosts:
                raise InputError(f"group {r.name}: {gpu} is not in the topology")
        ina_sets = [(grp.switch, grp.gpus)] if grp.scheme == "ina" else []
        ina_sets += [(rail.switch, rail.members) for rail in grp.rails]
        for switch, members in ina_sets:
            for gpu in members:
                if spec.hosts[gpu].switch != switch:
                    raise InputError(
                        f"group {r.name}: {gpu} does not reach {switch} through its own NIC; "
                        "the emulated switch delivers results to one worker per port"
                    )
        order = ring_order(g, grp.gpus)
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            ring_route(spec, a, b)  # raises InputError naming the pair


def _whole_servers(gpus: list[str], g: nx.Graph, k: int) -> list[str]:
    """Up to ``k`` of ``gpus``, server after server (the group spans as few servers as its
    size needs, as a tensor-parallel instance does)."""
    return sorted(gpus, key=gpu_sort_key(g))[:k]


def _ina_group(g: nx.Graph, free: set[str], size: int) -> tuple[str, list[str]] | None:
    """The INA switch and GPUs (one GPU type) with the most GPUs on their own ports."""
    best: tuple[int, str, list[str]] | None = None
    types = sorted({g.nodes[n]["gpu_type"] for n in free})
    for sw in sorted(n for n, d in g.nodes(data=True) if d["kind"] == "switch" and d.get("ina")):
        for gpu_type in types:
            cand = [
                n for n in free if own_nic_switch(g, n) == sw and g.nodes[n]["gpu_type"] == gpu_type
            ]
            if len(cand) >= 2 and (best is None or min(len(cand), size) > best[0]):
                best = (min(len(cand), size), sw, _whole_servers(cand, g, size))
    return (best[1], best[2]) if best else None


def _ring_group(g: nx.Graph, free: set[str], size: int) -> list[str] | None:
    srv = servers(g)
    best = max(
        ((len([n for n in gpus if n in free]), s) for s, gpus in srv.items()), default=(0, "")
    )
    if best[0] < 2:
        return None
    return [n for n in srv[best[1]] if n in free][:size]


def _hier_group(g: nx.Graph, free: set[str], per_server: int = 2) -> list[Rail] | None:
    """Two servers (one GPU type) with ``per_server`` free GPUs whose k-th GPUs share an INA
    switch."""
    picked: list[list[str]] = []
    for _, gpus in sorted(servers(g).items()):
        mine = [n for n in gpus if n in free and own_nic_switch(g, n)][:per_server]
        if len(mine) == per_server:
            picked.append(mine)
    for i in range(len(picked)):
        for j in range(i + 1, len(picked)):
            a, b = picked[i], picked[j]
            if g.nodes[a[0]]["gpu_type"] != g.nodes[b[0]]["gpu_type"]:
                continue
            sws = [own_nic_switch(g, x) for x in a]
            if all(own_nic_switch(g, y) == s for y, s in zip(b, sws, strict=True)) and all(
                g.nodes[s].get("ina") for s in sws
            ):
                return [
                    Rail(
                        switch=str(sws[k]),
                        shard=k,
                        shards=per_server,
                        members=[a[k], b[k]],
                        slots=None,
                        paths={a[k]: [a[k], str(sws[k])], b[k]: [b[k], str(sws[k])]},
                    )
                    for k in range(per_server)
                ]
    return None


def _group(
    instance: int, gpus: list[str], scheme: str, switch: str | None, window: int, why: str
) -> Group:
    if scheme == "ina":
        assert switch is not None
        paths = {n: [n, switch] for n in gpus}
        slots: SlotRange | None = SlotRange(start=instance * window, count=window)
    else:
        paths, slots = {}, None
    return Group(instance, 0, gpus, scheme, switch, slots, paths, 0.0, None, 0.0, why)  # type: ignore[arg-type]


def emulation_plan(
    g: nx.Graph, *, window: int = DEFAULT_WINDOW, size: int = 4, hier: bool = True
) -> Plan:
    """A plan made for the emulation of ``g`` (module docstring). Raises InputError when the
    topology has no INA switch that two GPUs reach through their own NICs."""
    free = {n for n, d in g.nodes(data=True) if d["kind"] == "gpu"}
    ina = _ina_group(g, free, size)
    if ina is None:
        raise InputError(
            f"topology {g.name}: no INA-capable switch with two GPUs on their own ports"
        )
    groups: dict[str, list[Group]] = {"prefill": [], "decode": []}
    instances: dict[str, list[Instance]] = {"prefill": [], "decode": []}

    def add(gr: Group, role: str) -> None:
        gr.instance = len(instances[role])
        if gr.slots is not None:
            gr.slots = SlotRange(start=gr.instance * window, count=window)
        groups[role].append(gr)
        instances[role].append(Instance(stages=[list(gr.gpus)]))
        free.difference_update(gr.gpus)

    sw, members = ina
    add(
        _group(0, members, "ina", sw, window, f"emulation: every member on {sw} by its own NIC"),
        "prefill",
    )
    if hier:
        rails = _hier_group(g, free)
        if rails is not None:
            gpus = sorted({m for r in rails for m in r.members}, key=gpu_sort_key(g))
            gr = _group(0, gpus, "hier", None, window, "emulation: two servers, one rail per GPU")
            for k, r in enumerate(rails):
                r.slots = SlotRange(start=(2 + k) * window, count=window)  # after the INA group's
            gr.rails = rails
            gr.paths = {m: p for r in rails for m, p in r.paths.items()}
            add(gr, "prefill")
    ring = _ring_group(g, free, size)
    if ring is not None:
        gr = _group(0, ring, "ring", None, window, "emulation: NCCL ring inside one server")
        gr.paths = ring_pattern(Fabric(g), ring, 1e6, NetParams()).paths
        add(gr, "decode")

    def phase(role: str) -> PhasePlan:
        gs = groups[role]
        tp = len(gs[0].gpus) if gs else 1
        gpu_type = g.nodes[gs[0].gpus[0]]["gpu_type"] if gs else "none"
        return PhasePlan(role, tp, 1, gpu_type, instances[role], gs, 0.0, 0.0, 1, 0.0)  # type: ignore[arg-type]

    used = sum(len(gr.gpus) for gs in groups.values() for gr in gs)
    return Plan(
        planner="emulation",
        topology=str(g.name),
        model="OPT-66B",  # what the controller prices the policies' time models with
        workload="chatbot",
        sla=SLA(2.5, 0.15),
        prefill=phase("prefill"),
        decode=phase("decode"),
        kv_transfer=[],
        predicted=Predicted(0.0, 0.0, 0.0, 0.0, 0.0, used),
        notes=["made by heroserve emulate: one group per scheme the emulated network can run"],
    )
