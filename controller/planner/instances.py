"""Instances (Eqs. 2-5, 12-13): one prefill or decode instance priced from its stages.

``InstancePricer`` is the evaluator's pricer of an instance, built on the all-reduce and
pipeline pricers it is given: per stage, its compute (Eqs. 12-13, at the slowest GPU's
pace), its all-reduces (``allreduce.AllReducePricer``) and the hop to the next stage (Eq. 6,
``pipeline.PipelinePricer``); then prefill's rate within the TTFT bound (the FIFO pipeline's
TTFT percentile over the workload's lengths, ``prefill_times``) and decode's largest batch
within the TPOT bound and the KV memory, alone or with its all-reduces sharing links with
KV transfers (``shares_kv_links``, ``shared_allreduce``). Its caches (each bound where it is
declared): instances per shape of their stages, saturated prefill capacities, ideal prefill
rates, and each group's link traffic. ``DecodeStep`` is one decode step's times;
``tpot_quantile`` sets how much of the KV transfer a TPOT carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from controller.costmodel.compute import decode_layer_time, prefill_layer_time
from controller.costmodel.prefill_pool import saturated_rate
from controller.costmodel.queueing import PrefillTimes, pipeline_max_rate
from controller.costmodel.sharing import SharedTraffic, allreduce_stretches
from controller.models.engines import engine_profile, prefill_admission
from controller.planner.allreduce import AllReducePricer
from controller.planner.context import PricingContext
from controller.planner.pipeline import PipelinePricer
from controller.planner.results import InstanceEval
from controller.topology.fabric import Edge
from controller.units import GB

# prompts drawn to price a prefill pipeline's saturated throughput: the standard error of
# their mean is 1.5% of it for chatbot's prompts (standard deviation 0.97 of the mean) and
# 0.3% for summarization's (0.21)
PROMPT_SAMPLE = 4000


@dataclass(frozen=True)
class DecodeStep:
    """One decode micro-batch's step (``InstancePricer.decode_step``), in seconds: over all
    stages, at the busiest stage, its compute and its communication."""

    step_s: float
    busiest_s: float
    compute_s: float
    comm_s: float


class InstancePricer:
    """Prices prefill and decode instances from their stages, on ``ctx``, with ``allreduce``'s
    all-reduces and ``pipeline``'s hops."""

    def __init__(
        self, ctx: PricingContext, allreduce: AllReducePricer, pipeline: PipelinePricer
    ) -> None:
        self.ctx = ctx
        self.allreduce = allreduce
        self.pipeline = pipeline
        # one entry per (role, shape of the stages, T_f, which groups run forced or planned
        # schemes): capped at 100,000 entries (later ones are priced, not kept)
        self._instances: dict[tuple, InstanceEval] = {}
        self._tpot_quantile = tpot_quantile(
            ctx.problem.workload.outputs, ctx.problem.sla.attainment
        )
        # one entry per (GPU type, TP, PP): at most the cluster's GPU types x the candidates
        self._ideal_prefill: dict[tuple[str, int, int], float] = {}
        # per ``own_phases`` list, by id (the list held beside so its id stays its own): at
        # most the phase lists the all-reduce pricer keeps (``_own``'s and ``_planned``'s)
        self._traffic: dict[int, tuple[list, SharedTraffic]] = {}
        self._prompt_sample: list[float] | None = None  # prompts drawn for prefill_capacity
        # prefill_capacity per (stage count, their cost rows): a plan's groups key instances by
        # their GPUs (``_memo_instance``), so a simulator pricing 612 prefill instances of
        # one shape ran 612 identical admission loops (a quarter of its tables' time,
        # profiled). Capped at 100,000 entries (later ones are priced, not kept)
        self._capacity: dict[tuple[int, bytes], float] = {}

    def stage_parts(
        self, stages: list[list[str]], nbytes: float
    ) -> tuple[list[float], list[float]]:
        """Per stage, one all-reduce of ``nbytes``; per pair of consecutive stages, the
        pipeline hop (Eq. 6)."""
        ar = [self.allreduce.allreduce_time(s, nbytes) for s in stages]
        hops = [
            self.pipeline.pipeline_hop_time(stages[i], stages[i + 1], nbytes)
            for i in range(len(stages) - 1)
        ]
        return ar, hops

    def _memo_instance(
        self, kind: str, stages: list[list[str]], t_f: float, price: Callable[[], InstanceEval]
    ) -> InstanceEval:
        """Instances of the same shape (``shape_signature`` of their stages, in order) price
        the same: the first is priced, its twins get a copy with their own GPU names. A made
        plan's group (``plan_groups``) is priced with its own scheme, so it keys by its GPUs."""
        forced = tuple(
            tuple(s)
            if tuple(s) in self.allreduce.plan_groups
            else tuple(s) in self.allreduce.forced_ring
            for s in stages
        )
        key = (kind, self.ctx.shape(*stages), t_f, forced)
        hit = self._instances.get(key)
        if hit is None:
            hit = price()
            if len(self._instances) < 100_000:
                self._instances[key] = hit
            return hit
        return replace(hit, stages=[list(s) for s in stages])

    def prefill_instance(self, stages: list[list[str]]) -> InstanceEval:
        """A prefill instance priced (``_prefill_instance``), once per shape."""
        return self._memo_instance("p", stages, 0.0, lambda: self._prefill_instance(stages))

    def decode_instance(self, stages: list[list[str]], t_f: float) -> InstanceEval:
        """A decode instance priced at KV transfer time ``t_f`` (``_decode_instance``), once
        per shape."""
        return self._memo_instance(
            "d", stages, t_f, lambda: self.priced_decode_instance(stages, t_f)
        )

    def servers_with_kv_inside(self, util: Mapping[Edge, float]) -> set[str]:
        """The servers where a link that ``util`` loads joins two of their own nodes (a KV
        route relayed over NVLink): the only servers whose inside groups KV can slow."""
        srv = self.ctx.server_of
        return {sa for a, b in util if (sa := srv.get(a)) is not None and sa == srv.get(b)}

    def shares_kv_links(
        self, stages: list[list[str]], nbytes: float, util: Mapping[Edge, float], inside: set[str]
    ) -> bool:
        """Whether a group of ``stages`` sends all-reduce bytes over a link that ``util``
        loads (the group's own routes, chosen at ``nbytes`` if not yet: ``own_phases``). A
        group inside one server keeps its traffic inside it, so it is checked only where
        ``inside`` (``servers_with_kv_inside``) holds that server."""
        srv = self.ctx.server_of
        for s in stages:
            if len(s) < 2:
                continue
            servers = {srv.get(x) for x in s}
            if len(servers) == 1 and not servers & inside:
                continue
            for c in self.allreduce.own_phases(s, nbytes):
                if any(util.get(e, 0.0) > 0.0 for terms, _ in c.flows for e, _ in terms):
                    return True
        return False

    def _prefill_instance(self, stages: list[list[str]]) -> InstanceEval:
        """TTFT side (Eqs. 3, 5-12): a mean-length request's figures (serve time, busiest
        stage), and the rate at which the SLA's share of requests meets the TTFT bound in
        a FIFO pipeline (``prefill_times``, ``queueing.pipeline_max_rate``)."""
        m = self.ctx.model
        tp, pp = len(stages[0]), len(stages)
        co = self.ctx.coeffs(self.ctx.slowest_type([g for s in stages for g in s]))
        layer = prefill_layer_time(co, m, tp, self.ctx.mean_in, self.ctx.mean_in2)
        lps = m.layers / pp
        ar, hops = self.stage_parts(stages, self.ctx.prefill_bytes())
        stage_s = [lps * (layer + 2 * a) for a in ar]
        busy = [s + (hops[i] if i < len(hops) else 0.0) for i, s in enumerate(stage_s)]
        serve = sum(stage_s) + sum(hops)
        times = self.prefill_times(stages)
        rate = pipeline_max_rate(self.ctx.problem.sla.ttft_s, times)
        comm = sum(2 * lps * a for a in ar) + sum(hops)
        return InstanceEval(
            stages, ar, hops, m.layers * layer, comm, serve, max(busy), rate, 1, ttft=times
        )

    def prefill_times(self, stages: list[list[str]]) -> PrefillTimes:
        """Per input length of the workload, a request's time alone through the pipeline
        and at its busiest stage (one request a batch: ``queueing.pipeline_ttft_cdf``'s
        model), and the instance's saturated throughput when it holds at most PP batches
        in flight, as vLLM and SGLang run a pipeline (``prefill_capacity``)."""
        x, share = self.ctx.input_lengths
        times = self.prefill_stage_times(stages)
        per_stage = times(x, x * x)
        return PrefillTimes(
            per_stage.sum(axis=0), per_stage.max(axis=0), share, self.ctx.problem.sla.attainment,
            self.prefill_capacity(len(stages), times),
        )  # fmt: skip

    def prefill_stage_times(
        self, stages: list[list[str]]
    ) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """A function of batches (k tokens each, k2 the sum of their prompts' squares) to
        each stage's time for each (stages x batches, s), the hop to the next stage included.
        Compute is Eq. 12 at k; an all-reduce or a hop is affine in its bytes along its
        fixed route (a latency plus bytes over a bandwidth), so each is priced at the mean
        prompt and at twice it and taken on that line."""
        m = self.ctx.model
        tp, pp = len(stages[0]), len(stages)
        co = self.ctx.coeffs(self.ctx.slowest_type([g for s in stages for g in s]))
        lps = m.layers / pp
        ar1, hop1 = self.stage_parts(stages, self.ctx.activation_bytes(self.ctx.mean_in))
        ar2, hop2 = self.stage_parts(stages, self.ctx.activation_bytes(2 * self.ctx.mean_in))
        a1, a2 = np.asarray(ar1, dtype=float)[:, None], np.asarray(ar2, dtype=float)[:, None]
        h1 = np.append(np.asarray(hop1, dtype=float), 0.0)[:, None]
        h2 = np.append(np.asarray(hop2, dtype=float), 0.0)[:, None]

        def times(k: np.ndarray, k2: np.ndarray) -> np.ndarray:
            u = (np.asarray(k, dtype=float) / self.ctx.mean_in)[None, :] - 1.0  # 0 at the mean
            layer = prefill_layer_time(co, m, tp, k, k2)[None, :]
            ar = np.maximum(a1 + (a2 - a1) * u, 0.0)
            return lps * (layer + 2 * ar) + np.maximum(h1 + (h2 - h1) * u, 0.0)

        return times

    def prefill_capacity(
        self, pp: int, times: Callable[[np.ndarray, np.ndarray], np.ndarray]
    ) -> float:
        """Requests/s a ``pp``-stage instance whose stages take ``times`` (of batches:
        ``prefill_stage_times``) serves saturated as the engine admits prompts
        (``queueing.saturated_rate`` over ``PROMPT_SAMPLE`` prompts drawn from the
        workload): at most PP batches and the export's ``--max-num-seqs`` requests in
        flight, each batch up to the engine's token budget. Long prompts fill a batch
        alone, so PP stages hold PP requests and a stage idles while a longer prompt ahead
        of it runs; short ones may run out of requests before the batches fill
        (docs/planner.md, "Prefill under the engines' admission"). inf for one stage,
        where one batch at a time is the open pipeline."""
        if pp == 1:
            return math.inf
        profile = engine_profile(self.ctx.problem.options.engine or "vllm")
        if self._prompt_sample is None:
            x, share = self.ctx.input_lengths
            rng = np.random.default_rng(self.ctx.problem.options.seed)
            self._prompt_sample = x[rng.choice(len(x), size=PROMPT_SAMPLE, p=share)].tolist()
        cost = self.stage_cost(times)
        key = (pp, np.ascontiguousarray(cost, dtype=float).tobytes())
        hit = self._capacity.get(key)
        if hit is None:
            hit = saturated_rate(self._prompt_sample, cost, prefill_admission(profile, pp))
            if len(self._capacity) < 100_000:
                self._capacity[key] = hit
        return hit

    def stage_cost(self, times: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """Each stage's (a, b, c): a batch of k tokens whose prompts' squares sum to k2 takes
        a + b k + c k2 s there (``times``, ``prefill_stage_times``: Eq. 12, and the
        all-reduce and hop lines through the mean prompt and twice it, are affine in k and
        k2), read off three batches."""
        m = self.ctx.mean_in
        at = times(np.array([m, 2 * m, m]), np.array([m * m, m * m, 2 * m * m]))
        b, c = (at[:, 1] - at[:, 0]) / m, (at[:, 2] - at[:, 0]) / (m * m)
        return np.column_stack([at[:, 0] - b * m - c * m * m, b, c])

    def ideal_prefill_rate(self, gpu_type: str, tp: int, pp: int) -> float:
        """The TTFT-bound rate of a (TP, PP) prefill instance of ``gpu_type`` that only
        computes (no all-reduce, no hop), its layers evenly staged, under the engines'
        admission (``prefill_capacity``): a real instance's stages take at least as long
        each, its saturated flow shop leaves no earlier (departures are sums and maxima of
        stage times) and the pipeline's TTFT percentile falls as any time grows, so this
        bounds every real instance's rate. Memoised."""
        key = (gpu_type, tp, pp)
        hit = self._ideal_prefill.get(key)
        if hit is None:
            m, co = self.ctx.model, self.ctx.coeffs(gpu_type)
            x, share = self.ctx.input_lengths
            lps = m.layers / pp

            def compute(k: np.ndarray, k2: np.ndarray) -> np.ndarray:
                return np.repeat(lps * prefill_layer_time(co, m, tp, k, k2)[None, :], pp, axis=0)

            serve = m.layers * prefill_layer_time(co, m, tp, x, x * x)
            times = PrefillTimes(
                serve, serve / pp, share, self.ctx.problem.sla.attainment,
                self.prefill_capacity(pp, compute),
            )  # fmt: skip
            hit = self._ideal_prefill[key] = pipeline_max_rate(self.ctx.problem.sla.ttft_s, times)
        return hit

    def kv_room_bytes(self, members: Sequence[str], tp: int, pp: int) -> float:
        """Memory left per GPU for KV cache: r_frac of its memory minus its weight shard."""
        r = self.ctx.problem.options.r_frac
        weights = self.ctx.model.param_bytes / (tp * pp)
        memory = self.ctx.memory_gb
        return min(memory[x] * GB * r for x in members) - weights

    def decode_step(
        self, stages: list[list[str]], batch: int, util: Mapping[Edge, float] | None = None
    ) -> DecodeStep:
        """The step (over all stages, busiest stage, compute, comm) of a micro-batch.
        ``util``: the share of time the KV transfers alone keep each link busy (none: no
        KV traffic); a stage's all-reduces over such links are stretched as the fluid
        network shares them (``shared_allreduce``)."""
        m = self.ctx.model
        tp, pp = len(stages[0]), len(stages)
        co = self.ctx.coeffs(self.ctx.slowest_type([g for s in stages for g in s]))
        ctx = self.ctx.mean_kv_tokens
        layer = decode_layer_time(co, m, tp, batch, batch * ctx)
        lps = m.layers / pp
        nbytes = self.ctx.activation_bytes(batch)
        ar, hops = self.stage_parts(stages, nbytes)
        if util:
            ar = [
                self.shared_allreduce(s, nbytes, a, lps, layer, util)
                for s, a in zip(stages, ar, strict=True)
            ]
        stage_s = [lps * (layer + 2 * a) for a in ar]
        busy = [s + (hops[i] if i < len(hops) else 0.0) for i, s in enumerate(stage_s)]
        comm = sum(2 * lps * a for a in ar) + sum(hops)
        return DecodeStep(sum(stage_s) + sum(hops), max(busy), m.layers * layer, comm)

    def shared_allreduce(
        self,
        members: list[str],
        nbytes: float,
        alone: float,
        lps: float,
        layer: float,
        util: Mapping[Edge, float],
    ) -> float:
        """One all-reduce of a decode stage (``lps`` layers of ``layer`` seconds' compute,
        two all-reduces each, ``alone`` seconds each unshared) on links that KV transfers
        keep busy ``util[e]`` of the time: each link's seconds per byte stretched by
        ``sharing.allreduce_stretch`` of that load and of the stage's own share of its
        iteration on the link. The group's own routes (``own_phases``)."""
        phases = self.allreduce.own_phases(members, nbytes)
        if not phases:
            return alone
        hit = self._traffic.get(id(phases))
        if hit is None:  # the phases list is kept by its pattern: its id is stable
            hit = self._traffic[id(phases)] = (phases, SharedTraffic(phases))
        traffic = hit[1]
        u = np.array([util.get(e, 0.0) for e in traffic.links], dtype=float)
        if not (u > 0.0).any():
            return alone
        stage = lps * (layer + 2 * alone)
        w = 2 * lps * nbytes * traffic.per_byte / stage if stage > 0 else np.zeros(len(u))
        return traffic.time(nbytes, allreduce_stretches(u, w))

    def tpot_kv_share(self, t_f: float) -> float:
        """The KV transfer's part of a request's TPOT at the SLA percentile. DistServe and the
        simulator measure TPOT as (last token - first token) / (output tokens - 1), so T_f is
        paid once and spread over the request's output tokens; the requests that feel it most
        are the shortest, and ``attainment`` of them must meet the bound, so the share is
        T_f / q with q from ``tpot_quantile``.
        ``tpot_mode="eq4"`` charges T_f to every token, as the paper's Eq. 4 is written."""
        if t_f <= 0:
            return 0.0
        if self.ctx.problem.options.tpot_mode == "eq4":
            return t_f
        return t_f / self._tpot_quantile

    def priced_decode_instance(
        self,
        stages: list[list[str]],
        t_f: float,
        util: Mapping[Edge, float] | None = None,
        alone: int | None = None,
    ) -> InstanceEval:
        """TPOT side (Eqs. 4, 13): the largest batch whose step time plus the KV transfer's
        share (``tpot_kv_share``) meets the TPOT bound and whose KV cache fits; ``pp``
        micro-batches are in flight. Rate in requests/s: batch / (busiest stage * decode steps
        per request), a request's decode steps being its output tokens after the first
        (``Workload.mean_decode_steps``: prefill makes the first). ``util``: the KV
        transfers' load on each link (``decode_step``). ``alone``: the batch the instance
        takes at the same ``t_f`` without ``util``; shared links only lengthen a step, so the
        batch under ``util`` is at most that, and is that whenever it still meets the bound
        (one step priced instead of a search: ``PhasePricer.contend_decode`` prices every
        deployed instance again at every rate ``deployment.settle_kv`` tries)."""
        tp, pp = len(stages[0]), len(stages)
        ctx = self.ctx.mean_kv_tokens
        room = self.kv_room_bytes([g for s in stages for g in s], tp, pp)
        b_mem = int(room * tp / (ctx * self.ctx.model.kv_bytes_per_token())) if room > 0 else 0
        b_max = min(b_mem, self.ctx.problem.options.max_batch)
        bound = self.ctx.problem.sla.tpot_s
        kv = self.tpot_kv_share(t_f)

        steps: dict[int, DecodeStep] = {}  # batch -> decode_step

        def step_of(b: int) -> DecodeStep:
            if b not in steps:
                steps[b] = self.decode_step(stages, b, util)
            return steps[b]

        def ok(b: int) -> bool:
            return step_of(b).step_s + kv <= bound

        if alone is not None and 1 <= alone <= b_max and ok(alone):
            lo = hi = alone
        elif b_max < 1 or not ok(1):
            s = step_of(1)
            return InstanceEval(
                stages, [], [], s.compute_s, s.comm_s, s.step_s, s.busiest_s, 0.0, 0, s.step_s + kv
            )
        else:
            lo, hi = 1, b_max if alone is None else min(b_max, max(1, alone - 1))
        while lo < hi:  # largest b with ok(b): step time grows with b
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        s = step_of(lo)
        ar, hops = self.stage_parts(stages, self.ctx.activation_bytes(lo))
        rate = lo / (s.busiest_s * self.ctx.decode_steps)
        return InstanceEval(
            stages, ar, hops, s.compute_s, s.comm_s, s.step_s, s.busiest_s, rate, lo, s.step_s + kv
        )


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
