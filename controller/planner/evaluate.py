"""Evaluating a placement: the terms of Eqs. 1-15 assembled for instances, phases and plans.

One code path for every planner: planners differ only in how they group GPUs and which
schemes and routes they may use (``Policy``); given groups, ``Evaluator`` prices them the
same way, so their predictions are comparable and the simulator can re-use them.

``Evaluator`` is the entry point. Its jobs live in their own modules, each with the caches
it fills, and it inherits them all:

- ``context.EvalContext``: the problem, policy, fabrics and shared lookups (sizes, compute
  coefficients, group shapes);
- ``allreduce.AllReducePricing``: a group's schemes and all-reduce time (Alg. 2, Eqs. 7-11);
- ``pipeline.PipelinePricing``: the pipeline hop (Eq. 6) and chaining groups into stages;
- ``instances.InstancePricing``: one instance's TTFT or TPOT side (Eqs. 2-5, 12-13);
- ``kvtransfer.KVPricing``: the KV transfer between deployed instances (Eqs. 14-15).

This module holds what joins them: the phases, every instance of one role at one (TP, PP)
formed from a pool's groups and priced (for an engine, those it can place), with the cache
of twin pods' instances. Eq. 1
(which instances to deploy) is ``combine.combine``; the result types are in ``results``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import networkx as nx

from controller.models.engines import placement_problem
from controller.planner.grouping import PodGroups
from controller.planner.instances import InstancePricing
from controller.planner.kvtransfer import KVLoad, KVPricing
from controller.planner.options import Policy, Problem
from controller.planner.results import InstanceEval, PhaseResult, stage_key
from controller.units import GB


class Evaluator(InstancePricing, KVPricing):
    """Prices groups, instances and phases for one problem and one policy (the parts it
    inherits: module docstring). Caches group evaluations, which is what makes perturbation
    and large clusters affordable."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        super().__init__(problem, policy)
        self._pod_cache: dict[tuple, tuple] = {}
        self._pool_summaries: dict[frozenset, dict[tuple[float, str], int]] = {}
        self._engine = problem.engine

    # -- phases --------------------------------------------------------------------------
    def instances(
        self,
        tag: tuple,
        pods: list[PodGroups],
        pp: int,
        evaluate: Callable[[list[list[str]]], InstanceEval],
    ) -> list[InstanceEval]:
        """Form and evaluate the instances of every pod; twin pods reuse the first one's
        results renamed by position. Groups left over in pods are chained across pods."""
        out: list[InstanceEval] = []
        leftovers: list[list[str]] = []
        for pg in pods:
            ck = (tag, pg.key) if pg.key is not None else None
            hit = self._pod_cache.get(ck) if ck is not None else None
            if hit is not None:
                first, evals, rest = hit
                pos = {x: i for i, x in enumerate(first)}

                def rename(xs: list[str], pg: PodGroups = pg, pos: dict = pos) -> list[str]:
                    return [pg.members[pos[x]] for x in xs]

                out += [replace(e, stages=[rename(st) for st in e.stages]) for e in evals]
                leftovers += [rename(grp) for grp in rest]
            else:
                insts, rest = self.order_stages(pg.groups, pp)
                evals = [evaluate(st) for st in insts]
                if ck is not None:
                    self._pod_cache[ck] = (pg.members, evals, rest)
                out += evals
                leftovers += rest
            # chain left-over groups of neighbouring pods in small windows, which keeps the
            # pipeline hops short and the latency matrices small on large clusters
            if len(leftovers) >= 2 * pp:
                insts, leftovers = self.order_stages(leftovers, pp)
                out += [evaluate(st) for st in insts]
        if len(leftovers) >= pp:
            insts, _ = self.order_stages(leftovers, pp)
            out += [evaluate(st) for st in insts]
        return out

    def pool_summary(self, pool: Sequence[str]) -> dict[tuple[float, str], int]:
        """(memory GB, GPU type) -> how many GPUs of ``pool`` have them; cached per pool."""
        key = frozenset(pool)
        hit = self._pool_summaries.get(key)
        if hit is None:
            hit = {}
            for x in pool:
                d = self.g.nodes[x]
                k = (d["memory_gb"], d["gpu_type"])
                hit[k] = hit.get(k, 0) + 1
            self._pool_summaries[key] = hit
        return hit

    def fit(self, pool: Sequence[str], tp: int, pp: int) -> list[str]:
        """The GPUs of ``pool`` with enough memory for a 1/(TP*PP) weight shard (Alg. 1
        lines 5-6)."""
        need = self.model.param_bytes / (tp * pp * self.problem.options.r_frac)
        return [x for x in pool if self.g.nodes[x]["memory_gb"] * GB >= need]

    def reevaluate(self, res: PhaseResult, t_f: float = 0.0) -> PhaseResult:
        """The same instances priced again (after ``forced_ring`` changed, say); decode at
        ``t_f``."""
        if res.role == "prefill":
            evals = [self.prefill_instance(i.stages) for i in res.instances]
        else:
            evals = [self.decode_instance(i.stages, t_f) for i in res.instances]
        return self.phase_result(res.role, res.tp, res.pp, evals)

    def reprice_decode(
        self, res: PhaseResult, t_f: float, reorder: dict[tuple, list[list[str]]]
    ) -> PhaseResult:
        """``res`` with the instances that ``kv_transfer`` re-ordered evaluated again in their
        new order (the others are unchanged: ``res`` was evaluated at the same T_f)."""
        if not reorder:
            return res
        evals = [
            self.decode_instance(reorder[k], t_f) if (k := stage_key(i.stages)) in reorder else i
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
        inside = self.servers_with_kv_inside(util)
        evals: list[InstanceEval | None] = []
        factor: dict[tuple, float] = lost if lost is not None else {}
        for i in res.instances:
            if stage_key(i.stages) not in deployed or i.rate <= 0:
                evals.append(None)
                continue
            nb = self.activation_bytes(max(1, i.batch))
            if not self.shares_kv_links(i.stages, nb, util, inside):
                evals.append(i)
                continue
            new = self._decode_instance(i.stages, t_f, util, alone=i.batch)
            shape = self.shape(*i.stages)
            factor[shape] = min(factor.get(shape, 1.0), new.rate / i.rate)
            evals.append(new)
        if not factor:
            return res, False
        out = []
        for i, e in zip(res.instances, evals, strict=True):
            if e is None:
                f = factor.get(self.shape(*i.stages), 1.0)
                e = replace(i, rate=i.rate * f) if f < 1.0 else i
            out.append(e)
        return self.phase_result(res.role, res.tp, res.pp, out), True

    def prefill_phase(self, tp: int, pp: int, pods: list[PodGroups]) -> PhaseResult:
        """The prefill instances formed from ``pods``' groups, each priced."""
        evals = self.instances(
            ("prefill", tp, pp, self._forced_key()), pods, pp, self.prefill_instance
        )
        return self.phase_result("prefill", tp, pp, evals)

    def decode_phase(self, tp: int, pp: int, pods: list[PodGroups], t_f: float) -> PhaseResult:
        """The decode instances formed from ``pods``' groups, each priced at KV transfer
        time ``t_f``."""
        evals = self.instances(
            ("decode", tp, pp, t_f, self._forced_key()),
            pods,
            pp,
            lambda st: self.decode_instance(st, t_f),
        )
        return self.phase_result("decode", tp, pp, evals)

    def _forced_key(self) -> int:
        # part of the twin-pod cache key: ``forced_ring`` only grows, so its size tells
        # whether pods priced before it grew would price differently now
        return len(self.forced_ring)

    def phase_result(self, role: str, tp: int, pp: int, evals: list[InstanceEval]) -> PhaseResult:
        """``evals`` as one phase, named by the GPU types its instances run on. A plan for
        an engine keeps the instances whose placement that engine can start."""
        if self._engine is not None and self._engine.placement.even_split:
            evals = [e for e in evals if self._placeable(e.stages)]
        res = PhaseResult(role, tp, pp, [e.stages for e in evals], evals)
        res.gpu_type = _types(self.g, res.groups)
        return res

    def _placeable(self, stages: list[list[str]]) -> bool:
        server_of = {x: self.g.nodes[x].get("server") or x for st in stages for x in st}
        return placement_problem(self._engine, "", stages, server_of) is None


def _types(g: nx.Graph, insts: list[list[list[str]]]) -> str:
    return "+".join(sorted({g.nodes[x]["gpu_type"] for i in insts for s in i for x in s}))
