"""Whether the controller can serve a plan, and on which cluster (docs/design.md §9).

Holds:

* :class:`TopologyUnavailable`: the plan names a cluster that is no built-in
  (FAILED_PRECONDITION: the plan may be fine, the controller needs ``--topology``); every
  other refusal, a plan whose topology names a file among them, is a plain
  :class:`~controller.errors.InputError` (INVALID_ARGUMENT);
* :func:`validate`: what serving a plan needs beyond the plan schema;
* :func:`resolve_cluster`: the cluster graph a plan is served on.

The first stage of applying a plan (:func:`controller.service.state.derive`). A plan
reaches it through :func:`controller.service.planinput.parse_plan`, so
:func:`controller.inputs.plan_checks.validate_plan_dict` has checked its shape (types and
ranges, every GPU used once, groups matching instances, INA switches and hier rails
present, paths starting at their member and reaching their switch, rail members in the
group, slot ranges inside the 16-bit slot field); the plan against its cluster is
:func:`controller.inputs.plan_checks.check_plan_on_topology`'s. Neither rule set is
repeated here: :func:`validate` checks only what the data plane and the policy tables add.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agents.ina.packet import MAX_WORKERS
from controller.errors import InputError
from controller.inputs.plan_checks import check_dataplane_lanes
from controller.plan import Group, Plan
from controller.service.binding import LIMITS
from controller.service.groups import has_allreduce, rail_name, role_groups

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger("heroserve.controller")


class TopologyUnavailable(InputError):
    """The plan's topology is no built-in and the controller has no ``--topology``: the plan
    may be fine, the controller needs ``--topology``."""


def validate(plan: Plan) -> None:
    """Raise :class:`InputError` naming the first group the controller cannot serve: INA
    with one GPU, more workers than the switch tracks, node names unusable in link ids
    (``|``, unprintable), and hierarchical groups whose rails do not cover it whole; and a
    plan priced for INA lanes the switches' program does not aggregate."""
    check_dataplane_lanes(plan)
    for _, name, g in role_groups(plan):
        for n in g.gpus:
            _check_name(name, n)
        if g.scheme == "ina":
            assert g.switch is not None  # the schema's rule for INA groups
            if not has_allreduce(g):
                raise InputError(f"group {name}: INA with one GPU (TP=1 has no all-reduce)")
            _check_agg(name, g.switch, g.gpus, g.paths)
        if g.scheme == "hier":
            _check_rails(name, g)


def _check_name(group: str, node: str) -> None:
    # '|' joins the two ends of a link id (docs/policy-table.md)
    if not node or len(node) > LIMITS.name_chars or not node.isprintable() or "|" in node:
        raise InputError(f"group {group}: {node[:40]!r} is not a node name")


def _check_agg(name: str, switch: str, members: list[str], paths: dict[str, list[str]]) -> None:
    """One aggregation group: its switch and route node names, and its worker count."""
    _check_name(name, switch)
    if len(members) > MAX_WORKERS:
        raise InputError(f"group {name}: {len(members)} workers, INA allows {MAX_WORKERS}")
    for gpu in members:
        for n in paths.get(gpu, ()):
            _check_name(name, n)


def _check_rails(name: str, g: Group) -> None:
    """A hierarchical group: one rail per shard, each GPU in exactly one rail, two or more
    members per rail (one member per server: a rail of one has nothing to aggregate)."""
    if not has_allreduce(g):
        raise InputError(f"group {name}: hierarchical INA with one GPU (TP=1 has no all-reduce)")
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
            if m in placed:
                raise InputError(f"group {name}: {m} is in rails {placed[m]} and {r.shard}")
            placed[m] = r.shard
        _check_agg(rail_name(name, r.shard), r.switch, r.members, r.paths)
    missing = [m for m in g.gpus if m not in placed]
    if missing:
        raise InputError(f"group {name}: {missing[0]} is in no rail")


def resolve_cluster(plan: Plan, given: nx.Graph | None = None) -> nx.Graph:
    """The cluster graph of ``plan``: ``given`` (the controller's ``--topology``) when there is
    one, else the built-in that ``plan.topology`` names. A plan never makes the controller
    open a file (:func:`controller.topology.plan_topology`): a plan whose topology names a
    path is refused (InputError, INVALID_ARGUMENT), one naming another cluster raises
    :class:`TopologyUnavailable`. Neither message quotes the plan's field."""
    if given is not None:
        if str(given.name) != plan.topology:
            log.warning(
                "plan names topology %r, serving it on --topology %r", plan.topology, given.name
            )
        return given
    from controller.topology import NotBuiltin, plan_topology

    try:
        g = plan_topology(plan.topology)
    except NotBuiltin as exc:
        raise TopologyUnavailable(str(exc)) from None
    log.info("topology %s resolved from the plan (no --topology)", plan.topology)
    return g
