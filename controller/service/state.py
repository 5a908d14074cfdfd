"""What every agent should hold under a plan, and the updates that take it there
(docs/design.md §9, docs/control-plane.md).

Holds:

* :func:`derive`: applying a plan, as one pipeline of stages that each run once and hand
  their result to the next: admission (:mod:`controller.service.admission`: the plan's
  cluster, the plan checked on it) -> groups and slots (:mod:`controller.service.groups`)
  -> pricing (:mod:`controller.service.pricing`: each policy's Eq. 16 time model) -> tables
  (:mod:`controller.service.tables`) -> the :class:`PlanState` here;
* :class:`PlanState`: everything derived from one plan at one epoch, indexed for the
  agents' streams; :class:`NodeState`: what one agent should hold;
* :func:`node_state`: an agent's share of a plan: a switch its aggregation groups (with the
  switch port towards each worker, the next hop of the worker's route looked up in the
  switch's registered ports); a GPU agent the tables and aggregation groups of the GPUs the
  plan's cluster gives it;
* :func:`diff`: the update taking an agent from one :class:`NodeState` to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.inputs.plan_checks import check_plan_on_topology
from controller.plan import Plan
from controller.service.admission import resolve_cluster
from controller.service.binding import ClusterIndex
from controller.service.groups import SessionSource, aggregation_groups, allocate, install
from controller.service.pricing import Alternatives, PolicyTimer
from controller.service.slots import SlotPool
from controller.service.store import Store
from controller.service.tables import build_tables

if TYPE_CHECKING:
    import networkx as nx


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
    assignments: list[pb.InaAssignment]  # every aggregation group, all switches
    tables: list[pb.PolicyTable]  # every group with an all-reduce
    members: dict[str, list[str]]  # table (group) name -> GPU ids
    agg_paths: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # agg name -> routes
    cluster: ClusterIndex | None = None  # who may speak for what (controller.service.binding)
    by_gpu: dict[str, set[str]] = field(default_factory=dict)  # GPU id -> table names
    ina_by_gpu: dict[str, set[str]] = field(default_factory=dict)  # GPU id -> agg names
    table_by_name: dict[str, pb.PolicyTable] = field(default_factory=dict)
    ina_by_name: dict[str, pb.InaAssignment] = field(default_factory=dict)
    policy_ids: dict[str, frozenset[int]] = field(default_factory=dict)  # table -> policy ids

    def __post_init__(self) -> None:
        # Index once per plan: every agent's stream looks its groups up here.
        self.table_by_name = {t.group_id: t for t in self.tables}
        self.ina_by_name = {a.group_name: a for a in self.assignments}
        self.policy_ids = {t.group_id: frozenset(p.id for p in t.policies) for t in self.tables}
        for name, gpus in self.members.items():
            for g in gpus:
                self.by_gpu.setdefault(g, set()).add(name)
        for a in self.assignments:
            for m in a.members:
                self.ina_by_gpu.setdefault(m.gpu, set()).add(a.group_name)


def derive(
    plan: Plan,
    plan_id: str,
    epoch: int,
    store: Store,
    pool: SlotPool,
    topology: nx.Graph | None,
    apply_from: Callable[[str, int], int],
    *,
    default_slots: int,
    slots_per_group: int,
    window_s: float,
    gamma: float,
    index_of: Callable[[nx.Graph], ClusterIndex] = ClusterIndex.of,
) -> PlanState:
    """The state of ``plan`` (which :func:`controller.service.admission.validate` passed) at
    ``epoch``, on ``topology`` (the controller's ``--topology``; None: the plan's own,
    resolved); slots and group ids are allocated in ``pool`` / ``store`` (inside the caller's
    transaction: all or nothing), ``default_slots`` being the capacity of a switch that has
    not registered and ``slots_per_group`` the range of a group whose plan gives none.
    ``apply_from(group, quorum)`` gives the apply_from_seq of a new table version;
    ``window_s`` (T_u) and ``gamma`` (Eq. 18) go into every table; ``index_of`` indexes the
    cluster's names for the binding checks. Raises
    :class:`~controller.service.admission.TopologyUnavailable`,
    :class:`~controller.errors.InputError` or :class:`~controller.service.slots.SlotError`.
    """
    # Admission. One resolved cluster per plan: the tables' link capacities, the cost
    # model's prices (latency_s, bandwidth) and the agents' bindings all come from it.
    cluster = resolve_cluster(plan, topology)
    index = index_of(cluster)
    check_plan_on_topology(plan, cluster)
    # The cost model of the plan on that cluster: it routes a hierarchical group's flat-INA
    # alternative (a group to install) and prices every table's policies.
    timer = PolicyTimer.for_plan(plan, cluster)
    alternatives = Alternatives(cluster, timer)
    # Groups and slots.
    specs = aggregation_groups(plan, alternatives)
    slots = allocate(specs, store, pool, default_slots, slots_per_group)
    installed = install(specs, slots, SessionSource(epoch, store))
    # Tables, priced.
    tables, members = build_tables(
        plan,
        installed.specs,
        cluster,
        timer,
        alternatives,
        window_s,
        gamma,
        store,
        apply_from,
    )
    return PlanState(
        plan_id,
        epoch,
        installed.assignments,
        tables,
        members,
        agg_paths={name: spec.paths for name, spec in installed.specs.items()},
        cluster=index,
    )


def node_state(
    state: PlanState,
    identity: pb.NodeIdentity,
    inventory: pb.SwitchInventory | pb.GpuInventory | None,
    utilisation: dict[str, float],
) -> NodeState:
    """What agent ``identity`` should hold under ``state``: a switch its aggregation groups;
    a GPU agent the tables and aggregation groups of the GPUs the plan's cluster gives it
    (:meth:`ClusterIndex.agent_gpus`), never of GPUs it merely claims."""
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
    claimed = [g.gpu_id for g in inventory.gpus] if isinstance(inventory, pb.GpuInventory) else []
    if state.cluster is not None:
        gpus = state.cluster.agent_gpus(identity.node_id, claimed)
    else:  # a state built without a cluster index (tests of a state alone)
        gpus = frozenset(claimed) or frozenset((identity.node_id,))
    mine: set[str] = set().union(*(state.by_gpu.get(g, set()) for g in gpus))
    for name in sorted(mine):
        t = state.table_by_name[name]
        m = pb.PolicyTable()
        m.CopyFrom(t)
        for lk in m.links:
            if lk.id in utilisation:
                m.utilisation[lk.id] = utilisation[lk.id]
        out.tables[name] = m
    aggs: set[str] = set().union(*(state.ina_by_gpu.get(g, set()) for g in gpus))
    for name in aggs:
        a = state.ina_by_name[name]
        out.gpu_ina[a.group_id] = a
    return out


def _fill_ports(out: NodeState, by_peer: dict[str, pb.SwitchPort], state: PlanState) -> None:
    """Port, MAC and IPv4 of each worker: the switch port whose peer is the node before
    the switch on the worker's route to it."""
    for a in out.switch_groups.values():
        routes = state.agg_paths.get(a.group_name, {})
        for m in a.members:
            path = routes.get(m.gpu, [])
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
