"""Turn a :class:`~controller.plan.Plan` into the per-agent policy messages (DESIGN.md §6, §9).

* INA groups (scheme ``ina``) become :class:`InaAssignment` messages for their aggregation
  switch: numeric group id (stable, from the store), slot range (from the slot pool,
  honouring the planner's range when free), worker ids (index in the group's GPU list),
  the switch port towards each worker (next hop of the worker's path, looked up in the
  switch's registered ports) and a multicast group (numbered like the group).
* Every group becomes a :class:`PolicyTable` (docs/policy-table.md) for the GPU agents of
  its members: policy 0 is the planned scheme with the planned paths; an INA group also
  gets policy 1, a ring through the same switch (member i -> switch -> member i+1), so the
  online scheduler (Eqs. 16-18) has a fallback when the switch's links are loaded.
  Initial costs b_c are 0, so before any traffic the planned policy (lowest id) wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller._gen.heroserve.v1 import control_pb2 as pb
from controller.plan import Group, Plan
from controller.slots import SlotPool
from controller.store import Store

DEFAULT_SLOTS_PER_GROUP = 16
# Collective sequence numbers a new table version waits before it applies, beyond the
# highest one any member reported: every member must receive the table before that.
DEFAULT_APPLY_MARGIN = 1024


class PlanError(ValueError):
    """A plan the controller cannot serve (names the group and the problem)."""


def group_name(role: str, group: Group) -> str:
    """``"<role>/<instance>/<stage>"`` (docs/policy-table.md)."""
    return f"{role}/{group.instance}/{group.stage}"


def link_id(a: str, b: str) -> str:
    """``"<nodeA>|<nodeB>"`` with the two names sorted (docs/policy-table.md)."""
    return "|".join(sorted((a, b)))


def path_links(path: list[str]) -> list[str]:
    return [link_id(a, b) for a, b in zip(path, path[1:], strict=False)]


@dataclass
class NodeState:
    """What one agent should hold: keyed messages, so two states can be diffed."""

    switch_groups: dict[int, pb.InaAssignment] = field(default_factory=dict)
    tables: dict[str, pb.PolicyTable] = field(default_factory=dict)
    gpu_ina: dict[int, pb.InaAssignment] = field(default_factory=dict)


@dataclass
class PlanState:
    """Everything derived from one plan at one epoch."""

    plan_id: str
    epoch: int
    assignments: list[pb.InaAssignment]  # every INA group, all switches
    tables: list[pb.PolicyTable]  # every group
    members: dict[str, list[str]]  # group name -> GPU ids
    by_gpu: dict[str, set[str]] = field(default_factory=dict)  # GPU id -> group names
    table_by_name: dict[str, pb.PolicyTable] = field(default_factory=dict)
    ina_by_name: dict[str, pb.InaAssignment] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Index once per plan: every agent's stream looks its groups up here.
        self.table_by_name = {t.group_id: t for t in self.tables}
        self.ina_by_name = {a.group_name: a for a in self.assignments}
        for name, gpus in self.members.items():
            for g in gpus:
                self.by_gpu.setdefault(g, set()).add(name)


def _groups(plan: Plan) -> Iterable[tuple[str, Group]]:
    for phase in (plan.prefill, plan.decode):
        for g in phase.groups:
            yield group_name(phase.role, g), g


def validate(plan: Plan) -> None:
    """Raise :class:`PlanError` naming the first group the controller cannot serve."""
    seen: set[str] = set()
    for name, g in _groups(plan):
        if name in seen:
            raise PlanError(f"group {name}: appears twice")
        seen.add(name)
        if not g.gpus:
            raise PlanError(f"group {name}: no GPUs")
        if len(set(g.gpus)) != len(g.gpus):
            raise PlanError(f"group {name}: a GPU is listed twice")
        if g.scheme not in ("ina", "ring"):
            raise PlanError(f"group {name}: unknown scheme {g.scheme!r}")
        if g.scheme == "ina":
            if not g.switch:
                raise PlanError(f"group {name}: INA without an aggregation switch")
            if len(g.gpus) > 32:
                raise PlanError(f"group {name}: {len(g.gpus)} workers, INA allows 32")
            if g.slots is not None and (g.slots.count <= 0 or g.slots.start < 0):
                raise PlanError(f"group {name}: bad slot range {g.slots}")
            for gpu in g.gpus:
                path = g.paths.get(gpu)
                if not path or path[0] != gpu or g.switch not in path:
                    raise PlanError(
                        f"group {name}: path of {gpu} must start at it and reach {g.switch}"
                    )


def allocate(
    plan: Plan,
    store: Store,
    pool: SlotPool,
    default_capacity: int,
    slots_per_group: int = DEFAULT_SLOTS_PER_GROUP,
) -> dict[str, tuple[int, int, int]]:
    """Allocate slots for every INA group of ``plan`` and free those of groups it dropped.

    Runs inside the caller's store transaction when there is one (all or nothing).
    Returns group name -> (group id, slot start, slot count).
    """
    wanted = {name: g for name, g in _groups(plan) if g.scheme == "ina"}
    out: dict[str, tuple[int, int, int]] = {}
    with store.transaction():
        for sw in pool.switches():
            for a in pool.allocations(sw):
                g = wanted.get(a.owner)
                if g is None or g.switch != sw:
                    pool.free(sw, a.owner)
        for name, g in sorted(wanted.items()):
            assert g.switch is not None
            if pool.capacity(g.switch) is None:
                pool.set_capacity(g.switch, default_capacity)
            count = g.slots.count if g.slots else slots_per_group
            prefer = g.slots.start if g.slots else None
            a = pool.allocate(g.switch, name, count, prefer_start=prefer)
            out[name] = (store.group_id(name), a.start, a.count)
    return out


def _table_digest(t: pb.PolicyTable) -> str:
    # Version and utilisation are not content: a new utilisation snapshot alone does not
    # make a new table version.
    c = pb.PolicyTable()
    c.CopyFrom(t)
    c.version = 0
    c.apply_from_seq = 0
    c.utilisation.clear()
    return hashlib.sha256(c.SerializeToString(deterministic=True)).hexdigest()


def build(
    plan: Plan,
    plan_id: str,
    epoch: int,
    store: Store,
    slots: dict[str, tuple[int, int, int]],
    capacity: Callable[[str], float],
    window_s: float,
    gamma: float,
    apply_from: Callable[[str], int],
) -> PlanState:
    """Messages for every group of ``plan``. ``capacity(link_id)`` gives bytes/s (0 when
    unknown); ``apply_from(group)`` the apply_from_seq of a new table version."""
    assignments: list[pb.InaAssignment] = []
    tables: list[pb.PolicyTable] = []
    members: dict[str, list[str]] = {}
    for name, g in _groups(plan):
        members[name] = list(g.gpus)
        policies: list[pb.Policy] = []
        if g.scheme == "ina":
            assert g.switch is not None
            gid, start, count = slots[name]
            a = pb.InaAssignment(
                group_id=gid,
                group_name=name,
                switch=g.switch,
                slots=pb.SlotRange(start=start, count=count),
                worker_count=len(g.gpus),
                multicast_group_id=gid,
            )
            for w, gpu in enumerate(g.gpus):
                a.members.add(worker_id=w, gpu=gpu)
            assignments.append(a)
            to_switch = {gpu: g.paths[gpu][: g.paths[gpu].index(g.switch) + 1] for gpu in g.gpus}
            policies.append(_policy(0, pb.SCHEME_INA, g.switch, to_switch))
            if len(g.gpus) > 1:
                ring = {
                    gpu: to_switch[gpu] + to_switch[g.gpus[(i + 1) % len(g.gpus)]][-2::-1]
                    for i, gpu in enumerate(g.gpus)
                }
                policies.append(_policy(1, pb.SCHEME_RING, "", ring))
        else:
            policies.append(
                _policy(0, pb.SCHEME_RING, "", {k: list(v) for k, v in g.paths.items()})
            )
        t = pb.PolicyTable(group_id=name, window_s=window_s, gamma=gamma)
        t.policies.extend(policies)
        for lid in sorted({lk for p in policies for lk in p.links}):
            t.links.add(id=lid, capacity=float(capacity(lid)))
        digest = _table_digest(t)
        t.version = store.table_version(name, digest, apply_from(name))
        t.apply_from_seq = store.table_apply_from(name)
        tables.append(t)
    return PlanState(plan_id, epoch, assignments, tables, members)


def _policy(pid: int, scheme: int, switch: str, paths: dict[str, list[str]]) -> pb.Policy:
    p = pb.Policy(id=pid, scheme=scheme, switch=switch, cost=0.0)
    links: list[str] = []
    for gpu in sorted(paths):
        p.paths[gpu].nodes.extend(paths[gpu])
        for lk in path_links(paths[gpu]):
            if lk not in links:
                links.append(lk)
    p.links.extend(sorted(links))
    return p


def node_state(
    state: PlanState,
    identity: pb.NodeIdentity,
    inventory: pb.SwitchInventory | pb.GpuInventory | None,
    utilisation: dict[str, float],
) -> NodeState:
    """What agent ``identity`` should hold under ``state``."""
    out = NodeState()
    if identity.kind == pb.NODE_KIND_SWITCH:
        ports = list(inventory.ports) if isinstance(inventory, pb.SwitchInventory) else []
        by_peer = {p.peer: p for p in ports if p.peer}
        for a in state.assignments:
            if a.switch != identity.node_id:
                continue
            m = pb.InaAssignment()
            m.CopyFrom(a)
            out.switch_groups[a.group_id] = m
        _fill_ports(out, by_peer, state)
        return out
    gpus = {g.gpu_id for g in inventory.gpus} if isinstance(inventory, pb.GpuInventory) else set()
    gpus = gpus or {identity.node_id}
    mine: set[str] = set().union(*(state.by_gpu.get(g, set()) for g in gpus))
    for name in sorted(mine):
        t = state.table_by_name[name]
        m = pb.PolicyTable()
        m.CopyFrom(t)
        for lk in m.links:
            if lk.id in utilisation:
                m.utilisation[lk.id] = utilisation[lk.id]
        out.tables[name] = m
        a = state.ina_by_name.get(name)
        if a is not None:
            out.gpu_ina[a.group_id] = a
    return out


def _fill_ports(out: NodeState, by_peer: dict[str, pb.SwitchPort], state: PlanState) -> None:
    """Port, MAC and IPv4 of each worker: the switch port whose peer is the node before
    the switch on the worker's path (the policy-0 path of the group's table)."""
    paths = {
        t.group_id: {g: list(p.nodes) for g, p in t.policies[0].paths.items()}
        for t in state.tables
        if t.policies
    }
    for a in out.switch_groups.values():
        for m in a.members:
            path = paths.get(a.group_name, {}).get(m.gpu, [])
            hop = path[-2] if len(path) >= 2 else ""
            port = by_peer.get(hop)
            if port is not None:
                m.port, m.port_known = port.port, True
                m.mac, m.ipv4 = port.peer_mac, port.peer_ipv4


def diff(
    old: NodeState | None, new: NodeState, kind: int, node_id: str
) -> tuple[pb.SwitchPolicy | pb.GpuPolicy, bool]:
    """The body of the update taking an agent from ``old`` to ``new``; ``old=None`` gives
    the full state. Returns (body, changed)."""
    if kind == pb.NODE_KIND_SWITCH:
        sp = pb.SwitchPolicy(switch=node_id)
        changed_g, removed_g = _delta(old.switch_groups if old else None, new.switch_groups)
        sp.assignments.extend(changed_g)
        sp.removed_group_ids.extend(removed_g)
        return sp, bool(changed_g or removed_g)
    gp = pb.GpuPolicy(node_id=node_id)
    changed_t, removed_t = _delta(old.tables if old else None, new.tables)
    changed_i, removed_i = _delta(old.gpu_ina if old else None, new.gpu_ina)
    gp.tables.extend(changed_t)
    gp.removed_group_ids.extend(removed_t)
    gp.ina.extend(changed_i)
    gp.removed_ina_group_ids.extend(removed_i)
    return gp, bool(changed_t or removed_t or changed_i or removed_i)


def _delta(old: dict | None, new: dict) -> tuple[list, list]:
    if old is None:
        return [new[k] for k in sorted(new)], []
    changed = [
        new[k]
        for k in sorted(new)
        if k not in old
        or old[k].SerializeToString(deterministic=True)
        != new[k].SerializeToString(deterministic=True)
    ]
    removed = sorted(k for k in old if k not in new)
    return changed, removed
