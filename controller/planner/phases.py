"""Phases: every instance of one role at one (TP, PP) formed from a pool's groups and priced.

- ``PhasePricer``: the evaluator's pricer of whole phases, built on the pipeline pricer
  (which chains groups into instances), the instance pricer (which prices each) and the
  all-reduce pricer (whose ring-forced groups key its cache). It forms a phase's instances
  pod by pod (twin pods reuse the first one's, renamed), prices phases again (after
  ``forced_ring`` grew, at another T_f, in a re-ordered stage order, under a KV load:
  ``contend_decode``), and keeps, for a plan for an engine, the instances that engine can
  place. Its cache: one pod's instances per (role, TP, PP, T_f, ring-forced groups, pod).
- ``PodInstances``: what that cache holds for one pod.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import networkx as nx

from controller.models.engines import placement_problem
from controller.planner.allreduce import AllReducePricer
from controller.planner.context import PricingContext
from controller.planner.grouping import PodGroups
from controller.planner.instances import InstancePricer
from controller.planner.kvtransfer import KVLoad
from controller.planner.pipeline import PipelinePricer
from controller.planner.results import InstanceEval, PhaseResult, stage_key


@dataclass
class PodInstances:
    """The instances formed from one pod's groups, priced: the pod's GPUs in the order its
    twins are renamed by (``members``), its instances (``evals``) and the groups left over
    (``rest``), chained with neighbouring pods' left-overs."""

    members: list[str]
    evals: list[InstanceEval]
    rest: list[list[str]]


class PhasePricer:
    """Prices the phases of one role on ``ctx`` with ``instance``'s instances, chained by
    ``pipeline``; ``allreduce``'s ring-forced groups key the twin-pod cache."""

    def __init__(
        self,
        ctx: PricingContext,
        allreduce: AllReducePricer,
        pipeline: PipelinePricer,
        instance: InstancePricer,
    ) -> None:
        self.ctx = ctx
        self.allreduce = allreduce
        self.pipeline = pipeline
        self.instance = instance
        # one entry per (role, TP, PP, T_f, forced-ring count, pod key): at most the phases
        # one search prices x the distinct pods of their groupings
        self._pod_cache: dict[tuple, PodInstances] = {}
        self._engine = ctx.problem.engine

    def instances(
        self,
        tag: tuple,
        pods: list[PodGroups],
        pp: int,
        evaluate: Callable[[list[list[str]]], InstanceEval],
    ) -> list[InstanceEval]:
        """Form and evaluate the instances of every pod; twin pods reuse the first one's
        results renamed by position. Groups left over in pods are chained across pods."""
        order_stages = self.pipeline.order_stages
        out: list[InstanceEval] = []
        leftovers: list[list[str]] = []
        for pg in pods:
            ck = (tag, pg.key) if pg.key is not None else None
            hit = self._pod_cache.get(ck) if ck is not None else None
            if hit is not None:
                pos = {x: i for i, x in enumerate(hit.members)}

                def rename(xs: list[str], pg: PodGroups = pg, pos: dict = pos) -> list[str]:
                    return [pg.members[pos[x]] for x in xs]

                out += [replace(e, stages=[rename(st) for st in e.stages]) for e in hit.evals]
                leftovers += [rename(grp) for grp in hit.rest]
            else:
                insts, rest = order_stages(pg.groups, pp)
                evals = [evaluate(st) for st in insts]
                if ck is not None:
                    self._pod_cache[ck] = PodInstances(pg.members, evals, rest)
                out += evals
                leftovers += rest
            # chain left-over groups of neighbouring pods in small windows, which keeps the
            # pipeline hops short and the latency matrices small on large clusters
            if len(leftovers) >= 2 * pp:
                insts, leftovers = order_stages(leftovers, pp)
                out += [evaluate(st) for st in insts]
        if len(leftovers) >= pp:
            insts, _ = order_stages(leftovers, pp)
            out += [evaluate(st) for st in insts]
        return out

    def reevaluate(self, res: PhaseResult, t_f: float = 0.0) -> PhaseResult:
        """The same instances priced again (after ``forced_ring`` grew, say); decode at
        ``t_f``."""
        inst = self.instance
        if res.role == "prefill":
            evals = [inst.prefill_instance(i.stages) for i in res.instances]
        else:
            evals = [inst.decode_instance(i.stages, t_f) for i in res.instances]
        return self.phase_result(res.role, res.tp, res.pp, evals)

    def reprice_decode(
        self, res: PhaseResult, t_f: float, reorder: dict[tuple, list[list[str]]]
    ) -> PhaseResult:
        """``res`` with the instances that ``kv_transfer`` re-ordered evaluated again in their
        new order (the others are unchanged: ``res`` was evaluated at the same T_f)."""
        if not reorder:
            return res
        inst = self.instance
        evals = [
            inst.decode_instance(reorder[k], t_f) if (k := stage_key(i.stages)) in reorder else i
            for i in res.instances
        ]
        return self.phase_result(res.role, res.tp, res.pp, evals)

    def contend_decode(
        self,
        res: PhaseResult,
        t_f: float,
        load: KVLoad,
        rate: float,
        lost: dict[tuple, float] | None = None,
    ) -> tuple[PhaseResult, bool]:
        """``res`` (priced at ``t_f``) with the decode instances that ``load`` deploys priced
        again under its KV transfers at ``rate`` (``decode_step``'s ``util``) where their
        groups' traffic crosses a loaded link. An instance not deployed would carry KV like
        its deployed twins if it were: its rate is scaled by the smallest factor its shape's
        deployed instances lost (the caller deploys again until the instances deployed are
        the ones priced). ``lost``: those factors per shape from earlier loads at the same
        rate, kept across the caller's rounds (updated here), so that an instance priced
        under an earlier deployment keeps what it lost there. Returns the phase and whether
        any instance was priced again. Whether to price it at all is the caller's
        (``deployment.settle_kv``'s ``kv_contention``)."""
        util = load.utilisation(rate)
        deployed = {stage_key(d) for _, d in load.pairs}
        if not util or not deployed:
            return res, False
        ctx, inst = self.ctx, self.instance
        inside = inst.servers_with_kv_inside(util)
        evals: list[InstanceEval | None] = []
        factor: dict[tuple, float] = lost if lost is not None else {}
        for i in res.instances:
            if stage_key(i.stages) not in deployed or i.rate <= 0:
                evals.append(None)
                continue
            # an instance is the step between two checks: a settlement prices thousands at
            # 65,536 GPUs, each routing its groups around the KV load (TimeLimitReached)
            ctx.problem.tick()
            nb = ctx.activation_bytes(max(1, i.batch))
            if not inst.shares_kv_links(i.stages, nb, util, inside):
                evals.append(i)
                continue
            new = inst.priced_decode_instance(i.stages, t_f, util, alone=i.batch)
            shape = ctx.shape(*i.stages)
            factor[shape] = min(factor.get(shape, 1.0), new.rate / i.rate)
            evals.append(new)
        if not factor:
            return res, False
        out = []
        for i, e in zip(res.instances, evals, strict=True):
            if e is None:
                f = factor.get(ctx.shape(*i.stages), 1.0)
                e = replace(i, rate=i.rate * f) if f < 1.0 else i
            out.append(e)
        return self.phase_result(res.role, res.tp, res.pp, out), True

    def prefill_phase(self, tp: int, pp: int, pods: list[PodGroups]) -> PhaseResult:
        """The prefill instances formed from ``pods``' groups, each priced."""
        evals = self.instances(
            ("prefill", tp, pp, self._forced_key()), pods, pp, self.instance.prefill_instance
        )
        return self.phase_result("prefill", tp, pp, evals)

    def decode_phase(self, tp: int, pp: int, pods: list[PodGroups], t_f: float) -> PhaseResult:
        """The decode instances formed from ``pods``' groups, each priced at KV transfer
        time ``t_f``."""
        inst = self.instance
        evals = self.instances(
            ("decode", tp, pp, t_f, self._forced_key()),
            pods,
            pp,
            lambda st: inst.decode_instance(st, t_f),
        )
        return self.phase_result("decode", tp, pp, evals)

    def _forced_key(self) -> int:
        # part of the twin-pod cache key: ``forced_ring`` only grows, so its size tells
        # whether pods priced before it grew would price differently now
        return len(self.allreduce.forced_ring)

    def phase_result(self, role: str, tp: int, pp: int, evals: list[InstanceEval]) -> PhaseResult:
        """``evals`` as one phase, named by the GPU types its instances run on. A plan for
        an engine keeps the instances whose placement that engine can start."""
        if self._engine is not None and self._engine.placement.even_split:
            evals = [e for e in evals if self._placeable(e.stages)]
        res = PhaseResult(role, tp, pp, [e.stages for e in evals], evals)
        res.gpu_type = _types(self.ctx.g, res.groups)
        return res

    def _placeable(self, stages: list[list[str]]) -> bool:
        of = self.ctx.server_of
        server_of = {x: of.get(x) or x for st in stages for x in st}
        return placement_problem(self._engine, "", stages, server_of) is None


def _types(g: nx.Graph, insts: list[list[list[str]]]) -> str:
    return "+".join(sorted({g.nodes[x]["gpu_type"] for i in insts for s in i for x in s}))
