"""Simulator of colocated plans (``Plan.layout == "colocated"``, the seed planners): prefill
and decode of a request run on the same GPUs, as vLLM serves them (docs/related-planners.md).

A *node* is a tensor-parallel group holding layers [start, end). Every request gets a
*pipeline*: a list of (node, lo, hi) stages covering the model's layers in order, either its
own (Helix's per-request pipelines through the max-flow graph, picked by IWRR or Swarm's
rule) or a fixed replica's (picked by a request mapper). A request's passes flow through its
pipeline: one prefill pass (its prompt, or prompt plus the tokens made so far after a
preemption), then one decode pass per output token. When the last stage finishes a pass the
token is out and the next decode pass starts at the first stage.

Nodes batch dynamically (Helix §5.1, vLLM's continuous batching): when a node is free it takes
the decode passes waiting, first come first served, up to ``max_batch`` (vLLM's max_num_seqs),
then waiting prefill passes up to ``prefill_token_budget`` prompt tokens (vLLM's
max_num_batched_tokens; at least one), and runs one iteration: Eqs. 12-13 mixed over its layers
plus its TP all-reduces (``controller.related.perf``), segment by segment when passes infer
different layer ranges (partial inference). Activations between stages are one transfer per
destination node per iteration over the best route, each directed link a FIFO at the route's
bottleneck rate (Helix's case study: requests queue up on slow links); coordinator messages
(4-byte token ids) cost nothing.

KV cache: a pass adds its new tokens' KV on its node; a node whose KV passes its room preempts
its most recently admitted request, vLLM's recompute: the request's KV is dropped on
every node, it goes back to the head of its queue and later redoes a prefill of its prompt and
the tokens it made. Admission: per-request pipelines reserve Helix's estimate (prompt plus mean
output) and skip nodes above the high-water mark; fixed replicas admit FCFS while the prompt's
KV fits on every stage and the replica runs fewer than ``max_batch`` requests per stage (vLLM,
one virtual engine per pipeline stage).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from controller.errors import InputError
from controller.models import model_spec
from controller.plan import ColocatedPlan, Plan
from controller.related.costeff_configs import workload_class
from controller.related.perf import LengthStats, NodeHW, PerfModel, node_hw
from controller.sim.metrics import percentiles
from controller.workload import Request, Workload

SOURCE = "source"
IWRR_MAX_WEIGHT = 100  # flows become integer IWRR weights of at most this (1% resolution)


@dataclass(frozen=True)
class ColocatedOptions:
    prefill_token_budget: int = 2048  # vLLM's max_num_batched_tokens
    seed: int = 0  # ties in the Swarm and mapper policies, output-length predictions
    vllm_watermark: float = 0.01  # vLLM admits a prompt only if this share of KV stays free
    window_after_s: float = 0.0  # throughput window starts after this (warm-up), s
    # stop at this simulated time (offline throughput: the window ends here); None: run until
    # every request has finished
    horizon_s: float | None = None
    # stop once this many requests are sure to miss the SLA (TTFT at their first token, TPOT
    # at their last): the attainment is then known to be below 1 - stop_misses / requests,
    # which is all a search for the SLA-meeting rate asks of an overloaded point. None: run on
    stop_misses: int | None = None


# -- the plan, priced ------------------------------------------------------------------------
@dataclass
class SimNode:
    index: int
    name: str
    hw: NodeHW
    start: int
    end: int
    tokens_per_s: float
    kv_cap: float  # bytes of KV room
    kv_bpt_layer: float  # KV bytes per token per layer
    queue: deque = field(default_factory=deque)  # decode passes waiting
    prefills: deque = field(default_factory=deque)  # prefill passes waiting
    busy: bool = False
    kv_used: float = 0.0
    kv_est: float = 0.0  # Helix's estimates of the requests routed here
    residents: set = field(default_factory=set)
    busy_s: float = 0.0
    iterations: int = 0


@dataclass
class ColocatedModel:
    plan: Plan
    cluster: nx.Graph
    perf: PerfModel
    nodes: list[SimNode]
    by_name: dict[str, int]
    stats: LengthStats
    _paths: dict[tuple[int, int], tuple[tuple[tuple[str, str], ...], float, float]] = field(
        default_factory=dict
    )

    @property
    def col(self) -> ColocatedPlan:
        assert self.plan.colocated is not None
        return self.plan.colocated

    @property
    def gpus_used(self) -> int:
        return sum(n.hw.tp for n in self.nodes)

    def path(self, a: int, b: int) -> tuple[tuple[tuple[str, str], ...], float, float]:
        """(directed links, bottleneck bytes/s, latency s) from node a to node b."""
        key = (a, b)
        hit = self._paths.get(key)
        if hit is None:
            conn = self.perf.connection(self.nodes[a].hw, self.nodes[b].hw)
            if conn is None:
                raise InputError(f"no route from {self.nodes[a].name} to {self.nodes[b].name}")
            links = tuple(zip(conn.path, conn.path[1:], strict=False))
            hit = self._paths[key] = (links, conn.bandwidth, conn.latency_s)
        return hit


def build_colocated(plan: Plan, g: nx.Graph, workload: Workload) -> ColocatedModel:
    """Price a colocated plan on cluster ``g``; InputError when it does not fit the cluster."""
    col = plan.colocated
    if plan.layout != "colocated" or col is None:
        raise InputError("not a colocated plan (layout must be 'colocated' with its nodes)")
    if not col.nodes:
        raise InputError("colocated plan has no node")
    model = model_spec(plan.model)
    for n in col.nodes:
        for x in n.gpus:
            if x not in g or g.nodes[x].get("kind") != "gpu":
                raise InputError(f"plan node {n.name} names GPU {x!r}, not in cluster {g.name!r}")
        if not 0 <= n.start < n.end <= model.layers:
            raise InputError(
                f"plan node {n.name} holds layers [{n.start}, {n.end}) of {model.layers}"
            )
    seen: set[str] = set()
    for x in plan.all_gpus():
        if x in seen:
            raise InputError(f"GPU {x} is in two nodes of the plan")
        seen.add(x)
    params = col.params
    perf = PerfModel(
        g,
        model,
        r_frac=float(params.get("r_frac", 0.9)),
        max_batch=int(params.get("max_batch", 512)),
    )
    nodes = []
    for k, n in enumerate(col.nodes):
        hw = node_hw(g, n.gpus)
        layers = n.end - n.start
        room = perf.kv_room(hw, layers)
        if room <= 0:
            raise InputError(f"plan node {n.name}: layers [{n.start}, {n.end}) leave no KV room")
        nodes.append(
            SimNode(k, n.name, hw, n.start, n.end, n.tokens_per_s, room, perf.kv_bytes_per_token(1))
        )
    by_name = {n.name: n.index for n in nodes}
    if len(by_name) != len(nodes):
        raise InputError("node names of the plan are not unique")
    for f in col.flows:
        for end in (f.src, f.dst):
            if end not in by_name and end not in (SOURCE, "sink"):
                raise InputError(f"plan flow {f.src}->{f.dst} names an unknown node {end!r}")
    for r in col.replicas:
        if not r.nodes or any(x not in by_name for x in r.nodes):
            raise InputError(f"plan replica {r.nodes} names an unknown node")
        cover = 0
        for x in r.nodes:
            nd = nodes[by_name[x]]
            if nd.start > cover or nd.end <= cover:
                raise InputError(f"plan replica {r.nodes} does not cover the layers in order")
            cover = nd.end
        if cover != model.layers:
            raise InputError(f"plan replica {r.nodes} stops at layer {cover} of {model.layers}")
    if not col.replicas and not any(f.src == SOURCE and f.flow > 0 for f in col.flows):
        raise InputError("colocated plan has neither replicas nor flow out of the coordinator")
    stats = LengthStats.of(workload.inputs, workload.outputs)
    return ColocatedModel(plan, g, perf, nodes, by_name, stats)


# -- request routing ---------------------------------------------------------------------------
class IWRR:
    """Interleaved weighted round-robin: in round r every candidate whose weight is at least r
    gets one turn, so each is picked in proportion to its weight without bursts."""

    def __init__(self, candidates: Sequence[Any], weights: Sequence[int]) -> None:
        if not candidates or len(candidates) != len(weights) or min(weights) < 1:
            raise ValueError("IWRR needs candidates with weights of at least 1")
        self.order = [
            c
            for r in range(1, max(weights) + 1)
            for c, w in zip(candidates, weights, strict=True)
            if w >= r
        ]
        self.pos = 0

    def pick(self, ok: Callable[[Any], bool] | None = None) -> Any:
        """The next candidate (skipping those ``ok`` rejects), or None after a full cycle."""
        n = len(self.order)
        for _ in range(n):
            c = self.order[self.pos]
            self.pos = (self.pos + 1) % n
            if ok is None or ok(c):
                return c
        return None


def integer_weights(values: Sequence[float]) -> list[int]:
    """Positive reals as IWRR weights: proportional, the largest IWRR_MAX_WEIGHT, each >= 1."""
    top = max(values)
    return [max(1, round(IWRR_MAX_WEIGHT * v / top)) for v in values]


Stage = tuple[int, int, int]  # (node index, first layer, end layer) of a pipeline


class _Req:
    __slots__ = (
        "id", "inp", "out", "arrival", "first", "finish", "gen", "pipe", "epoch", "kv",
        "est", "admit", "replica", "cls", "pred_out", "work", "missed",
    )  # fmt: skip

    def __init__(self, i: int, r: Request) -> None:
        self.id = i
        self.inp = r.input_tokens
        self.out = max(1, r.output_tokens)
        self.arrival = r.arrival_s
        self.first = math.nan
        self.finish = math.nan
        self.gen = 0  # output tokens made
        self.pipe: list[Stage] = []
        self.epoch = 0  # bumped by a preemption: passes of an older epoch are dropped
        self.kv: list[int] = []  # tokens of KV held at each stage
        self.est: list[float] = []  # Helix: estimated KV bytes reserved at each stage
        self.admit = 0  # admission order (the newest is preempted first)
        self.replica = -1
        self.cls = ""
        self.pred_out = 0.0
        self.work = 0.0  # the mapper's workload of this request on its instance
        self.missed = False  # known to miss the SLA (ColocatedOptions.stop_misses)


class Router:
    """Picks pipelines. ``per_request``: a pipeline per request, dispatched from the
    coordinator's queue when one fits; else fixed replicas, each with its own FCFS queue."""

    per_request = True

    def __init__(self, sim: ColocatedSim) -> None:
        self.sim = sim

    def route(self, r: _Req) -> list[Stage] | None:
        raise NotImplementedError

    def replica(self, r: _Req) -> int:
        raise NotImplementedError

    def done(self, r: _Req) -> None:
        """A request finished (or was preempted): release what the policy books."""


class FlowRouter(Router):
    """Helix (IWRR over the max-flow solution) or Swarm (the least loaded next node per unit
    of throughput). Both mask nodes whose estimated KV use would pass the high-water mark."""

    def __init__(self, sim: ColocatedSim, policy: str) -> None:
        super().__init__(sim)
        m = sim.m
        self.policy = policy
        self.high = float(m.col.params.get("high_water", 1.0))
        self.L = m.perf.model.layers
        succ: dict[str, list[tuple[str, float]]] = {}
        for f in m.col.flows:
            if f.dst == "sink":
                continue
            if policy == "iwrr" and f.flow <= 0:
                continue
            succ.setdefault(f.src, []).append((f.dst, f.flow))
        self.succ = {
            v: [m.by_name[d] for d, _ in c] for v, c in succ.items()
        }  # vertex -> node indices
        self.iwrr = {
            v: IWRR([m.by_name[d] for d, _ in c], integer_weights([w for _, w in c]))
            for v, c in succ.items()
            if policy == "iwrr"
        }
        self.mean_out = m.stats.mean_out

    def _fits(self, r: _Req, node: SimNode, lo: int, hi: int) -> bool:
        est = (r.inp + max(self.mean_out, r.gen + 1)) * node.kv_bpt_layer * (hi - lo)
        return node.kv_est + est <= self.high * node.kv_cap

    def route(self, r: _Req) -> list[Stage] | None:
        nodes = self.sim.m.nodes
        covered, v, pipe = 0, SOURCE, []
        while covered < self.L:

            def ok(i: int, covered: int = covered) -> bool:
                n = nodes[i]
                return n.start <= covered < n.end and self._fits(r, n, covered, n.end)

            if self.policy == "iwrr":
                it = self.iwrr.get(v)
                i = it.pick(ok) if it is not None else None
            else:
                cands = [i for i in self.succ.get(v, []) if ok(i)]
                i = min(
                    cands,
                    key=lambda i: ((len(nodes[i].residents) + 1) / max(nodes[i].tokens_per_s, 1e-9),
                                   self.sim.rng.random()),
                ) if cands else None  # fmt: skip
            if i is None:
                return None
            n = nodes[i]
            pipe.append((i, covered, n.end))
            covered = n.end
            v = n.name
        return pipe


class ReplicaRouter(Router):
    """Fixed replicas picked by a mapper: ``rr``, ``wrr`` (weights: ``params['weights']``,
    else the replicas' predicted rates), ``si`` (every request to the first replica),
    ``assignment`` (the cost-efficiency planner's shares per workload class, IWRR within a
    class) or the heterogeneous paper's workload mappers ``os`` and ``mb``
    (``controller.related.hetero_mapper``)."""

    per_request = False

    def __init__(self, sim: ColocatedSim, policy: str) -> None:
        super().__init__(sim)
        m = sim.m
        col = m.col
        self.policy = policy
        self.pipes = []
        for rep in col.replicas:
            pipe, covered = [], 0
            for x in rep.nodes:
                i = m.by_name[x]
                pipe.append((i, covered, m.nodes[i].end))
                covered = m.nodes[i].end
            self.pipes.append(pipe)
        n = len(self.pipes)
        self.rr = 0
        if policy == "wrr":
            w = col.params.get("weights") or [rep.rate for rep in col.replicas]
            if len(w) != n or min(w) <= 0:
                raise InputError("wrr needs one positive weight per replica")
            self.iwrr = IWRR(list(range(n)), integer_weights(w))
        elif policy == "assignment":
            self.classes = _classes(col.params)
            self.by_cls = {}
            for c in self.classes:
                share = [rep.share.get(c, 0.0) for rep in col.replicas]
                idx = [k for k in range(n) if share[k] > 0]
                if idx:
                    self.by_cls[c] = IWRR(idx, integer_weights([share[k] for k in idx]))
        elif policy in ("os", "mb"):
            from controller.related.hetero_mapper import Mapper

            self.mapper = Mapper.from_params(col.params, n, policy, sim.rng)
        elif policy not in ("rr", "si"):
            raise InputError(f"unknown request mapper {policy!r}")

    def replica(self, r: _Req) -> int:
        p = self.policy
        if p == "rr":
            k = self.rr
            self.rr = (self.rr + 1) % len(self.pipes)
            return k
        if p == "si":
            return 0
        if p == "wrr":
            return self.iwrr.pick()
        if p == "assignment":
            r.cls = workload_class(r.inp, r.out)
            it = self.by_cls.get(r.cls)
            if it is None:  # a class the planner saw no request of: the largest replica
                return max(range(len(self.pipes)), key=lambda k: self.sim.m.col.replicas[k].rate)
            return it.pick()
        k, r.work, r.pred_out = self.mapper.assign(r.inp)
        return k

    def done(self, r: _Req) -> None:
        if self.policy in ("os", "mb") and r.replica >= 0 and r.work:
            self.mapper.release(r.replica, r.work, r.inp, r.pred_out)
            r.work = 0.0


def _classes(params: dict) -> list[str]:
    return list(params.get("classes", {}).keys())


# -- the simulation ------------------------------------------------------------------------------
@dataclass
class ColocatedResult:
    requests: int
    finished: int
    offered_rate: float
    duration_s: float
    gpus_used: int
    sla: dict[str, float]
    attainment: float
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    e2e_s: dict[str, float]
    throughput_rps: float  # finished requests / (last finish - first arrival)
    tokens_per_s: float  # prompt and output tokens processed per second over the run
    decode_tokens_per_s: float  # output tokens per second over the run
    # output tokens/s from ``window_after_s`` until the horizon (or while requests still waited)
    window_decode_tokens_per_s: float
    preemptions: int
    node_util: dict[str, float]
    replica_last_finish_s: list[float]
    events: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ColocatedSim:
    def __init__(self, model: ColocatedModel, options: ColocatedOptions | None = None) -> None:
        self.m = model
        self.o = options or ColocatedOptions()
        if self.o.prefill_token_budget < 1:
            raise InputError("prefill token budget must be at least 1")

    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def run(self, requests: list[Request]) -> ColocatedResult:
        if not requests:
            raise InputError("no requests to simulate")
        t0 = time.perf_counter()
        m = self.m
        for n in m.nodes:
            n.queue.clear()
            n.prefills.clear()
            n.busy, n.kv_used, n.kv_est, n.busy_s, n.iterations = False, 0.0, 0.0, 0.0, 0
            n.residents.clear()
        self.rng = random.Random(self.o.seed)
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.link_free: dict[tuple[str, str], float] = {}
        sched = m.col.scheduler
        self.router: Router = (
            FlowRouter(self, sched) if sched in ("iwrr", "swarm") else ReplicaRouter(self, sched)
        )
        self.reqs = [_Req(i, r) for i, r in enumerate(requests)]
        self.waiting: deque = deque()  # the coordinator's queue (per-request pipelines)
        n_rep = len(m.col.replicas)
        self.rep_queue = [deque() for _ in range(n_rep)]
        self.rep_running = [0] * n_rep
        self.rep_last = [0.0] * n_rep
        self.admissions = 0
        self.preemptions = 0
        self.done_n = 0
        self.misses = 0
        sla = m.plan.sla
        self.ttft_bound, self.tpot_bound = float(sla.ttft_s), float(sla.tpot_s)
        stop = math.inf if self.o.stop_misses is None else self.o.stop_misses
        self.emitted: list[float] = []
        self.last_wait = 0.0  # when the last request left a queue
        for r in sorted(self.reqs, key=lambda r: r.arrival):
            self._push(r.arrival, 0, r)
        n_events = 0
        horizon = math.inf if self.o.horizon_s is None else self.o.horizon_s
        while self.events and self.misses < stop:
            t, _, kind, payload = heapq.heappop(self.events)
            if t > horizon:
                self.now = horizon
                break
            self.now = t
            n_events += 1
            if kind == 0:
                self._arrive(payload)
            elif kind == 1:
                self._iteration_done(*payload)
            else:
                self._deliver(*payload)
        return self._result(time.perf_counter() - t0, n_events)

    # -- admission ------------------------------------------------------------------------
    def _arrive(self, r: _Req) -> None:
        if self.router.per_request:
            self.waiting.append(r)
            self._dispatch()
        else:
            k = self.router.replica(r)
            r.replica = k
            self.rep_queue[k].append(r)
            self._admit(k)

    def _dispatch(self) -> None:
        """Helix's coordinator: route the queue's head while a pipeline fits (FCFS)."""
        while self.waiting:
            r = self.waiting[0]
            pipe = self.router.route(r)
            if pipe is None:
                return
            self.waiting.popleft()
            r.est = []
            for i, lo, hi in pipe:
                n = self.m.nodes[i]
                e = (r.inp + max(self.m.stats.mean_out, r.gen + 1)) * n.kv_bpt_layer * (hi - lo)
                n.kv_est += e
                r.est.append(e)
            self._start(r, pipe)
            self.last_wait = self.now

    def _admit(self, k: int) -> None:
        """vLLM's admission on replica ``k``: FCFS while the head's prompt KV fits on every
        stage (keeping the watermark free) and fewer than max_batch requests run."""
        q = self.rep_queue[k]
        pipe = self.router.pipes[k]  # type: ignore[attr-defined]
        nodes = self.m.nodes
        free = 1.0 - self.o.vllm_watermark
        # vLLM runs max_num_seqs requests per virtual engine, one engine per pipeline stage
        while q and self.rep_running[k] < self.m.perf.max_batch * len(pipe):
            r = q[0]
            need = r.inp + r.gen + 1
            for i, lo, hi in pipe:
                n = nodes[i]
                if n.kv_used + need * n.kv_bpt_layer * (hi - lo) > free * n.kv_cap and n.residents:
                    return
            q.popleft()
            self.rep_running[k] += 1
            self._start(r, pipe)
            self.last_wait = self.now

    def _start(self, r: _Req, pipe: list[Stage]) -> None:
        r.pipe = pipe
        r.kv = [0] * len(pipe)
        self.admissions += 1
        r.admit = self.admissions
        for i, _, _ in pipe:
            self.m.nodes[i].residents.add(r.id)
        tokens = r.inp + r.gen
        self._enqueue(pipe[0][0], (r.id, r.epoch, 0, tokens, 0, True))

    def _release(self, r: _Req) -> None:
        nodes = self.m.nodes
        for s, (i, lo, hi) in enumerate(r.pipe):
            n = nodes[i]
            n.kv_used -= r.kv[s] * n.kv_bpt_layer * (hi - lo)
            n.residents.discard(r.id)
            if r.est:
                n.kv_est -= r.est[s]
        r.kv, r.est = [], []

    def _after_release(self, r: _Req) -> None:
        self.router.done(r)
        if self.router.per_request:
            self._dispatch()
        else:
            self.rep_running[r.replica] -= 1
            self._admit(r.replica)

    def _preempt(self, node: SimNode) -> None:
        """vLLM's recompute preemption of the node's most recently admitted request."""
        victim = max((self.reqs[x] for x in node.residents), key=lambda r: r.admit)
        self._release(victim)
        victim.epoch += 1
        victim.pipe = []
        self.preemptions += 1
        if self.router.per_request:
            self.router.done(victim)
            self.waiting.appendleft(victim)
            self._dispatch()
        else:
            self.rep_running[victim.replica] -= 1
            self.rep_queue[victim.replica].appendleft(victim)
            self._admit(victim.replica)

    # -- nodes ----------------------------------------------------------------------------
    def _enqueue(self, i: int, p: tuple) -> None:
        n = self.m.nodes[i]
        (n.prefills if p[5] else n.queue).append(p)
        if not n.busy:
            self._begin(n)

    def _begin(self, n: SimNode) -> None:
        """Take the node's batch and start an iteration (see the module docstring)."""
        reqs = self.reqs
        taken = []
        prompt = 0
        budget = self.o.prefill_token_budget
        most = self.m.perf.max_batch  # vLLM's max_num_seqs per iteration
        q = n.queue
        while q and len(taken) < most:  # decode passes first come, first served
            p = q.popleft()
            if p[1] == reqs[p[0]].epoch:  # else a pass of a preempted request
                taken.append(p)
        q = n.prefills
        while q:  # prompts up to the token budget (at least one)
            p = q[0]
            if p[1] != reqs[p[0]].epoch:
                q.popleft()
                continue
            if prompt and prompt + p[3] > budget:
                break
            prompt += p[3]
            taken.append(q.popleft())
        if not taken:
            return
        # per layer range (lo, hi) at this node: k_in, k_in2, batch, k_ctx
        groups: dict[tuple[int, int], list[float]] = {}
        for rid, _, s, tokens, ctx, pre in taken:
            r = reqs[rid]
            _, lo, hi = r.pipe[s]
            acc = groups.setdefault((lo, hi), [0.0, 0.0, 0.0, 0.0])
            if pre:
                acc[0] += tokens
                acc[1] += float(tokens) * tokens
            else:
                acc[2] += 1
                acc[3] += ctx + 1
            r.kv[s] += tokens
            n.kv_used += tokens * n.kv_bpt_layer * (hi - lo)
        dur = self._iteration_time(n, groups)
        n.busy = True
        n.busy_s += dur
        n.iterations += 1
        self._push(self.now + dur, 1, (n, taken))
        while n.kv_used > n.kv_cap and len(n.residents) > 1:
            self._preempt(n)

    def _iteration_time(self, n: SimNode, groups: dict[tuple[int, int], list[float]]) -> float:
        perf = self.m.perf
        if len(groups) == 1:
            ((lo, hi), a), = groups.items()  # fmt: skip
            return perf.step_time(n.hw, hi - lo, a[0], a[1], a[2], a[3])
        cuts = sorted({x for lo, hi in groups for x in (lo, hi)})
        t = 0.0
        for a, b in zip(cuts, cuts[1:], strict=False):
            s = [0.0, 0.0, 0.0, 0.0]
            for (lo, hi), acc in groups.items():
                if lo <= a and b <= hi:
                    for k in range(4):
                        s[k] += acc[k]
            if s[0] or s[2]:
                t += perf.step_time(n.hw, b - a, s[0], s[1], s[2], s[3])
        return t

    def _iteration_done(self, n: SimNode, taken: list) -> None:
        # the node stays busy while its passes move on, so that the passes coming back to it
        # (the next token of a one-node pipeline) wait for its next batch
        reqs = self.reqs
        forward: dict[int, list] = {}
        for p in taken:
            rid, epoch, s, tokens, ctx, pre = p
            r = reqs[rid]
            if epoch != r.epoch:
                continue
            if s + 1 < len(r.pipe):
                forward.setdefault(r.pipe[s + 1][0], []).append(
                    (rid, epoch, s + 1, tokens, ctx, pre)
                )
            else:
                self._token(r)
        for dst, passes in forward.items():
            self._send(n.index, dst, passes)
        n.busy = False
        if n.queue or n.prefills:
            self._begin(n)

    def _send(self, src: int, dst: int, passes: list) -> None:
        links, bw, lat = self.m.path(src, dst)
        nbytes = sum(p[3] for p in passes) * self.m.perf.activation_bytes
        dur = nbytes / bw if math.isfinite(bw) else 0.0
        start = self.now
        for e in links:
            start = max(start, self.link_free.get(e, 0.0))
        for e in links:
            self.link_free[e] = start + dur
        self._push(start + dur + lat, 2, (dst, passes))

    def _deliver(self, dst: int, passes: list) -> None:
        n = self.m.nodes[dst]
        for p in passes:
            (n.prefills if p[5] else n.queue).append(p)
        if not n.busy:
            self._begin(n)

    def _miss(self, r: _Req) -> None:
        if not r.missed:
            r.missed = True
            self.misses += 1

    def _token(self, r: _Req) -> None:
        """The last stage finished a pass: one more output token."""
        r.gen += 1
        self.emitted.append(self.now)
        if r.gen == 1:
            r.first = self.now
            if self.now - r.arrival > self.ttft_bound:
                self._miss(r)
        if r.gen >= r.out:
            r.finish = self.now
            if r.out > 1 and (self.now - r.first) / (r.out - 1) > self.tpot_bound:
                self._miss(r)
            self.done_n += 1
            if r.replica >= 0:
                self.rep_last[r.replica] = max(self.rep_last[r.replica], self.now)
            self._release(r)
            self._after_release(r)
            return
        self._enqueue(r.pipe[0][0], (r.id, r.epoch, 0, 1, r.inp + r.gen - 1, False))

    # -- results --------------------------------------------------------------------------
    def _result(self, wall: float, events: int) -> ColocatedResult:
        m = self.m
        arr = np.array([r.arrival for r in self.reqs])
        first = np.array([r.first for r in self.reqs])
        fin = np.array([r.finish for r in self.reqs])
        out = np.array([r.out for r in self.reqs], dtype=float)
        inp = np.array([r.inp for r in self.reqs], dtype=float)
        done = ~np.isnan(fin)
        ttft = first - arr
        tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), 0.0)
        sla = m.plan.sla.to_dict()
        ok = done & (ttft <= sla["ttft_s"]) & (tpot <= sla["tpot_s"])
        t0 = float(arr.min())
        t1 = float(np.nanmax(fin)) if done.any() else self.now
        span = max(t1 - t0, 1e-12)
        n = len(arr)
        arr_span = float(arr.max() - t0)
        em = np.asarray(self.emitted)
        w0 = t0 + self.o.window_after_s
        w1 = self.now if self.o.horizon_s is not None else max(self.last_wait, w0)
        window = (
            float(np.count_nonzero((em >= w0) & (em <= w1)) / (w1 - w0)) if w1 > w0 else math.nan
        )
        return ColocatedResult(
            requests=n,
            finished=int(done.sum()),
            offered_rate=(n - 1) / arr_span if arr_span > 0 else math.inf,
            duration_s=span,
            gpus_used=m.gpus_used,
            sla=sla,
            attainment=float(ok.mean()),
            ttft_s=percentiles(ttft[done]),
            tpot_s=percentiles(tpot[done & (out > 1)]),
            e2e_s=percentiles((fin - arr)[done]),
            throughput_rps=float(done.sum()) / span,
            tokens_per_s=float(np.sum((inp + out)[done])) / span,
            decode_tokens_per_s=float(em.size) / span,
            window_decode_tokens_per_s=window,
            preemptions=self.preemptions,
            node_util={x.name: x.busy_s / span for x in m.nodes},
            replica_last_finish_s=[x - t0 if x else math.nan for x in self.rep_last],
            events=events,
            wall_s=wall,
        )


def simulate_colocated(
    plan: Plan,
    cluster: nx.Graph,
    workload: Workload,
    requests: list[Request],
    options: ColocatedOptions | None = None,
) -> ColocatedResult:
    return ColocatedSim(build_colocated(plan, cluster, workload), options).run(requests)
