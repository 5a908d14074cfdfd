"""Turn a :class:`~controller.plan.Plan` into the per-agent policy messages (docs/design.md §6, §9).

* Aggregation groups (:class:`AggSpec`) become :class:`InaAssignment` messages for their
  switch: a flat INA group (scheme ``ina``) is one, named like its group; a hierarchical
  group (scheme ``hier``) is one per rail, ``"<group>/rail<k>"`` for shard k, on the rail's
  switch with the rail's members; a hierarchical group also gets ``"<group>/flat"``, flat INA
  on a switch every member reaches, as the online scheduler's alternative (installed only
  when its slots fit). Each gets a numeric group id (stable, from the store), a slot range
  (from the slot pool, honouring the planner's range when free), worker ids (index in its
  member list), the switch port towards each worker (next hop of the worker's route, looked
  up in the switch's registered ports) and a multicast group (numbered like the group).
* Every group with an all-reduce (two GPUs or more) becomes a :class:`PolicyTable`
  (docs/policy-table.md) for the GPU agents of its members: policy 0 is the planned scheme
  with the planned paths; an INA group also gets policy 1, a ring through the same switch
  (member i -> switch -> member i+1); a hierarchical group gets policy 1, flat INA on the
  ``/flat`` group's switch (when installed), and then NCCL's ring, so the online scheduler
  (Eqs. 16-18) has alternatives when links are loaded. Initial costs b_c are 0. A group of
  one GPU (TP=1) has no all-reduce and gets no table: NCCL's defaults stand for it.
* Link capacities come from the plan's cluster graph (:func:`resolve_cluster`: the
  controller's ``--topology``, else the plan's ``topology`` resolved as ``heroserve plan
  --topology`` resolves it); a plan whose cluster the controller cannot get is refused
  (:class:`TopologyUnavailable`, an :class:`~controller.errors.InputError`; every other
  refusal is a plain InputError). Every table is checked with the scheduler's own validator
  (:func:`controller.scheduler.online.parse_table`) before it is published: a table the GPU
  agents would refuse makes the plan an error naming the group and the field.
* Each policy's Eq. 16 time model (docs/policy-table.md) comes from the cost model
  (:class:`PolicyTimer`): latency_s = t_c(0) and bandwidth = D_ref / (t_c(D_ref) - t_c(0)),
  t_c being ``CommPattern.time`` of one all-reduce over the policy's routes and D_ref the
  message the planner priced the group at, so before any traffic the policy the cost model
  prices fastest at D_ref wins (ties: the planned one). That needs the plan's model and
  workload besides the cluster; when the controller cannot resolve them (a hand-made plan)
  the tables leave both fields out and Eq. 16 uses the bottleneck capacity. A hier policy is
  priced on the plan's own rails (``costmodel.hier.hier_on_rails``). A table is priced whole
  or not at all: when one policy cannot be priced, every policy leaves the fields out (mixing
  priced and unpriced policies would favour whichever is unpriced at small messages).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.plan import Group, Plan, SlotRange
from controller.scheduler.online import TableError, parse_table
from controller.service.binding import LIMITS, ClusterIndex
from controller.service.slots import MAX_SLOTS, SlotError, SlotPool
from controller.service.store import GroupIdsExhausted, Store

if TYPE_CHECKING:
    import networkx as nx

    from controller.costmodel.network import CommPattern, NetParams
    from controller.planner.evaluate import Evaluator
    from controller.topology.fabric import Fabric

log = logging.getLogger("heroserve.controller")

DEFAULT_SLOTS_PER_GROUP = 16
# Collective sequence numbers a new table version waits before it applies, beyond the
# highest one any member reported: every member must receive the table before that.
DEFAULT_APPLY_MARGIN = 1024
MAX_WORKERS = 32  # the switch's bitmap of workers seen (p4/heroserve_ina.p4)
MAX_INDEX = 1 << 20  # instance and stage numbers: far above any cluster's instance count


class TopologyUnavailable(InputError):
    """The controller cannot get the cluster graph a plan names (an unknown built-in name, a
    missing or invalid file): the plan may be fine, the controller needs ``--topology``."""


def group_name(role: str, group: Group) -> str:
    """``"<role>/<instance>/<stage>"`` (docs/policy-table.md)."""
    return f"{role}/{group.instance}/{group.stage}"


def rail_name(group: str, shard: int) -> str:
    """Aggregation group of a hierarchical group's rail for shard ``shard``."""
    return f"{group}/rail{shard}"


def flat_name(group: str) -> str:
    """Aggregation group of a hierarchical group's flat-INA alternative."""
    return f"{group}/flat"


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


def _role_groups(plan: Plan) -> Iterable[tuple[str, str, Group]]:
    for phase in (plan.prefill, plan.decode):
        for g in phase.groups:
            yield phase.role, group_name(phase.role, g), g


def _groups(plan: Plan) -> Iterable[tuple[str, Group]]:
    for _, name, g in _role_groups(plan):
        yield name, g


def validate(plan: Plan) -> None:
    """Raise :class:`InputError` naming the first group the controller cannot serve. The plan
    schema (:func:`controller.inputs.plan_checks.validate_plan_dict`) has checked its shape (types,
    every GPU used once, groups matching instances, paths starting at their member, slot
    ranges); this checks what serving it needs: the scheme, INA worker counts and routes to
    the switch, node names usable in link ids, and whole rails for hierarchical groups."""
    for name, g in _groups(plan):
        if not (0 <= g.instance < MAX_INDEX and 0 <= g.stage < MAX_INDEX):
            raise InputError(f"group {name}: instance and stage must be in 0..{MAX_INDEX - 1}")
        if not g.gpus:
            raise InputError(f"group {name}: no GPUs")
        for n in g.gpus:
            _check_name(name, n)
        if g.scheme not in ("ina", "ring", "hier"):
            raise InputError(f"group {name}: unknown scheme {g.scheme!r}")
        if g.scheme == "ina":
            if not g.switch:
                raise InputError(f"group {name}: INA without an aggregation switch")
            if not has_allreduce(g):
                raise InputError(f"group {name}: INA with one GPU (TP=1 has no all-reduce)")
            _check_agg(name, g.switch, g.gpus, g.paths, g.slots)
        if g.scheme == "hier":
            _check_rails(name, g)


def _check_name(group: str, node: str) -> None:
    if not node or len(node) > LIMITS.name_chars or not node.isprintable() or "|" in node:
        raise InputError(f"group {group}: {node[:40]!r} is not a node name")


def _check_agg(
    name: str,
    switch: str,
    members: list[str],
    paths: dict[str, list[str]],
    slots: SlotRange | None,
) -> None:
    """One aggregation group: worker count, routes to the switch, slot range."""
    _check_name(name, switch)
    if len(members) > MAX_WORKERS:
        raise InputError(f"group {name}: {len(members)} workers, INA allows {MAX_WORKERS}")
    if slots is not None and not (0 < slots.count <= MAX_SLOTS and 0 <= slots.start < MAX_SLOTS):
        raise InputError(f"group {name}: slot range {slots} is outside 0..{MAX_SLOTS}")
    for gpu in members:
        path = paths.get(gpu)
        if not path or path[0] != gpu or switch not in path:
            raise InputError(f"group {name}: path of {gpu} must start at it and reach {switch}")
        for n in path:
            _check_name(name, n)


def _check_rails(name: str, g: Group) -> None:
    """A hierarchical group: one rail per shard, each GPU in exactly one rail, two or more
    members per rail (one member per server: a rail of one has nothing to aggregate)."""
    if not has_allreduce(g):
        raise InputError(f"group {name}: hierarchical INA with one GPU (TP=1 has no all-reduce)")
    if not g.rails:
        raise InputError(f"group {name}: hierarchical INA without rails")
    shards = sorted(r.shard for r in g.rails)
    if shards != list(range(len(g.rails))) or any(r.shards != len(g.rails) for r in g.rails):
        raise InputError(
            f"group {name}: rails must hold shards 0..{len(g.rails) - 1} once each, "
            f"each saying shards = {len(g.rails)}"
        )
    placed: dict[str, int] = {}
    for r in g.rails:
        if len(r.members) < 2:
            raise InputError(f"group {name}: rail {r.shard} has {len(r.members)} member(s)")
        for m in r.members:
            if m not in g.gpus:
                raise InputError(f"group {name}: rail {r.shard} member {m!r} is not in the group")
            if m in placed:
                raise InputError(f"group {name}: {m} is in rails {placed[m]} and {r.shard}")
            placed[m] = r.shard
        _check_agg(rail_name(name, r.shard), r.switch, r.members, r.paths, r.slots)
    missing = [m for m in g.gpus if m not in placed]
    if missing:
        raise InputError(f"group {name}: {missing[0]} is in no rail")


def check_cluster(plan: Plan, cluster: nx.Graph) -> None:
    """Raise :class:`InputError` when the plan does not fit ``cluster``: a GPU or switch it
    lacks, a switch that cannot aggregate, a hop that is not a link, a GPU used in a role its
    topology reserves for the other (the one plan-on-topology check of every command,
    :func:`controller.inputs.plan_checks.check_plan_on_topology`)."""
    from controller.inputs.plan_checks import check_plan_on_topology

    check_plan_on_topology(plan, cluster)


@dataclass(frozen=True)
class AggSpec:
    """One aggregation group to install on a switch: worker i is ``members[i]``."""

    name: str  # "<group>", "<group>/rail<k>" or "<group>/flat"
    table: str  # the group (policy table) it serves
    switch: str
    members: tuple[str, ...]
    paths: dict[str, list[str]]  # member -> route to the switch (results return the same way)
    slots: SlotRange | None  # the planner's range, honoured when free
    optional: bool = False  # an alternative: left out when its slots do not fit


def aggregation_groups(plan: Plan, alternatives: Alternatives | None = None) -> list[AggSpec]:
    """Every aggregation group of ``plan``: flat INA groups, the rails of hierarchical ones
    and (with ``alternatives``) their flat-INA alternative."""
    out: list[AggSpec] = []
    for role, name, g in _role_groups(plan):
        if g.scheme == "ina":
            assert g.switch is not None
            sw = g.switch
            paths = {m: g.paths[m][: g.paths[m].index(sw) + 1] for m in g.gpus}
            out.append(AggSpec(name, name, sw, tuple(g.gpus), paths, g.slots))
        elif g.scheme == "hier":
            for r in sorted(g.rails, key=lambda r: r.shard):
                paths = {m: r.paths[m][: r.paths[m].index(r.switch) + 1] for m in r.members}
                out.append(
                    AggSpec(
                        rail_name(name, r.shard), name, r.switch, tuple(r.members), paths, r.slots
                    )
                )
            flat = alternatives.flat(role, g) if alternatives is not None else None
            if flat is not None and flat.switch is not None:
                out.append(
                    AggSpec(
                        flat_name(name),
                        name,
                        flat.switch,
                        tuple(g.gpus),
                        {m: list(flat.paths[m]) for m in g.gpus},
                        None,
                        optional=True,
                    )
                )
    return out


def allocate(
    plan: Plan,
    store: Store,
    pool: SlotPool,
    default_capacity: int,
    slots_per_group: int = DEFAULT_SLOTS_PER_GROUP,
    specs: list[AggSpec] | None = None,
) -> dict[str, tuple[int, int, int]]:
    """Allocate slots for every aggregation group of ``plan`` (``specs``, default
    :func:`aggregation_groups` without alternatives) and free those of groups it dropped.

    Runs inside the caller's store transaction when there is one (all or nothing), except
    that an optional group (an alternative) whose slots do not fit is left out. Returns
    aggregation group name -> (group id, slot start, slot count).
    """
    if specs is None:
        specs = aggregation_groups(plan)
    wanted = {s.name: s for s in specs}
    live = frozenset(wanted)
    out: dict[str, tuple[int, int, int]] = {}
    with store.transaction():
        for sw in pool.switches():
            for a in pool.allocations(sw):
                spec = wanted.get(a.owner)
                if spec is None or spec.switch != sw:
                    pool.free(sw, a.owner)
        for name, spec in sorted(wanted.items(), key=lambda kv: (kv[1].optional, kv[0])):
            if pool.capacity(spec.switch) is None:
                pool.set_capacity(spec.switch, default_capacity)
            count = spec.slots.count if spec.slots else slots_per_group
            prefer = spec.slots.start if spec.slots else None
            try:
                a = pool.allocate(spec.switch, name, count, prefer_start=prefer)
            except SlotError as exc:
                if not spec.optional:
                    raise
                log.info("alternative %s left out: %s", name, exc)
                continue
            try:
                out[name] = (store.group_id(name, live), a.start, a.count)
            except GroupIdsExhausted as exc:
                raise SlotError(str(exc)) from exc
    return out


class PolicyTimer:
    """Eq. 16 time models of the controller's policies, from the cost model (docs/design.md §5).

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
        from controller.planner.reprice import evaluator_for_plan
        from controller.workload import resolve_workload

        try:
            ev = evaluator_for_plan(plan, cluster, resolve_workload(plan.workload))
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
        return cls(ev, plan)

    def _routes_exist(self, paths: dict[str, list[str]]) -> bool:
        g = self.ev.g
        return all(g.has_edge(u, v) for p in paths.values() for u, v in zip(p, p[1:], strict=False))

    def pattern(
        self, role: str, g: Group, scheme: int, paths: dict[str, list[str]]
    ) -> CommPattern | None:
        """The cost-model pattern of one policy of group ``g``; None when it is not priced
        (TP=1, routes the cluster does not have, or rails that do not fit the group)."""
        from controller.costmodel.hier import hier_on_rails
        from controller.costmodel.network import CommPattern, ina_on_routes, ring_pattern

        ev, net = self.ev, self.ev.net
        if len(g.gpus) < 2 or not self._routes_exist(paths):
            return None
        if scheme == pb.SCHEME_INA:
            # INA at the switch the routes end at: the planned one, or a hierarchical
            # group's flat alternative
            return ina_on_routes(paths, next(iter(paths.values()))[-1], net, g.gpus)
        if scheme == pb.SCHEME_HIER:  # the plan's own rails, priced as the planner prices them
            rails = [(r.switch, r.shard, r.members, r.paths) for r in g.rails]
            return hier_on_rails(ev.ina_fabric, g.gpus, rails, net)
        if g.scheme in ("ring", "hier"):  # NCCL's ring: the planner's own pattern
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
        ina = scheme in (pb.SCHEME_INA, pb.SCHEME_HIER)
        fab = self.ev.ina_fabric if ina else self.ev.ring_fabric
        ref = self.ref[role]
        t0 = pat.time(fab, 0.0)
        slope = pat.time(fab, ref) - t0
        bandwidth = ref / slope if ref > 0.0 and slope > 0.0 else 0.0
        if not (math.isfinite(t0) and t0 >= 0.0 and math.isfinite(bandwidth)):
            return 0.0, 0.0
        return t0, bandwidth


class Alternatives:
    """Routes of the policies a hierarchical group gets besides its planned one: flat INA on
    an INA-capable switch every member reaches first (the cheapest at the group's reference
    message, ties to the lowest name) and NCCL's ring, both as the cost model routes them
    (``ina_pattern``, ``ring_pattern``; the planner's fabrics and parameters when the plan can
    be priced, else the cluster with NVLink relays and default parameters)."""

    def __init__(self, cluster: nx.Graph, timer: PolicyTimer | None = None) -> None:
        self.cluster = cluster
        self.timer = timer
        self._fabrics: tuple[Fabric, Fabric, NetParams, dict[str, float]] | None = None
        self._flat: dict[tuple[str, ...], CommPattern | None] = {}
        self._ring: dict[tuple[str, ...], CommPattern] = {}

    def _setup(self) -> tuple[Fabric, Fabric, NetParams, dict[str, float]]:
        """The fabrics, built on first use: only hierarchical groups need them."""
        if self._fabrics is None:
            from controller.costmodel.network import NetParams
            from controller.topology.fabric import Fabric

            ev = getattr(self.timer, "ev", None)
            if ev is not None and ev.g is self.cluster:
                ref = dict(self.timer.ref)  # type: ignore[union-attr]
                self._fabrics = (ev.ina_fabric, ev.ring_fabric, ev.net, ref)
            else:
                fab = Fabric(self.cluster)
                ref = {"prefill": float(1 << 20), "decode": float(1 << 20)}
                self._fabrics = (fab, fab, NetParams(), ref)
        return self._fabrics

    @property
    def ina_fabric(self) -> Fabric:
        return self._setup()[0]

    @property
    def ring_fabric(self) -> Fabric:
        return self._setup()[1]

    @property
    def net(self) -> NetParams:
        return self._setup()[2]

    @property
    def ref(self) -> dict[str, float]:
        return self._setup()[3]

    def flat(self, role: str, g: Group) -> CommPattern | None:
        from controller.costmodel.network import ina_pattern

        key = tuple(g.gpus)
        if key not in self._flat:
            fab = self.ina_fabric
            reach = [{e[-1] for e in fab.exits(m)} for m in g.gpus]
            common = sorted(s for s in set.intersection(*reach) if fab.g.nodes[s].get("ina", False))
            best: CommPattern | None = None
            best_t = math.inf
            for s in common:
                pat = ina_pattern(fab, g.gpus, s, self.ref[role], self.net)
                t = pat.time(fab, self.ref[role]) if pat is not None else math.inf
                if pat is not None and t < best_t:
                    best, best_t = pat, t
            self._flat[key] = best
        return self._flat[key]

    def ring(self, role: str, g: Group) -> CommPattern:
        from controller.costmodel.network import ring_pattern

        key = tuple(g.gpus)
        if key not in self._ring:
            self._ring[key] = ring_pattern(self.ring_fabric, g.gpus, self.ref[role], self.net)
        return self._ring[key]


_SCHEME_NAMES = {
    pb.SCHEME_INA: "ina",
    pb.SCHEME_RING: "ring",
    pb.SCHEME_NVLS: "nvls",
    pb.SCHEME_HIER: "hier",
}


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
        if p.rails:
            q["rails"] = [{"shard": r.shard, "switch": r.switch} for r in p.rails]
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
    """Raise :class:`InputError` naming the group and the field when the online scheduler's
    validator (the one the GPU agents run) would refuse ``t``."""
    try:
        parse_table(table_json(t))
    except TableError as exc:
        raise InputError(f"group {t.group_id}: invalid policy table: {exc}") from exc


# Digests of table contents that passed check_table: the validator is a pure function of
# the content (version and apply_from_seq come from the store and are in range), so a table
# the previous plan already had is not validated again. Bounded: cleared when full.
_VALIDATED: set[str] = set()
_VALIDATED_MAX = 1 << 16


def _check_once(t: pb.PolicyTable, digest: str) -> None:
    if digest in _VALIDATED:
        return
    check_table(t)
    if len(_VALIDATED) >= _VALIDATED_MAX:
        _VALIDATED.clear()
    _VALIDATED.add(digest)


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
    specs: list[AggSpec] | None = None,
    alternatives: Alternatives | None = None,
    index: ClusterIndex | None = None,
) -> PlanState:
    """Messages for every group of ``plan`` on ``cluster`` (:func:`resolve_cluster`), whose
    links give the tables' capacities (bytes/s); ``slots`` from :func:`allocate` for ``specs``
    (default :func:`aggregation_groups`); ``apply_from(group)`` gives the apply_from_seq of a
    new table version; ``timer`` prices the policies for Eq. 16 (None: no latency_s /
    bandwidth); ``alternatives`` routes a hierarchical group's other policies (default: from
    ``cluster`` and ``timer``). Groups of one GPU get no table. Raises :class:`InputError` when
    a table names a link the cluster lacks or would not pass :func:`check_table`."""
    if specs is None:
        specs = aggregation_groups(plan)
    caps = {link_id(a, b): float(d["capacity"]) for a, b, d in cluster.edges(data=True)}
    assignments: list[pb.InaAssignment] = []
    agg_paths: dict[str, dict[str, list[str]]] = {}
    installed: dict[str, AggSpec] = {}
    for spec in specs:
        if spec.name not in slots:
            continue  # an alternative whose slots did not fit
        gid, start, count = slots[spec.name]
        a = pb.InaAssignment(
            group_id=gid,
            group_name=spec.name,
            switch=spec.switch,
            slots=pb.SlotRange(start=start, count=count),
            worker_count=len(spec.members),
            multicast_group_id=gid,
        )
        for w, gpu in enumerate(spec.members):
            a.members.add(worker_id=w, gpu=gpu)
        assignments.append(a)
        agg_paths[spec.name] = spec.paths
        installed[spec.name] = spec
    tables: list[pb.PolicyTable] = []
    members: dict[str, list[str]] = {}
    for role, name, g in _role_groups(plan):
        if not has_allreduce(g):
            continue  # TP=1: no all-reduce, no table (docs/policy-table.md)
        members[name] = list(g.gpus)
        policies: list[pb.Policy] = []
        if g.scheme == "ina":
            assert g.switch is not None
            to_switch = installed[name].paths
            policies.append(_policy(0, pb.SCHEME_INA, g.switch, to_switch))
            ring = {
                gpu: to_switch[gpu] + to_switch[g.gpus[(i + 1) % len(g.gpus)]][-2::-1]
                for i, gpu in enumerate(g.gpus)
            }
            policies.append(_policy(1, pb.SCHEME_RING, "", ring))
        elif g.scheme == "hier":
            if alternatives is None:
                alternatives = Alternatives(cluster, timer)
            policies.append(_hier_policy(name, g, alternatives))
            flat = installed.get(flat_name(name))
            if flat is not None:
                policies.append(_policy(len(policies), pb.SCHEME_INA, flat.switch, flat.paths))
            ring_paths = {m: list(r) for m, r in alternatives.ring(role, g).paths.items()}
            policies.append(_policy(len(policies), pb.SCHEME_RING, "", ring_paths))
        else:
            policies.append(
                _policy(0, pb.SCHEME_RING, "", {k: list(v) for k, v in g.paths.items()})
            )
        if timer is not None:
            _price(timer, role, g, policies)
        t = pb.PolicyTable(group_id=name, window_s=window_s, gamma=gamma)
        t.policies.extend(policies)
        for lid in sorted({lk for p in policies for lk in p.links}):
            if lid not in caps:
                raise InputError(
                    f"group {name}: link {lid} is not in topology {cluster.name!r} "
                    "(its capacity is unknown)"
                )
            t.links.add(id=lid, capacity=caps[lid])
        digest = _table_digest(t)
        t.version = store.table_version(name, digest, apply_from(name))
        t.apply_from_seq = store.table_apply_from(name)
        _check_once(t, digest)
        tables.append(t)
    return PlanState(
        plan_id,
        epoch,
        assignments,
        tables,
        members,
        agg_paths=agg_paths,
        cluster=index if index is not None else ClusterIndex.of(cluster),
    )


def _price(timer: PolicyTimer, role: str, g: Group, policies: list[pb.Policy]) -> None:
    """Eq. 16's time model on every policy, or on none: a table mixing priced and unpriced
    policies would favour the unpriced ones at small messages (no latency term)."""
    fields = [
        timer.fields(role, g, pol.scheme, {gpu: list(r.nodes) for gpu, r in pol.paths.items()})
        for pol in policies
    ]
    if any(f == (0.0, 0.0) for f in fields):
        fields = [(0.0, 0.0)] * len(fields)
    for pol, (lat, bw) in zip(policies, fields, strict=True):
        pol.latency_s, pol.bandwidth = lat, bw


def _hier_policy(name: str, g: Group, alt: Alternatives) -> pb.Policy:
    """Policy 0 of a hierarchical group: each member's route to its rail's switch, and the
    NVLink links of the reduce-scatter and all-gather inside each server (consecutive
    members of a server in ring order, over NVLink, as NCCL's intra-node ring runs)."""
    from controller.costmodel.network import ring_order

    paths: dict[str, list[str]] = {}
    for r in g.rails:
        for m in r.members:
            paths[m] = r.paths[m][: r.paths[m].index(r.switch) + 1]
    pol = _policy(0, pb.SCHEME_HIER, "", paths)
    fab = alt.ring_fabric
    order = ring_order(fab, g.gpus)
    by_server: dict[str, list[str]] = {}
    for m in order:
        by_server.setdefault(str(fab.g.nodes[m].get("server") or m), []).append(m)
    extra: list[str] = []
    for gpus in by_server.values():
        for u, v in zip(gpus, gpus[1:] + gpus[:1], strict=False):
            route = fab.nvlink_path(u, v) if u != v else None
            if route is None and u != v:
                raise InputError(f"group {name}: {u} and {v} share a server but no NVLink path")
            extra.extend(path_links(route or []))
    links = sorted(set(pol.links) | set(extra))
    del pol.links[:]
    pol.links.extend(links)
    for r in sorted(g.rails, key=lambda r: r.shard):
        pol.rails.add(shard=r.shard, switch=r.switch)
    return pol


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
    else:  # a state built without a cluster index (tests of build alone)
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
