"""All-reduce pricing of tensor-parallel groups (Alg. 2 getlatency; Eqs. 7-11).

- ``GroupEval``: a group's schemes at a reference message size: the ring, flat INA at each
  switch worth routing to, hierarchical INA.
- ``GroupTimes``: a group's all-reduce time as a function of the message size.
- ``AllReducePricer``: the evaluator's pricer that finds a group's INA candidate switches,
  routes and prices its schemes (with a lower bound that skips switches that cannot win),
  and times an all-reduce. It owns the state that changes those times: the groups forced
  onto the ring (``force_ring``, when the plan is assembled) and, for a plan already made,
  its groups with the schemes it chose (``price_as_planned``: ``planned`` gives the pattern of
  such a group's scheme and ``allreduce_time`` prices that scheme at every size). Its caches
  (each bound where it is declared): schemes per group, times per group shape, a GPU's
  cheapest route alone to a switch per size (``ina_bound``), its exits' route sums, and each
  group's own phases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.costmodel.hier import hier_on_rails, hier_pattern
from controller.costmodel.ina import ina_from_one_way, ina_on_routes, ina_pattern
from controller.costmodel.network import CommPattern, CompiledPhase, written_time
from controller.costmodel.ring import ring_pattern
from controller.errors import InputError
from controller.plan import Group
from controller.planner.context import PricingContext
from controller.topology.fabric import Fabric
from controller.topology.graph import SWITCH


@dataclass
class GroupEval:
    """A tensor-parallel group priced at a reference message size (Alg. 2 getlatency): the
    ring, flat INA at each switch worth routing to, and hierarchical INA where the policy and
    the group's shape allow it."""

    members: tuple[str, ...]
    ring: CommPattern
    ina: list[CommPattern]  # allowed flat-INA options, cheapest first at the reference size
    ina_note: str  # why INA is absent, when it is
    hier: CommPattern | None = None
    ina_all: list[CommPattern] | None = None  # every candidate switch (``AllReducePricer.all_ina``)

    def options(
        self, ctx: PricingContext, allow_ina: bool = True
    ) -> list[tuple[CommPattern, Fabric]]:
        """Every allowed pattern with the fabric it is priced on."""
        out = [(self.ring, ctx.ring_fabric)]
        if allow_ina:
            out += [(p, ctx.ina_fabric) for p in self.ina]
            if self.hier is not None:
                out.append((self.hier, ctx.ina_fabric))
        return out

    def time(self, ctx: PricingContext, nbytes: float, allow_ina: bool = True) -> float:
        return min(p.time(f, nbytes) for p, f in self.options(ctx, allow_ina))


@dataclass
class GroupTimes:
    """A group's all-reduce time as a function of the message size: the ring's compiled
    phases and every other allowed scheme's (``CommPattern.compiled``)."""

    ring: list[CompiledPhase]
    others: list[list[CompiledPhase]]

    def time(self, nbytes: float, allow_ina: bool = True) -> float:
        t = sum(c.time(nbytes) for c in self.ring)
        if allow_ina:
            for phases in self.others:
                t = min(t, sum(c.time(nbytes) for c in phases))
        return t


class AllReducePricer:
    """Prices the all-reduce of tensor-parallel groups on ``ctx``. Caches group evaluations,
    which is what makes perturbation and large clusters affordable."""

    def __init__(self, ctx: PricingContext) -> None:
        self.ctx = ctx
        # groups that lost INA to the aggregator-slot limit when the plan was assembled
        # (``force_ring``; only grows): they run the ring at every size
        self.forced_ring: set[tuple[str, ...]] = set()
        # a made plan's groups, each priced with the scheme the plan chose for it
        # (``price_as_planned``): members -> (group, the message it was decided at)
        self.plan_groups: dict[tuple[str, ...], tuple[Group, float]] = {}
        # one entry per group priced (its members, in order): at most the groups of one search
        self._groups: dict[tuple, GroupEval] = {}
        # one entry per group shape (``shape_signature``): at most the shapes of one search
        self._times: dict[tuple, GroupTimes] = {}
        # one entry per (GPU, candidate switch, message size): at most GPUs x the switches
        # they reach x the sizes of one search
        self._to_switch: dict[tuple[str, str, float], float | None] = {}
        # one entry per GPU: at most the cluster's GPUs
        self._exit_sums: dict[str, list[tuple[str, tuple[float, float, float]]]] = {}
        # one entry per (first-hop switch, candidate switch): at most switches squared
        self._switch_hops: dict[tuple[str, str], list[tuple[str, str]] | None] = {}
        # one entry per made plan's group: at most ``plan_groups``
        self._planned: dict[tuple[str, ...], list[CompiledPhase]] = {}
        # one entry per (group, INA allowed): at most 2 x the groups of one search
        self._own: dict[tuple[tuple[str, ...], bool], list[list[CompiledPhase]]] = {}
        # per (group, INA allowed, message bytes): the option ``own_phases`` chose there; at
        # most 2 x the groups x the messages (decode batches) of one search
        self._own_at: dict[tuple[tuple[str, ...], bool, float], list[CompiledPhase]] = {}

    def force_ring(self, members: Sequence[str]) -> None:
        """Price ``members`` on the ring alone from now on: the group lost INA to the
        aggregator-slot limit (``assemble``). ``forced_ring`` only grows."""
        self.forced_ring.add(tuple(members))

    def price_as_planned(self, gr: Group, ref: float) -> None:
        """Price the made plan's group ``gr`` with the scheme the plan chose for it, its
        routes chosen at ``ref``, the message it was decided at (``reprice``)."""
        self.plan_groups[tuple(gr.gpus)] = (gr, ref)

    def ina_candidates(self, members: Sequence[str]) -> list[str]:
        """Switches a group may aggregate on (Alg. 2 line 7): the first-hop switches its
        members' routes reach; the tier above them only when no first-hop switch is reachable
        by every member (a higher tier only adds hops otherwise). INA-capable only."""
        reach = [{e[-1] for e in self.ctx.ina_fabric.exits(m)} for m in members]
        first = set().union(*reach)
        common = set.intersection(*reach) if reach else set()
        near = set(first)
        if not common:
            for a in first:
                near.update(
                    v for v in self.ctx.g.neighbors(a) if self.ctx.g.nodes[v]["kind"] == SWITCH
                )
        return sorted(s for s in near if self.ctx.g.nodes[s].get("ina"))

    def group(self, members: Sequence[str], nbytes: float) -> GroupEval:
        """Price a group's schemes (Alg. 2 lines 25-31 with the third scheme). Routes are
        chosen once per group, at the first size asked (the phase's reference message);
        other sizes re-price the same routes (CommPattern.time).

        Flat INA is routed only at switches whose lower bound (``ina_bound``) beats the best
        scheme found so far, cheapest bound first: the route choice is the costly part, and a
        switch that cannot win at the reference size is not a candidate worth keeping."""
        key = tuple(members)
        hit = self._groups.get(key)
        if hit is not None:
            return hit
        ring = ring_pattern(self.ctx.ring_fabric, members, nbytes, self.ctx.net)
        ina: list[CommPattern] = []
        hier = None
        note = ""
        servers = {self.ctx.g.nodes[m].get("server") for m in members}
        if len(members) == 1:
            note = "TP=1: no all-reduce"
        elif self.ctx.policy.ina == "none":
            note = f"{self.ctx.policy.name} uses NCCL ring only"
        elif self.ctx.policy.ina_cross_server_only and len(servers) == 1:
            note = "group inside one server: NCCL ring over NVLink"
        else:
            best = ring.time(self.ctx.ring_fabric, nbytes)
            if self.ctx.policy.hier:
                hier = hier_pattern(self.ctx.ina_fabric, members, nbytes, self.ctx.net)
                if hier is not None:
                    best = min(best, hier.time(self.ctx.ina_fabric, nbytes))
            bounds = sorted(
                (self.ina_bound(members, s, nbytes), s) for s in self.ina_candidates(members)
            )
            for bound, s in bounds:
                if bound >= best:
                    if not ina and hier is None:
                        note = (
                            f"flat INA cannot beat {best * 1e6:.1f} us "
                            f"(at least {bound * 1e6:.1f} us at {s})"
                        )
                    break
                p = self._flat_ina(members, s, nbytes)
                if p is not None:
                    ina.append(p)
                    best = min(best, p.time(self.ctx.ina_fabric, nbytes))
            ina.sort(key=lambda p: (p.time(self.ctx.ina_fabric, nbytes), p.switch))
            if not ina and hier is None and not note:
                note = "no INA switch reachable"
        ev = GroupEval(tuple(members), ring, ina, note, hier)
        self._groups[key] = ev
        return ev

    def all_ina(self, members: Sequence[str], nbytes: float) -> list[CommPattern]:
        """Flat INA at every candidate switch, cheapest first: the alternatives the online
        scheduler may switch to under load (``group`` keeps only the switches that can win
        unloaded). Computed on demand, kept in the group's evaluation."""
        ge = self.group(members, nbytes)
        if ge.ina_all is None:
            if (
                len(members) < 2
                or self.ctx.policy.ina == "none"
                or (
                    self.ctx.policy.ina_cross_server_only
                    and len({self.ctx.g.nodes[m].get("server") for m in members}) == 1
                )
            ):
                ge.ina_all = []
            else:
                have = {p.switch: p for p in ge.ina}
                out = []
                for s in self.ina_candidates(members):
                    p = have.get(s) or self._flat_ina(members, s, nbytes)
                    if p is not None:
                        out.append(p)
                ge.ina_all = sorted(
                    out, key=lambda p: (p.time(self.ctx.ina_fabric, nbytes), p.switch)
                )
        return ge.ina_all

    def _flat_ina(self, members: Sequence[str], switch: str, nbytes: float) -> CommPattern | None:
        """Flat INA at ``switch``: with NVLink relays allowed, the Ethernet-only routes are
        tried too and the cheaper kept (the greedy route choice with more options is not
        always better), so HeroServe's options contain the homogeneous baselines'."""
        p = ina_pattern(self.ctx.ina_fabric, members, switch, nbytes, self.ctx.net)
        if self.ctx.policy.ina_relay:
            q = ina_pattern(self.ctx.eth_fabric, members, switch, nbytes, self.ctx.net)
            if q is not None and (
                p is None
                or q.time(self.ctx.ina_fabric, nbytes) < p.time(self.ctx.ina_fabric, nbytes)
            ):
                p = q
        return p

    def ina_bound(self, members: Sequence[str], switch: str, nbytes: float) -> float:
        """A lower bound on flat INA at ``switch`` from the slowest member's cheapest route
        alone (its own bytes, no sharing, one way; ``ina.ina_from_one_way``): pipelined, plus
        the aggregation and host overhead (sharing links and the way back only add time); in
        the paper's mode, Eq. 8 as written on those routes, which is exact. Inf if
        unreachable."""
        wire = nbytes * self.ctx.net.ina_bytes_ratio
        worst = 0.0
        for m in members:
            best = self._cheapest_to_switch(m, switch, wire)
            if best is None:
                return math.inf
            worst = max(worst, best)
        return ina_from_one_way(worst, self.ctx.net)

    def _cheapest_to_switch(self, gpu: str, switch: str, nbytes: float) -> float | None:
        """The cheapest route of ``gpu`` to ``switch`` alone (None if none), kept per
        (GPU, switch, size): a GPU is in a group of every candidate (TP, PP) and grouping, and
        the plan prices the deployed groups again at the same sizes."""
        key = (gpu, switch, nbytes)
        if key not in self._to_switch:
            fab = self.ctx.ina_fabric
            if fab.pipelined and nbytes >= 0:
                self._to_switch[key] = self._cheapest_summed(gpu, switch, nbytes)
            else:
                routes = fab.routes_to_switch(gpu, switch)  # the paper's mode: Eq. 10
                self._to_switch[key] = (
                    min(written_time(fab, r, nbytes) for r in routes) if routes else None
                )
        return self._to_switch[key]

    def _cheapest_summed(self, gpu: str, switch: str, nbytes: float) -> float | None:
        """``min(path_time(r) for r in routes_to_switch(gpu, switch))`` on a pipelined fabric
        without building the routes: each exit's ``Fabric.hop_sums`` (kept per GPU) carried
        on over the switch path's hops (kept per switch pair), priced by
        ``Fabric.pipelined_time``: ``path_time``'s floats."""
        fab = self.ctx.ina_fabric
        sums = self._exit_sums.get(gpu)
        if sums is None:
            sums = self._exit_sums[gpu] = [
                (e[-1], fab.hop_sums(zip(e, e[1:], strict=False))) for e in fab.exits(gpu)
            ]
        best: float | None = None
        for first, pre in sums:
            key = (first, switch)
            if key not in self._switch_hops:
                sp = fab.switch_path(first, switch)
                self._switch_hops[key] = None if sp is None else list(zip(sp, sp[1:], strict=False))
            hops = self._switch_hops[key]
            if hops is None:
                continue
            t = fab.pipelined_time(fab.hop_sums(hops, pre), nbytes)
            if best is None or t < best:
                best = t
        return best

    def group_cost(self, members: Sequence[str], nbytes: float) -> float:
        """One all-reduce of ``nbytes`` on ``members``, the best allowed scheme: what the
        grouping compares. Groups with the same ``shape_signature`` cost the same, so their
        routes are chosen once (the perturbation tries many groups that are twins)."""
        return self.times(members, nbytes).time(nbytes)

    def times(self, members: Sequence[str], nbytes: float) -> GroupTimes:
        """The all-reduce times of ``members``' schemes as functions of the message size,
        shared by every group of the same shape (``shape_signature``): a group's routes are
        chosen once per shape, at the first size asked."""
        key = self.ctx.shape(members)
        hit = self._times.get(key)
        if hit is None:
            ge = self.group(members, nbytes)
            others = [p.compiled(f) for p, f in ge.options(self.ctx)[1:]]
            if self.ctx.problem.options.free_ina and self.ina_allowed(members):
                others.append([])  # free INA: an all-reduce of no time
            hit = self._times[key] = GroupTimes(
                [c for p, f in ge.options(self.ctx, allow_ina=False) for c in p.compiled(f)], others
            )
        return hit

    def ina_allowed(self, members: Sequence[str]) -> bool:
        """Whether the policy may aggregate this group in the network at all."""
        if len(members) < 2 or self.ctx.policy.ina == "none":
            return False
        one_server = len({self.ctx.g.nodes[m].get("server") for m in members}) == 1
        return not (self.ctx.policy.ina_cross_server_only and one_server)

    def allreduce_time(self, members: Sequence[str], nbytes: float) -> float:
        """One all-reduce of ``nbytes`` on a stage's group, the best allowed scheme; the ring
        only where the group lost INA to the aggregator slots (``forced_ring``). A made
        plan's group (``plan_groups``) runs the one scheme the plan chose for it at every
        size: the plan reserved aggregator slots for that scheme alone, and the best scheme
        at a lone request's message need not be the one chosen at the plan's batch."""
        if len(members) == 1:
            return 0.0
        key = tuple(members)
        if key in self.plan_groups:
            return sum(c.time(nbytes) for c in self._planned_phases(key))
        allow = key not in self.forced_ring
        return self.times(members, nbytes).time(nbytes, allow_ina=allow)

    def own_phases(self, members: Sequence[str], nbytes: float) -> list[CompiledPhase]:
        """The compiled phases of the scheme ``members`` run at ``nbytes`` on their own
        routes (``allreduce_time`` prices twins on the first twin's): the plan's scheme for a
        made plan's group, else the fastest allowed at ``nbytes``. What the group's traffic puts
        on each link (``decode_step`` under KV load). Empty for TP = 1 or free INA."""
        key = tuple(members)
        if len(members) == 1:
            return []
        if key in self.plan_groups:
            return self._planned_phases(key)
        allow = key not in self.forced_ring
        if allow and self.ctx.problem.options.free_ina and self.ina_allowed(members):
            return []
        chosen = self._own_at.get((key, allow, nbytes))
        if chosen is not None:  # a decode instance's batch search asks each size again
            return chosen
        opts = self._own.get((key, allow))
        if opts is None:  # routed once, at the first size asked
            opts = self._own[(key, allow)] = [
                p.compiled(f) for p, f in self.group(members, nbytes).options(self.ctx, allow)
            ]
        chosen = self._own_at[(key, allow, nbytes)] = min(
            opts, key=lambda phases: sum(c.time(nbytes) for c in phases)
        )
        return chosen

    def _planned_phases(self, key: tuple[str, ...]) -> list[CompiledPhase]:
        """The compiled phases of the scheme the plan chose for group ``key``, kept."""
        hit = self._planned.get(key)
        if hit is None:
            gr, ref = self.plan_groups[key]
            pattern, fabric = self.planned(list(key), ref, gr)  # type: ignore[misc]
            hit = self._planned[key] = pattern.compiled(fabric)
        return hit

    def planned(
        self, members: list[str], ref: float, gr: Group | None
    ) -> tuple[CommPattern, Fabric] | None:
        """The cost-model pattern of the scheme a plan chose for a group, and the fabric it
        is priced on: the ring; flat INA at the plan's switch (this evaluator's routes, or
        the plan's own when it would not route there); hierarchical INA over the plan's
        rails. Routes are chosen at ``ref``, the message the plan decided at. None for
        TP = 1; InputError when a hier group's rails do not fit it."""
        if len(members) < 2:
            return None
        ge = self.group(members, ref)
        if gr is not None and gr.scheme == "hier" and gr.rails:
            rails = [(r.switch, r.shard, r.members, r.paths) for r in gr.rails]
            hier = hier_on_rails(self.ctx.ina_fabric, members, rails, self.ctx.net)
            if hier is None:
                raise InputError(
                    f"plan's group {gr.instance}/{gr.stage} has rails that do not fit its GPUs "
                    "(one member per server on each rail, one rail per shard)"
                )
            return hier, self.ctx.ina_fabric
        if gr is not None and gr.scheme == "ina" and gr.switch is not None:
            mine = next((p for p in self.all_ina(members, ref) if p.switch == gr.switch), None)
            if mine is None:  # another planner's routes
                routes = {m: list(p) for m, p in gr.paths.items()}
                mine = ina_on_routes(routes, gr.switch, self.ctx.net)
            return mine, self.ctx.ina_fabric
        return ge.ring, self.ctx.ring_fabric
