"""A plan's groups as the controller names and installs them (docs/design.md §6, §9).

Holds:

* group naming (docs/policy-table.md): :func:`group_name` ``"<role>/<instance>/<stage>"``
  for a tensor-parallel group (its policy table), :func:`rail_name` ``"<group>/rail<k>"``
  and :func:`flat_name` ``"<group>/flat"`` for the aggregation groups of a hierarchical one;
  :func:`role_groups` walks a plan's groups with their names; :func:`has_allreduce` says
  which groups get a table at all;
* the aggregation groups to install (:class:`AggSpec`, :func:`aggregation_groups`): a flat
  INA group is one, on its switch; a hierarchical group is one per rail, on the rail's switch
  with the rail's members, plus ``"<group>/flat"`` (flat INA on a switch every member
  reaches, routed by :class:`~controller.service.pricing.Alternatives`) as the online
  scheduler's alternative, installed only when its slots fit;
* slot allocation (:func:`allocate`): a numeric group id (stable, from the store) and a slot
  range (from :class:`~controller.service.slots.SlotPool`, honouring the planner's range
  when free) for each, in one store transaction;
* the switch messages (:func:`install`): one :class:`InaAssignment` per allocated group,
  worker ids by index in its member list and a multicast group numbered like the group;
  its session and first generation (:class:`SessionSource`) and lane format, which the GPU
  agents write into their CollNet plugin's group configuration.

The second stage of applying a plan (:func:`controller.service.state.derive`): it takes the
plan the admission stage passed and hands the installed groups to the tables stage.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agents.ina.packet import DEFAULT_LANE_FORMAT
from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.plan import Group, Plan, SlotRange
from controller.service.slots import SlotError, SlotPool
from controller.service.store import GroupIdsExhausted, Store

if TYPE_CHECKING:
    from controller.service.pricing import Alternatives

log = logging.getLogger("heroserve.controller")

DEFAULT_SLOTS_PER_GROUP = 16


def group_name(role: str, group: Group) -> str:
    """``"<role>/<instance>/<stage>"`` (docs/policy-table.md)."""
    return f"{role}/{group.instance}/{group.stage}"


def rail_name(group: str, shard: int) -> str:
    """Aggregation group of a hierarchical group's rail for shard ``shard``."""
    return f"{group}/rail{shard}"


def flat_name(group: str) -> str:
    """Aggregation group of a hierarchical group's flat-INA alternative."""
    return f"{group}/flat"


def has_allreduce(group: Group) -> bool:
    """A tensor-parallel group of one GPU (TP=1) has no all-reduce: no policy table."""
    return len(group.gpus) > 1


def role_groups(plan: Plan) -> Iterable[tuple[str, str, Group]]:
    """(role, name, group) of every group of ``plan``, prefill first."""
    for phase in (plan.prefill, plan.decode):
        for g in phase.groups:
            yield phase.role, group_name(phase.role, g), g


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
    # the lane format the plan was priced with (its options' ina_lanes; the admission checked
    # that the dataplane runs it): what the members' CollNet plugin packs
    lanes: str = DEFAULT_LANE_FORMAT


def aggregation_groups(plan: Plan, alternatives: Alternatives | None = None) -> list[AggSpec]:
    """Every aggregation group of ``plan``: flat INA groups, the rails of hierarchical ones
    and (with ``alternatives``) their flat-INA alternative."""
    out: list[AggSpec] = []
    lanes = str(plan.options.get("ina_lanes", DEFAULT_LANE_FORMAT))
    for role, name, g in role_groups(plan):
        if g.scheme == "ina":
            assert g.switch is not None
            sw = g.switch
            paths = {m: g.paths[m][: g.paths[m].index(sw) + 1] for m in g.gpus}
            out.append(AggSpec(name, name, sw, tuple(g.gpus), paths, g.slots, lanes=lanes))
        elif g.scheme == "hier":
            for r in sorted(g.rails, key=lambda r: r.shard):
                paths = {m: r.paths[m][: r.paths[m].index(r.switch) + 1] for m in r.members}
                out.append(
                    AggSpec(
                        rail_name(name, r.shard),
                        name,
                        r.switch,
                        tuple(r.members),
                        paths,
                        r.slots,
                        lanes=lanes,
                    )  # fmt: skip
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
                        lanes=lanes,
                    )
                )
    return out


def allocate(
    specs: list[AggSpec],
    store: Store,
    pool: SlotPool,
    default_capacity: int,
    slots_per_group: int = DEFAULT_SLOTS_PER_GROUP,
) -> dict[str, tuple[int, int, int]]:
    """Allocate slots for every aggregation group in ``specs`` (a plan's
    :func:`aggregation_groups`) and free those of groups it dropped.

    Runs inside the caller's store transaction when there is one (all or nothing), except
    that an optional group (an alternative) whose slots do not fit is left out. Returns
    aggregation group name -> (group id, slot start, slot count).
    """
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


@dataclass
class Installed:
    """The aggregation groups whose slots were allocated, as the switches receive them."""

    assignments: list[pb.InaAssignment]  # every aggregation group, all switches
    specs: dict[str, AggSpec]  # aggregation group name -> its spec


def install(
    specs: list[AggSpec],
    slots: dict[str, tuple[int, int, int]],
    session: SessionSource | None = None,
) -> Installed:
    """The :class:`InaAssignment` of every group of ``specs`` that :func:`allocate` gave
    ``slots`` (an alternative whose slots did not fit has none and is left out), each with
    its session from ``session`` (none: session 0, as before sessions were handed out)."""
    assignments: list[pb.InaAssignment] = []
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
            lane_format=spec.lanes,
        )
        for w, gpu in enumerate(spec.members):
            a.members.add(worker_id=w, gpu=gpu)
        if session is not None:
            session.assign(a)
        assignments.append(a)
        installed[spec.name] = spec
    return Installed(assignments, installed)


@dataclass
class SessionSource:
    """Sessions of the aggregation groups (docs/dataplane.md, "Known limits", Sessions).

    Every member of a group must use the same session and first generation, and a group
    installed again needs a session newer (RFC 1982) than its last one, or the switch takes
    its packets as late. A group's session is the epoch at which its content (id, switch,
    slots, members) was first installed: unchanged content keeps it (running jobs and new
    communicators agree), changed content gets the current ``epoch`` (epochs only grow, and
    are global, so a group id reclaimed by another group also gets a newer session). The
    store keeps it, in the counter it keeps for table versions (a row ``ina-session:<name>``
    whose digest is the content's and whose apply_from_seq is that epoch), so a restarted
    controller hands out the same. The first generation is a hash of the store's
    generation (a random name of the database), the session and the group's name: the
    same after a restart, unknown off the control plane (docs/dataplane.md, forgery)."""

    epoch: int
    store: Store

    def assign(self, a: pb.InaAssignment) -> None:
        key = f"ina-session:{a.group_name}"
        digest = hashlib.sha256(_content(a)).hexdigest()
        self.store.table_version(key, digest, self.epoch)
        a.session = self.store.table_apply_from(key) % (1 << 32)
        seed = f"{self.store.generation}/{a.session}/{a.group_name}".encode()
        a.first_generation = int.from_bytes(hashlib.blake2b(seed, digest_size=4).digest(), "big")


def _content(a: pb.InaAssignment) -> bytes:
    """What a session is bound to: the assignment without its session fields."""
    m = pb.InaAssignment()
    m.CopyFrom(a)
    m.ClearField("session")
    m.ClearField("first_generation")
    return m.SerializeToString(deterministic=True)
