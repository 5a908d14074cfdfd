"""Turn a :class:`~controller.plan.Plan` into the per-agent policy messages (DESIGN.md §6, §9).

* INA groups (scheme ``ina``) become :class:`InaAssignment` messages for their aggregation
  switch: numeric group id (stable, from the store), slot range (from the slot pool,
  honouring the planner's range when free), worker ids (index in the group's GPU list),
  the switch port towards each worker (next hop of the worker's path, looked up in the
  switch's registered ports) and a multicast group (numbered like the group).
* Every group with an all-reduce (two GPUs or more) becomes a :class:`PolicyTable`
  (docs/policy-table.md) for the GPU agents of its members: policy 0 is the planned scheme
  with the planned paths; an INA group also gets policy 1, a ring through the same switch
  (member i -> switch -> member i+1), so the online scheduler (Eqs. 16-18) has a fallback
  when the switch's links are loaded. Initial costs b_c are 0. A group of one GPU (TP=1)
  has no all-reduce and gets no table: NCCL's defaults stand for it.
* Link capacities come from the plan's cluster graph (:func:`resolve_cluster`: the
  controller's ``--topology``, else the plan's ``topology`` resolved as ``heroserve plan
  --topology`` resolves it); a plan whose cluster the controller cannot get is refused
  (:class:`TopologyUnavailable`). Every table is checked with the scheduler's own validator
  (:func:`controller.scheduler.online.parse_table`) before it is published: a table the GPU
  agents would refuse makes the plan an error naming the group and the field.
* Each policy's Eq. 16 time model (docs/policy-table.md) comes from the cost model
  (:class:`PolicyTimer`): latency_s = t_c(0) and bandwidth = D_ref / (t_c(D_ref) - t_c(0)),
  t_c being ``CommPattern.time`` of one all-reduce over the policy's routes and D_ref the
  message the planner priced the group at, so before any traffic the policy the cost model
  prices fastest at D_ref wins (ties: the planned one). That needs the plan's model and
  workload besides the cluster; when the controller cannot resolve them (a hand-made plan)
  the tables leave both fields out and Eq. 16 uses the bottleneck capacity.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.plan import Group, Plan
from controller.scheduler.online import TableError, parse_table
from controller.slots import SlotPool
from controller.store import Store

if TYPE_CHECKING:
    import networkx as nx

    from controller.costmodel.network import CommPattern
    from controller.planner.evaluate import Evaluator

log = logging.getLogger("heroserve.controller")

DEFAULT_SLOTS_PER_GROUP = 16
# Collective sequence numbers a new table version waits before it applies, beyond the
# highest one any member reported: every member must receive the table before that.
DEFAULT_APPLY_MARGIN = 1024


class PlanError(ValueError):
    """A plan the controller cannot serve (names the group and the problem)."""


class TopologyUnavailable(PlanError):
    """The controller cannot get the cluster graph a plan names (an unknown built-in name, a
    missing or invalid file): the plan may be fine, the controller needs ``--topology``."""


def group_name(role: str, group: Group) -> str:
    """``"<role>/<instance>/<stage>"`` (docs/policy-table.md)."""
    return f"{role}/{group.instance}/{group.stage}"


def link_id(a: str, b: str) -> str:
    """``"<nodeA>|<nodeB>"`` with the two names sorted (docs/policy-table.md)."""
    return "|".join(sorted((a, b)))


def path_links(path: list[str]) -> list[str]:
    return [link_id(a, b) for a, b in zip(path, path[1:], strict=False)]


def has_allreduce(group: Group) -> bool:
    """A tensor-parallel group of one GPU (TP=1) has no all-reduce: no policy table."""
    return len(group.gpus) > 1


def resolve_cluster(plan: Plan, given: nx.Graph | None = None) -> nx.Graph:
    """The cluster graph of ``plan``: ``given`` (the controller's ``--topology``) when there is
    one, else ``plan.topology`` resolved as ``heroserve plan --topology`` resolves it (a
    built-in name or a topology file). Raises :class:`TopologyUnavailable` when it cannot."""
    if given is not None:
        if str(given.name) != plan.topology:
            log.warning(
                "plan names topology %r, serving it on --topology %r", plan.topology, given.name
            )
        return given
    from controller.errors import InputError
    from controller.topology import resolve_topology

    try:
        g = resolve_topology(plan.topology)
    except (InputError, OSError, ValueError, TypeError, KeyError) as exc:
        raise TopologyUnavailable(
            f"cannot resolve the plan's topology {plan.topology!r} ({exc}): link capacities "
            "unknown; start the controller with --topology (the built-in name or the topology "
            "file the plan was made for)"
        ) from exc
    log.info("topology %s resolved from the plan (no --topology)", plan.topology)
    return g


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


def _role_groups(plan: Plan) -> Iterable[tuple[str, str, Group]]:
    for phase in (plan.prefill, plan.decode):
        for g in phase.groups:
            yield phase.role, group_name(phase.role, g), g


def _groups(plan: Plan) -> Iterable[tuple[str, Group]]:
    for _, name, g in _role_groups(plan):
        yield name, g


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
            if not has_allreduce(g):
                raise PlanError(f"group {name}: INA with one GPU (TP=1 has no all-reduce)")
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


class PolicyTimer:
    """Eq. 16 time models of the controller's policies, from the cost model (DESIGN.md §5).

    A policy's uncontended time for one all-reduce of D bytes is ``CommPattern.time`` over
    its routes, as the planner prices it: the planned ring is the planner's own
    ``ring_pattern`` at the group's reference message; INA is the pattern of Eqs. 8-10 over
    the plan's routes to the switch (``ina_pattern``'s terms); the fallback ring through the
    switch is a ring of 2(P-1) steps, each member sending D/P bytes over its route to its
    successor. D_ref is the message the planner priced the phase at (the workload's mean
    prompt for prefill, the plan's batch for decode).
    """

    def __init__(self, ev: Evaluator, plan: Plan) -> None:
        self.ev = ev
        self.ref = {
            "prefill": ev.prefill_bytes(),
            "decode": ev.activation_bytes(max(1, plan.decode.batch_size)),
        }

    @classmethod
    def for_plan(cls, plan: Plan, cluster: nx.Graph) -> PolicyTimer | None:
        """The timer for ``plan`` on ``cluster`` (the graph :func:`resolve_cluster` gave: the
        controller resolves it once per plan, for capacities and prices alike), or None when
        the plan's model or workload cannot be had (a hand-made plan)."""
        from controller.costmodel.network import NetParams
        from controller.errors import InputError
        from controller.models import model_spec
        from controller.planner import PLANNERS, PlannerOptions, Problem
        from controller.planner.evaluate import Evaluator
        from controller.planner.heroserve import POLICY as HEROSERVE_POLICY
        from controller.workload import SLA, resolve_workload

        try:
            problem = Problem(
                cluster,
                model_spec(plan.model),
                resolve_workload(plan.workload),
                SLA(plan.sla["ttft_s"], plan.sla["tpot_s"], plan.sla.get("attainment", 0.9)),
                PlannerOptions(net=NetParams.from_plan_options(plan.options)),  # as priced
            )
        except (InputError, OSError, KeyError, ValueError) as exc:
            log.info(
                "policy tables without latency_s/bandwidth (Eq. 16 on bottleneck capacity): "
                "cannot price plan %s/%s/%s: %s",
                plan.topology,
                plan.model,
                plan.workload,
                exc,
            )
            return None
        policy = PLANNERS[plan.planner][0] if plan.planner in PLANNERS else HEROSERVE_POLICY
        return cls(Evaluator(problem, policy), plan)

    def _routes_exist(self, paths: dict[str, list[str]]) -> bool:
        g = self.ev.g
        return all(g.has_edge(u, v) for p in paths.values() for u, v in zip(p, p[1:], strict=False))

    def pattern(
        self, role: str, g: Group, scheme: int, paths: dict[str, list[str]]
    ) -> CommPattern | None:
        """The cost-model pattern of one policy of group ``g``; None when it is not priced
        (TP=1, or routes the cluster does not have)."""
        from controller.costmodel.network import CommPattern, ina_on_routes, ring_pattern

        ev, net = self.ev, self.ev.net
        if len(g.gpus) < 2 or not self._routes_exist(paths):
            return None
        if scheme == pb.SCHEME_INA:
            return ina_on_routes(paths, g.switch, net, g.gpus)
        if g.scheme == "ring":  # the planned NCCL ring: the planner's own pattern
            if any(m not in ev.g for m in g.gpus):
                return None
            return ring_pattern(ev.ring_fabric, g.gpus, self.ref[role], net)
        # the fallback ring through an INA group's switch
        n = len(g.gpus)
        flows = [(list(paths[m]), 1.0 / n) for m in g.gpus]
        return CommPattern.one_phase(
            "ring", flows, 2 * (n - 1), net.ring_step_net_s, 0.0, None, paths
        )

    def fields(
        self, role: str, g: Group, scheme: int, paths: dict[str, list[str]]
    ) -> tuple[float, float]:
        """(latency_s, bandwidth) of one policy, 0 for "absent" (the proto3 convention)."""
        pat = self.pattern(role, g, scheme, paths)
        if pat is None:
            return 0.0, 0.0
        fab = self.ev.ina_fabric if scheme == pb.SCHEME_INA else self.ev.ring_fabric
        ref = self.ref[role]
        t0 = pat.time(fab, 0.0)
        slope = pat.time(fab, ref) - t0
        bandwidth = ref / slope if ref > 0.0 and slope > 0.0 else 0.0
        if not (math.isfinite(t0) and t0 >= 0.0 and math.isfinite(bandwidth)):
            return 0.0, 0.0
        return t0, bandwidth


_SCHEME_NAMES = {pb.SCHEME_INA: "ina", pb.SCHEME_RING: "ring", pb.SCHEME_NVLS: "nvls"}


def table_json(t: pb.PolicyTable) -> dict:
    """The JSON form of docs/policy-table.md that the GPU agent validates (its ``TableJson``:
    proto3's bandwidth 0, "absent", left out)."""
    pols = []
    for p in t.policies:
        q: dict = {
            "id": p.id,
            "scheme": _SCHEME_NAMES.get(p.scheme, str(p.scheme)),
            "switch": p.switch,
            "links": list(p.links),
            "paths": {gpu: list(r.nodes) for gpu, r in sorted(p.paths.items())},
            "cost": p.cost,
            "latency_s": p.latency_s,
        }
        if p.bandwidth != 0.0:
            q["bandwidth"] = p.bandwidth
        pols.append(q)
    return {
        "group_id": t.group_id,
        "version": t.version,
        "apply_from_seq": t.apply_from_seq,
        "window_s": t.window_s,
        "gamma": t.gamma,
        "links": [{"id": lk.id, "capacity": lk.capacity} for lk in t.links],
        "policies": pols,
        "utilisation": dict(sorted(t.utilisation.items())),
    }


def check_table(t: pb.PolicyTable) -> None:
    """Raise :class:`PlanError` naming the group and the field when the online scheduler's
    validator (the one the GPU agents run) would refuse ``t``."""
    try:
        parse_table(table_json(t))
    except TableError as exc:
        raise PlanError(f"group {t.group_id}: invalid policy table: {exc}") from exc


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
    cluster: nx.Graph,
    window_s: float,
    gamma: float,
    apply_from: Callable[[str], int],
    timer: PolicyTimer | None = None,
) -> PlanState:
    """Messages for every group of ``plan`` on ``cluster`` (:func:`resolve_cluster`), whose
    links give the tables' capacities (bytes/s); ``apply_from(group)`` gives the
    apply_from_seq of a new table version; ``timer`` prices the policies for Eq. 16 (None: no
    latency_s / bandwidth). Groups of one GPU get no table. Raises :class:`PlanError` when a
    table names a link the cluster lacks or would not pass :func:`check_table`."""
    caps = {link_id(a, b): float(d["capacity"]) for a, b, d in cluster.edges(data=True)}
    assignments: list[pb.InaAssignment] = []
    tables: list[pb.PolicyTable] = []
    members: dict[str, list[str]] = {}
    for role, name, g in _role_groups(plan):
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
        if not has_allreduce(g):
            continue  # TP=1: no all-reduce, no table (docs/policy-table.md)
        members[name] = list(g.gpus)
        if g.scheme == "ina":
            assert g.switch is not None
            to_switch = {gpu: g.paths[gpu][: g.paths[gpu].index(g.switch) + 1] for gpu in g.gpus}
            policies.append(_policy(0, pb.SCHEME_INA, g.switch, to_switch))
            ring = {
                gpu: to_switch[gpu] + to_switch[g.gpus[(i + 1) % len(g.gpus)]][-2::-1]
                for i, gpu in enumerate(g.gpus)
            }
            policies.append(_policy(1, pb.SCHEME_RING, "", ring))
        else:
            policies.append(
                _policy(0, pb.SCHEME_RING, "", {k: list(v) for k, v in g.paths.items()})
            )
        if timer is not None:
            for pol in policies:
                paths = {gpu: list(r.nodes) for gpu, r in pol.paths.items()}
                pol.latency_s, pol.bandwidth = timer.fields(role, g, pol.scheme, paths)
        t = pb.PolicyTable(group_id=name, window_s=window_s, gamma=gamma)
        t.policies.extend(policies)
        for lid in sorted({lk for p in policies for lk in p.links}):
            if lid not in caps:
                raise PlanError(
                    f"group {name}: link {lid} is not in topology {cluster.name!r} "
                    "(its capacity is unknown)"
                )
            t.links.add(id=lid, capacity=caps[lid])
        digest = _table_digest(t)
        t.version = store.table_version(name, digest, apply_from(name))
        t.apply_from_seq = store.table_apply_from(name)
        check_table(t)
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
