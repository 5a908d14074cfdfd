"""Evaluating a placement: the terms of Eqs. 1-15 assembled for instances, phases and plans.

One code path for every planner: planners differ only in how they group GPUs and which
schemes and routes they may use (``Policy``); given groups, ``Evaluator`` prices them the
same way, so their predictions are comparable and the simulator can re-use them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from controller.costmodel.compute import (
    ComputeCoefficients,
    decode_layer_time,
    default_coefficients,
    prefill_layer_time,
)
from controller.costmodel.hier import hier_pattern
from controller.costmodel.ina import T_AGG_S, ina_pattern
from controller.costmodel.kvcache import KVFlow, kv_route, kv_shares, kv_time
from controller.costmodel.network import CommPattern, CompiledPhase, path_time
from controller.costmodel.queueing import max_rate_within, pk_queue_delay
from controller.costmodel.ring import ring_pattern
from controller.models.gpus import gpu_spec
from controller.planner.grouping import PodGroups, latency_matrix, shape_signature
from controller.planner.options import Policy, Problem
from controller.topology.fabric import Fabric
from controller.topology.graph import SWITCH, servers
from controller.units import GB


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
    ina_all: list[CommPattern] | None = None  # every candidate switch (``Evaluator.all_ina``)

    def options(self, ev: Evaluator, allow_ina: bool = True) -> list[tuple[CommPattern, Fabric]]:
        """Every allowed pattern with the fabric it is priced on."""
        out = [(self.ring, ev.ring_fabric)]
        if allow_ina:
            out += [(p, ev.ina_fabric) for p in self.ina]
            if self.hier is not None:
                out.append((self.hier, ev.ina_fabric))
        return out

    def time(self, ev: Evaluator, nbytes: float, allow_ina: bool = True) -> float:
        return min(p.time(f, nbytes) for p, f in self.options(ev, allow_ina))


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


@dataclass
class InstanceEval:
    stages: list[list[str]]
    allreduce_s: list[float]  # one all-reduce per stage at the phase's message size
    hop_s: list[float]  # pipeline hop after each stage but the last (Eq. 6)
    compute_s: float  # one request (prefill) or one step (decode) over all layers
    comm_s: float
    serve_s: float  # prefill: request latency; decode: step latency without T_f
    bottleneck_s: float  # busiest pipeline stage per request (prefill) or per step (decode)
    rate: float  # requests/s within the SLA
    batch: int  # decode batch (micro-batch per pipeline stage); 1 for prefill
    tpot_s: float = 0.0


@dataclass
class PhaseResult:
    role: str
    tp: int
    pp: int
    groups: list[list[list[str]]]  # per instance, its stages
    instances: list[InstanceEval] = field(default_factory=list)
    gpu_type: str = ""

    @property
    def capacity(self) -> float:
        return sum(i.rate for i in self.instances)


class Evaluator:
    """Prices groups, instances and phases for one problem and one policy. Caches group
    evaluations, which is what makes perturbation and large clusters affordable."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        self.problem = problem
        self.policy = policy
        g = problem.cluster
        self.g = g
        self.net = problem.options.net
        self.ring_fabric = self.net.fabric(g, relay=True)  # NCCL's PXN may relay over NVLink
        self.eth_fabric = self.net.fabric(g, relay=False)  # Ethernet-only routes
        self.ina_fabric = self.ring_fabric if policy.ina_relay else self.eth_fabric
        self.model = problem.model
        self._coeffs: dict[str, ComputeCoefficients] = {}
        self._groups: dict[tuple, GroupEval] = {}
        self._pod_cache: dict[tuple, tuple] = {}
        # groups that lost INA to the aggregator-slot limit when the plan was assembled
        self.forced_ring: set[tuple[str, ...]] = set()
        self._grouping_caches: dict[tuple, dict] = {}
        self._shapes: dict[tuple, tuple] = {}
        self._times: dict[tuple, GroupTimes] = {}
        self._instances: dict[tuple, InstanceEval] = {}
        self._chains: dict[tuple, tuple] = {}  # order_stages, which no T_f changes
        self._pool_summaries: dict[frozenset, dict[tuple[float, str], int]] = {}
        self._kv_prices: dict[tuple, tuple[float, list[KVFlow]]] = {}
        self._kv_routes: dict[tuple[str, str, float], list[str]] = {}
        self._hop_by_shape: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._server_gpus = servers(g)
        self._server_of = lambda x: g.nodes[x].get("server") or x
        self._hops: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        w = problem.workload
        self.mean_in, self.mean_in2, self.mean_out = w.mean_input, w.mean_input_sq, w.mean_output
        self._tpot_quantile = tpot_quantile(w.outputs, problem.sla.attainment)

    def grouping_cache(self, key: tuple) -> dict:
        """A pod-signature cache for one way of grouping (``grouping.by_pods``), kept for the
        evaluator's life so the role splits of one search group each distinct pod once."""
        return self._grouping_caches.setdefault(key, {})

    # -- sizes ---------------------------------------------------------------------------
    def activation_bytes(self, tokens: float) -> float:
        """One all-reduce moves tokens * h * dtype bytes per GPU (docs/design.md §5)."""
        return tokens * self.model.hidden * self.model.dtype_bytes

    def prefill_bytes(self) -> float:
        return self.activation_bytes(self.mean_in)

    def coeffs(self, gpu_type: str) -> ComputeCoefficients:
        if gpu_type not in self._coeffs:
            self._coeffs[gpu_type] = default_coefficients(gpu_type, self.model.dtype_bytes)
        return self._coeffs[gpu_type]

    def slowest_type(self, members: Sequence[str]) -> str:
        return min(
            (self.g.nodes[m]["gpu_type"] for m in members), key=lambda t: gpu_spec(t).fp16_flops
        )

    # -- groups (Alg. 2) -----------------------------------------------------------------
    def ina_candidates(self, members: Sequence[str]) -> list[str]:
        """Switches a group may aggregate on (Alg. 2 line 7): the first-hop switches its
        members' routes reach; the tier above them only when no first-hop switch is reachable
        by every member (a higher tier only adds hops otherwise). INA-capable only."""
        reach = [{e[-1] for e in self.ina_fabric.exits(m)} for m in members]
        first = set().union(*reach)
        common = set.intersection(*reach) if reach else set()
        near = set(first)
        if not common:
            for a in first:
                near.update(v for v in self.g.neighbors(a) if self.g.nodes[v]["kind"] == SWITCH)
        return sorted(s for s in near if self.g.nodes[s].get("ina"))

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
        ring = ring_pattern(self.ring_fabric, members, nbytes, self.net)
        ina: list[CommPattern] = []
        hier = None
        note = ""
        servers = {self.g.nodes[m].get("server") for m in members}
        if len(members) == 1:
            note = "TP=1: no all-reduce"
        elif self.policy.ina == "none":
            note = f"{self.policy.name} uses NCCL ring only"
        elif self.policy.ina_cross_server_only and len(servers) == 1:
            note = "group inside one server: NCCL ring over NVLink"
        else:
            best = ring.time(self.ring_fabric, nbytes)
            if self.policy.hier:
                hier = hier_pattern(self.ina_fabric, members, nbytes, self.net)
                if hier is not None:
                    best = min(best, hier.time(self.ina_fabric, nbytes))
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
                    best = min(best, p.time(self.ina_fabric, nbytes))
            ina.sort(key=lambda p: (p.time(self.ina_fabric, nbytes), p.switch))
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
                or self.policy.ina == "none"
                or (
                    self.policy.ina_cross_server_only
                    and len({self.g.nodes[m].get("server") for m in members}) == 1
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
                ge.ina_all = sorted(out, key=lambda p: (p.time(self.ina_fabric, nbytes), p.switch))
        return ge.ina_all

    def _flat_ina(self, members: Sequence[str], switch: str, nbytes: float) -> CommPattern | None:
        """Flat INA at ``switch``: with NVLink relays allowed, the Ethernet-only routes are
        tried too and the cheaper kept (the greedy route choice with more options is not
        always better), so HeroServe's options contain the homogeneous baselines'."""
        p = ina_pattern(self.ina_fabric, members, switch, nbytes, self.net)
        if self.policy.ina_relay:
            q = ina_pattern(self.eth_fabric, members, switch, nbytes, self.net)
            if q is not None and (
                p is None or q.time(self.ina_fabric, nbytes) < p.time(self.ina_fabric, nbytes)
            ):
                p = q
        return p

    def ina_bound(self, members: Sequence[str], switch: str, nbytes: float) -> float:
        """A lower bound on flat INA at ``switch``: the slowest member's cheapest route alone
        (its own bytes, no sharing, one way) plus the aggregation and host overhead. Sharing
        links and the way back only add time, in either cost mode. Inf if unreachable."""
        wire = nbytes * self.net.ina_wire_ratio
        worst = 0.0
        for m in members:
            routes = self.ina_fabric.routes_to_switch(m, switch)
            if not routes:
                return math.inf
            worst = max(worst, min(self.ina_fabric.path_time(r, wire) for r in routes))
        return worst + T_AGG_S + self.net.ina_host_s

    def group_cost(self, members: Sequence[str], nbytes: float) -> float:
        """One all-reduce of ``nbytes`` on ``members``, the best allowed scheme: what the
        grouping compares. Groups with the same ``group_signature`` cost the same, so their
        routes are chosen once (the perturbation tries many groups that are twins)."""
        return self.times(members, nbytes).time(nbytes)

    def shape(self, *parts: Sequence[str]) -> tuple:
        """``shape_signature`` of ``parts``, memoised per exact parts."""
        key = tuple(tuple(p) for p in parts)
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = shape_signature(self.g, parts, self._server_gpus)
        return hit

    def times(self, members: Sequence[str], nbytes: float) -> GroupTimes:
        """The all-reduce times of ``members``' schemes as functions of the message size,
        shared by every group of the same shape (``shape_signature``): a group's routes are
        chosen once per shape, at the first size asked."""
        key = self.shape(members)
        hit = self._times.get(key)
        if hit is None:
            ge = self.group(members, nbytes)
            others = [p.compiled(f) for p, f in ge.options(self)[1:]]
            if self.problem.options.free_ina and self.ina_allowed(members):
                others.append([])  # free INA: an all-reduce of no time
            hit = self._times[key] = GroupTimes(
                [c for p, f in ge.options(self, allow_ina=False) for c in p.compiled(f)], others
            )
        return hit

    def ina_allowed(self, members: Sequence[str]) -> bool:
        """Whether the policy may aggregate this group in the network at all."""
        if len(members) < 2 or self.policy.ina == "none":
            return False
        one_server = len({self.g.nodes[m].get("server") for m in members}) == 1
        return not (self.policy.ina_cross_server_only and one_server)

    def allreduce_time(self, members: Sequence[str], nbytes: float) -> float:
        if len(members) == 1:
            return 0.0
        allow = tuple(members) not in self.forced_ring
        return self.times(members, nbytes).time(nbytes, allow_ina=allow)

    # -- pipeline (Eq. 6) ----------------------------------------------------------------
    def pipeline_hop_time(self, a: Sequence[str], b: Sequence[str], nbytes: float) -> float:
        """Eq. 6: T_pp(i) = min over receivers r in stage i+1 of max over senders k in stage i
        of the cost of sending the activation k -> r. Each pair's cost is affine in the size
        on its route (latency plus bytes over bandwidth, in either cost mode), so two
        matrices per pair of stages price every size; stage pairs of the same shape
        (``shape_signature``) share them, as the min-max does not depend on the order."""
        key = (tuple(a), tuple(b))
        hit = self._hops.get(key)
        if hit is None:
            shape = self.shape(a, b)
            hit = self._hop_by_shape.get(shape)
            if hit is None:
                ref = self.prefill_bytes()
                members = [*a, *b]
                d0 = latency_matrix(self.ring_fabric, members, 0.0)
                d1 = latency_matrix(self.ring_fabric, members, ref)
                na = len(a)
                lat = d0[:na, na:]
                hit = self._hop_by_shape[shape] = (lat, (d1[:na, na:] - lat) / ref)
            self._hops[key] = hit
        lat, slope = hit
        return float(np.min(np.max(lat + slope * nbytes, axis=0)))

    def order_stages(
        self, groups: list[list[str]], pp: int
    ) -> tuple[list[list[list[str]]], list[list[str]]]:
        """Chain groups into instances of ``pp`` stages: start from the first free group (in
        server order) and append the free group with the cheapest pipeline hop (Eq. 6 at the
        prefill message, every pair of groups priced at once from the GPUs' latency matrix:
        O(N^2 S) for N GPUs). Returns the instances and the groups left over."""
        if pp == 1:
            return [[grp] for grp in groups], []
        key = (pp, tuple(tuple(grp) for grp in groups))
        hit = self._chains.get(key)
        if hit is None:
            hit = self._chains[key] = self._order_stages(groups, pp)
        chains, rest = hit  # fresh outer lists: callers extend what they get
        return [list(c) for c in chains], list(rest)

    def _order_stages(
        self, groups: list[list[str]], pp: int
    ) -> tuple[list[list[list[str]]], list[list[str]]]:
        n, size = len(groups), len(groups[0])
        members = [x for grp in groups for x in grp]
        d = latency_matrix(self.ring_fabric, members, self.prefill_bytes())
        # hop[a, b] = min over receivers r in b of max over senders k in a of d[k, r]
        hop = d.reshape(n, size, n, size).max(axis=1).min(axis=2)
        free = list(range(n))
        out = []
        while len(free) >= pp:
            chain = [free.pop(0)]
            while len(chain) < pp:
                row = hop[chain[-1]]
                best = min(range(len(free)), key=lambda i: row[free[i]])
                chain.append(free.pop(best))
            out.append([groups[i] for i in chain])
        return out, [groups[i] for i in free]

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

    # -- instances -----------------------------------------------------------------------
    def stage_parts(
        self, stages: list[list[str]], nbytes: float
    ) -> tuple[list[float], list[float]]:
        ar = [self.allreduce_time(s, nbytes) for s in stages]
        hops = [
            self.pipeline_hop_time(stages[i], stages[i + 1], nbytes) for i in range(len(stages) - 1)
        ]
        return ar, hops

    def _memo_instance(
        self, kind: str, stages: list[list[str]], t_f: float, price: Callable[[], InstanceEval]
    ) -> InstanceEval:
        """Instances of the same shape (``shape_signature`` of their stages, in order) price
        the same: the first is priced, its twins get a copy with their own GPU names."""
        forced = tuple(tuple(s) in self.forced_ring for s in stages)
        key = (kind, self.shape(*stages), t_f, forced)
        hit = self._instances.get(key)
        if hit is None:
            hit = price()
            if len(self._instances) < 100_000:
                self._instances[key] = hit
            return hit
        return replace(hit, stages=[list(s) for s in stages])

    def prefill_instance(self, stages: list[list[str]]) -> InstanceEval:
        return self._memo_instance("p", stages, 0.0, lambda: self._prefill_instance(stages))

    def decode_instance(self, stages: list[list[str]], t_f: float) -> InstanceEval:
        return self._memo_instance("d", stages, t_f, lambda: self._decode_instance(stages, t_f))

    def _prefill_instance(self, stages: list[list[str]]) -> InstanceEval:
        """TTFT side (Eqs. 3, 5-12): one request of mean length per batch; the queue is served
        by the busiest stage (P-K with deterministic service)."""
        m = self.model
        tp, pp = len(stages[0]), len(stages)
        co = self.coeffs(self.slowest_type([g for s in stages for g in s]))
        layer = prefill_layer_time(co, m, tp, self.mean_in, self.mean_in2)
        lps = m.layers / pp
        ar, hops = self.stage_parts(stages, self.prefill_bytes())
        stage_s = [lps * (layer + 2 * a) for a in ar]
        busy = [s + (hops[i] if i < len(hops) else 0.0) for i, s in enumerate(stage_s)]
        serve = sum(stage_s) + sum(hops)
        rate = max_rate_within(self.problem.sla.ttft_s, serve, max(busy))
        comm = sum(2 * lps * a for a in ar) + sum(hops)
        return InstanceEval(stages, ar, hops, m.layers * layer, comm, serve, max(busy), rate, 1)

    def kv_room_bytes(self, members: Sequence[str], tp: int, pp: int) -> float:
        """Memory left per GPU for KV cache: r_frac of its memory minus its weight shard."""
        r = self.problem.options.r_frac
        weights = self.model.param_bytes / (tp * pp)
        return min(self.g.nodes[x]["memory_gb"] * GB * r for x in members) - weights

    def decode_step(self, stages: list[list[str]], batch: int) -> tuple[float, float, float, float]:
        """(step time over all stages, busiest stage, compute, comm) for a micro-batch."""
        m = self.model
        tp, pp = len(stages[0]), len(stages)
        co = self.coeffs(self.slowest_type([g for s in stages for g in s]))
        ctx = self.problem.workload.mean_kv_tokens
        layer = decode_layer_time(co, m, tp, batch, batch * ctx)
        lps = m.layers / pp
        ar, hops = self.stage_parts(stages, self.activation_bytes(batch))
        stage_s = [lps * (layer + 2 * a) for a in ar]
        busy = [s + (hops[i] if i < len(hops) else 0.0) for i, s in enumerate(stage_s)]
        comm = sum(2 * lps * a for a in ar) + sum(hops)
        return sum(stage_s) + sum(hops), max(busy), m.layers * layer, comm

    def tpot_kv_share(self, t_f: float) -> float:
        """The KV transfer's part of a request's TPOT at the SLA percentile. DistServe and the
        simulator measure TPOT as (last token - first token) / (output tokens - 1), so T_f is
        paid once and spread over the request's output tokens; the requests that feel it most
        are the shortest, and ``attainment`` of them must meet the bound, so the share is
        T_f / q with q from ``tpot_quantile``.
        ``tpot_mode="eq4"`` charges T_f to every token, as the paper's Eq. 4 is written."""
        if t_f <= 0:
            return 0.0
        if self.problem.options.tpot_mode == "eq4":
            return t_f
        return t_f / self._tpot_quantile

    def _decode_instance(self, stages: list[list[str]], t_f: float) -> InstanceEval:
        """TPOT side (Eqs. 4, 13): the largest batch whose step time plus the KV transfer's
        share (``tpot_kv_share``) meets the TPOT bound and whose KV cache fits; ``pp``
        micro-batches are in flight. Rate in requests/s: batch / (busiest stage * mean output
        length)."""
        tp, pp = len(stages[0]), len(stages)
        ctx = self.problem.workload.mean_kv_tokens
        room = self.kv_room_bytes([g for s in stages for g in s], tp, pp)
        b_mem = int(room * tp / (ctx * self.model.kv_bytes_per_token())) if room > 0 else 0
        b_max = min(b_mem, self.problem.options.max_batch)
        bound = self.problem.sla.tpot_s
        kv = self.tpot_kv_share(t_f)

        def ok(b: int) -> bool:
            return self.decode_step(stages, b)[0] + kv <= bound

        if b_max < 1 or not ok(1):
            step, busy, comp, comm = self.decode_step(stages, 1)
            return InstanceEval(stages, [], [], comp, comm, step, busy, 0.0, 0, step + kv)
        lo, hi = 1, b_max  # largest b with ok(b): step time grows with b
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        step, busy, comp, comm = self.decode_step(stages, lo)
        ar, hops = self.stage_parts(stages, self.activation_bytes(lo))
        rate = lo / (busy * self.mean_out)
        return InstanceEval(stages, ar, hops, comp, comm, step, busy, rate, lo, step + kv)

    # -- KV transfer (Eqs. 14-15) --------------------------------------------------------
    def kv_transfer(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None = None, n_dec: int | None = None
    ) -> tuple[float, list[KVFlow], dict[tuple, list[list[str]]]]:
        """T_f for one mean-length request from each prefill instance to the decode instance
        it is paired with (round robin), all pairs at once; at most ``kv_pairs_max`` pairs are
        priced. Routes are each flow's cheapest alone; the price counts shared links.

        A decode instance's stages may be put in another order (``kv_stage_order``) so that
        each stage sits close to the prefill GPUs that hold its layers; the third value maps
        the key of every re-ordered instance (``stage_key``) to its new stages."""
        reorder: dict[tuple, list[list[str]]] = {}
        paired = []
        for p, d in self.kv_pairs(pre, dec, n_pre, n_dec):
            key = stage_key(d)
            if key not in reorder:
                best = self.kv_stage_order(p, d)
                if best != d:
                    reorder[key] = best
            paired.append((p, reorder.get(key, d)))
        if not paired:
            return 0.0, [], {}
        t_f, flows = self.kv_price(paired)
        return t_f, flows, reorder

    def kv_pairs(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None, n_dec: int | None
    ) -> list[tuple[list[list[str]], list[list[str]]]]:
        """The (prefill stages, decode stages) pairs whose KV transfer is priced: the best
        ``n_pre`` and ``n_dec`` instances (as ``combine`` deploys them), prefill instance i
        paired with decode instance i round robin, at most ``kv_pairs_max`` pairs."""
        pres = [i.stages for i in sorted(pre.instances, key=lambda i: -i.rate)][:n_pre]
        decs = [i.stages for i in sorted(dec.instances, key=lambda i: -i.rate)][:n_dec]
        if not decs:
            return []
        n = min(len(pres), self.problem.options.kv_pairs_max)
        return [(pres[i], decs[i % len(decs)]) for i in range(n)]

    def kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        """T_f of the given (prefill stages, decode stages) pairs transferring at once, and
        the flows (Eqs. 14-15); memoised on the pairs (the search prices the same deployment
        again when it settles its KV transfer)."""
        key = tuple((tuple(map(tuple, p)), tuple(map(tuple, d))) for p, d in pairs)
        hit = self._kv_prices.get(key)
        if hit is None:
            hit = self._kv_prices[key] = self._kv_price(pairs)
        return hit[0], list(hit[1])

    def kv_routed(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> list[KVFlow]:
        """The KV shares of one mean-length request per pair, each on its route (times not
        priced: 0)."""
        total = self.mean_in * self.model.kv_bytes_per_token()
        out = []
        for p, d in pairs:
            for s, dst, f in kv_shares(self.model, p, d):
                out.append(KVFlow(s, dst, f * total, self.kv_route(s, dst, f * total), 0.0))
        return out

    def _kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        routed = self.kv_routed(pairs)
        if not routed:
            return 0.0, []
        t_f, times = kv_time(self.ring_fabric, [(f.src, f.path, f.nbytes) for f in routed])
        return t_f, [replace(f, time_s=t) for f, t in zip(routed, times, strict=True)]

    def kv_route(self, src: str, dst: str, nbytes: float) -> list[str]:
        """``costmodel.kvcache.kv_route`` on the ring fabric, memoised: the search routes the
        same GPU pairs again for every split that deploys them."""
        key = (src, dst, nbytes)
        hit = self._kv_routes.get(key)
        if hit is None:
            hit = self._kv_routes[key] = kv_route(self.ring_fabric, src, dst, nbytes)
        return hit

    def kv_stage_order(
        self, pre_stages: list[list[str]], dec_stages: list[list[str]]
    ) -> list[list[str]]:
        """The order of a decode instance's stages that makes its KV transfer from
        ``pre_stages`` fastest: decode stage j receives the KV of layers [jL/P, (j+1)L/P),
        so each group is assigned the stage whose layers sit nearest (an assignment problem
        over the alone-price of each stage's KV shares, solved exactly with SciPy's
        ``linear_sum_assignment``; O(P^3)). The order the pipeline hops chose is kept when
        it is at least as fast (ties keep the hops' order). Only instances that share a
        server with their prefill instance are re-ordered: elsewhere every stage's KV crosses
        Ethernet whatever the order, and the order the hops chose stands."""
        pp = len(dec_stages)
        if pp == 1:
            return dec_stages
        srv = self._server_of
        if not {srv(x) for s in pre_stages for x in s} & {srv(x) for s in dec_stages for x in s}:
            return dec_stages
        total = self.mean_in * self.model.kv_bytes_per_token()
        fab = self.ring_fabric
        cost = np.zeros((pp, pp))
        for k, grp in enumerate(dec_stages):
            for j in range(pp):
                # the shares stage j would receive if group k held it (the other stages are
                # placeholders whose shares are dropped)
                trial = [list(grp) if i == j else [""] * len(grp) for i in range(pp)]
                for src, dst, f in kv_shares(self.model, pre_stages, trial):
                    if dst:
                        nb = f * total
                        cost[j, k] += path_time(fab, self.kv_route(src, dst, nb), nb)
        rows, cols = linear_sum_assignment(cost)
        order = [dec_stages[int(c)] for _, c in sorted(zip(rows, cols, strict=True))]
        if order == dec_stages:
            return dec_stages
        now, _ = self.kv_price([(pre_stages, dec_stages)])
        new, _ = self.kv_price([(pre_stages, order)])
        return order if new < now * (1 - 1e-9) else dec_stages

    # -- phases --------------------------------------------------------------------------
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

    def prefill_phase(self, tp: int, pp: int, pods: list[PodGroups]) -> PhaseResult:
        evals = self.instances(
            ("prefill", tp, pp, self._forced_key()), pods, pp, self.prefill_instance
        )
        return self.phase_result("prefill", tp, pp, evals)

    def decode_phase(self, tp: int, pp: int, pods: list[PodGroups], t_f: float) -> PhaseResult:
        evals = self.instances(
            ("decode", tp, pp, t_f, self._forced_key()),
            pods,
            pp,
            lambda st: self.decode_instance(st, t_f),
        )
        return self.phase_result("decode", tp, pp, evals)

    def _forced_key(self) -> int:
        return len(self.forced_ring)

    def phase_result(self, role: str, tp: int, pp: int, evals: list[InstanceEval]) -> PhaseResult:
        res = PhaseResult(role, tp, pp, [e.stages for e in evals], evals)
        res.gpu_type = _types(self.g, res.groups)
        return res


def _types(g, insts: list[list[list[str]]]) -> str:
    return "+".join(sorted({g.nodes[x]["gpu_type"] for i in insts for s in i for x in s}))


def tpot_quantile(outputs: Sequence[int], attainment: float) -> float:
    """q such that the requests with fewer than q output tokens after the first (whose TPOT
    takes more than T_f / q of the KV transfer) are at most ``1 - attainment`` of all requests.
    A request of one output token has no TPOT (the simulator counts it as meeting the
    bound), so it never misses. At least 1."""
    rest = np.sort(np.asarray(outputs, dtype=float) - 1.0)
    allowed = int((1.0 - attainment) * len(rest) + 1e-9)
    rest = rest[rest >= 1]
    if len(rest) == 0:
        return 1.0
    return max(1.0, float(rest[min(allowed, len(rest) - 1)]))


def stage_key(stages: Sequence[Sequence[str]]) -> tuple:
    """A hashable key of an instance's stages, independent of their order."""
    return tuple(sorted(tuple(s) for s in stages))


@dataclass
class Combination:
    """The deployment chosen from two evaluated phases: how many of the best instances of each
    to run (the planner decides replica counts), and the predicted figures (Eq. 1)."""

    n_prefill: int
    n_decode: int
    rate: float  # H: requests/s the deployment serves within the SLA
    rate_per_gpu: float  # H / GPUs used
    gpus_used: int
    ttft_s: float
    tpot_s: float

    def better_than(self, other: Combination | None) -> bool:
        """Eq. 1's order: more H; at equal H (within 1e-9), fewer GPUs."""
        if other is None:
            return True
        if self.rate > other.rate * (1 + 1e-9):
            return True
        return self.rate >= other.rate * (1 - 1e-9) and self.gpus_used < other.gpus_used


def combine(
    pre: PhaseResult, dec: PhaseResult, sla_ttft: float, max_gpus: int | None = None
) -> Combination | None:
    """Eq. 1: maximise the total SLA-meeting rate H = min(sum of the prefill instances' rates,
    sum of the decode instances' rates) over how many of each to run (best instances first),
    with at most ``max_gpus`` GPUs; at equal H, the fewest GPUs, so an instance that would
    add no rate stays idle. O(I_p log I_d)."""
    p = sorted([i for i in pre.instances if i.rate > 0], key=lambda i: -i.rate)
    d = sorted([i for i in dec.instances if i.rate > 0], key=lambda i: -i.rate)
    if not p or not d:
        return None
    g_p, g_d = pre.tp * pre.pp, dec.tp * dec.pp
    cp = np.cumsum([i.rate for i in p])
    cd = np.cumsum([i.rate for i in d])
    cap = max_gpus if max_gpus is not None else math.inf
    best: tuple[float, int, int, int] | None = None  # (H, GPUs, i, j)
    for i in range(1, len(p) + 1):
        room = (cap - i * g_p) // g_d if cap < math.inf else len(d)
        if room < 1:
            break
        top = int(min(len(d), room))
        # the fewest decode instances that keep up with these i prefill instances
        j = min(top, int(np.searchsorted(cd, cp[i - 1] * (1 - 1e-12))) + 1)
        for jj in {j, max(1, j - 1)}:
            rate = float(min(cp[i - 1], cd[jj - 1]))
            gpus = i * g_p + jj * g_d
            if (
                best is None
                or rate > best[0] * (1 + 1e-9)
                or (rate >= best[0] * (1 - 1e-9) and gpus < best[1])
            ):
                best = (rate, gpus, i, jj)
    if best is None:
        return None
    rate, gpus, i, j = best
    chosen = p[:i]
    total = sum(x.rate for x in chosen)
    ttft = 0.0
    for x in chosen:  # each prefill instance takes load in proportion to its capacity
        lam = rate * x.rate / total if total > 0 else 0.0
        ttft = max(ttft, x.serve_s + pk_queue_delay(lam, x.bottleneck_s))
    tpot = max(x.tpot_s for x in d[:j])
    if not math.isfinite(ttft):
        ttft = sla_ttft
    return Combination(i, j, rate, rate / gpus, gpus, ttft, tpot)
