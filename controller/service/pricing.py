"""The cost model's view of a plan's policies: Eq. 16's time model and the alternatives'
routes (docs/design.md §5, docs/policy-table.md).

Holds:

* :class:`PolicyTimer`: each policy's Eq. 16 time model, latency_s = t_c(0) and bandwidth =
  D_ref / (t_c(D_ref) - t_c(0)), t_c being ``CommPattern.time`` of one all-reduce over the
  policy's routes and D_ref the message the planner priced the group at, so before any
  traffic the policy the cost model prices fastest at D_ref wins (ties: the planned one).
  That needs the plan's model and workload besides the cluster; when the controller cannot
  resolve them (a hand-made plan, or one whose workload was a trace file: a plan's workload
  names a generator, never a file the controller would open) there is no timer and the
  tables leave both fields out (Eq. 16 then uses the bottleneck capacity). A hier policy
  is priced on the plan's own rails (``costmodel.hier.hier_on_rails``);
* :func:`price`: a table's policies priced whole or not at all: when one policy cannot be
  priced, every policy leaves the fields out (mixing priced and unpriced policies would
  favour whichever is unpriced at small messages);
* :class:`Alternatives`: the routes of a hierarchical group's other policies (flat INA on a
  switch every member reaches, NCCL's ring), as the cost model routes them.

:func:`controller.service.state.derive` builds the timer and the alternatives once per plan,
on the cluster the admission stage resolved; the groups stage installs the flat
alternative's aggregation group and the tables stage prices each table's policies.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.plan import Group, Plan

if TYPE_CHECKING:
    import networkx as nx

    from controller.costmodel.netparams import NetParams
    from controller.costmodel.network import CommPattern
    from controller.planner.evaluate import Evaluator
    from controller.topology.fabric import Fabric

log = logging.getLogger("heroserve.controller")


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
        from controller.planner.reprice import decided_bytes

        self.ref = {role: decided_bytes(ev, plan, role) for role in ("prefill", "decode")}

    @classmethod
    def for_plan(cls, plan: Plan, cluster: nx.Graph) -> PolicyTimer | None:
        """The timer for ``plan`` on ``cluster`` (the graph
        :func:`~controller.service.admission.resolve_cluster` gave: the controller resolves it
        once per plan, for capacities and prices alike), or None when the plan's model or
        workload cannot be had (a hand-made plan)."""
        from controller.errors import InputError
        from controller.planner.reprice import evaluator_for_plan
        from controller.workload import plan_workload

        try:  # the plan's workload names a generator: a plan never opens a file
            ev = evaluator_for_plan(plan, cluster, plan_workload(plan.workload))
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
        from controller.costmodel.ina import ina_on_routes
        from controller.costmodel.network import CommPattern
        from controller.costmodel.ring import ring_pattern

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


def price(timer: PolicyTimer, role: str, g: Group, policies: list[pb.Policy]) -> None:
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
            from controller.costmodel.netparams import NetParams
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
        """Flat INA for ``g``'s members: the cost model's cheapest pattern on a switch they
        all reach, or None when they reach none."""
        from controller.costmodel.ina import ina_pattern

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
        """NCCL's ring over ``g``'s members, as the cost model orders and routes it."""
        from controller.costmodel.ring import ring_pattern

        key = tuple(g.gpus)
        if key not in self._ring:
            self._ring[key] = ring_pattern(self.ring_fabric, g.gpus, self.ref[role], self.net)
        return self._ring[key]
