"""The colocated simulator's event loop: passes through pipelines, node batching, activation
transfers and KV-cache preemption.

A request's passes flow through its pipeline: one prefill pass (its prompt, or prompt plus
the tokens made so far after a preemption), then one decode pass per output token. When the
last stage finishes a pass the token is out and the next decode pass starts at the first
stage.

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
the tokens it made. Admission: per-request pipelines are dispatched from the coordinator's
queue when ``routing.py`` finds one that fits; fixed replicas admit FCFS while the prompt's
KV fits on every stage and the replica runs fewer than ``max_batch`` requests per stage
(vLLM, one virtual engine per pipeline stage).

Holds :class:`ColocatedSim` (one run) and :func:`simulate_colocated` (price and run).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from typing import Any

import networkx as nx

from controller.errors import InputError
from controller.plan import Plan
from controller.related.colocated.model import (
    ColocatedModel,
    RequestState,
    SimNode,
    Stage,
    build_colocated,
)
from controller.related.colocated.options import ColocatedOptions
from controller.related.colocated.results import ColocatedResult, colocated_result
from controller.related.colocated.routing import FlowRouter, ReplicaRouter, Router
from controller.workload import Request, Workload


class ColocatedSim:
    """One run: ``ColocatedSim(model, options).run(requests)`` -> :class:`ColocatedResult`."""

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
            FlowRouter(m, self.rng, sched)
            if sched in ("iwrr", "swarm")
            else ReplicaRouter(m, self.rng, sched)
        )
        self.reqs = [RequestState(i, r) for i, r in enumerate(requests)]
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
        return colocated_result(
            m,
            self.o,
            self.reqs,
            emitted=self.emitted,
            now=self.now,
            last_wait=self.last_wait,
            preemptions=self.preemptions,
            rep_last=self.rep_last,
            wall=time.perf_counter() - t0,
            events=n_events,
        )

    # -- admission ------------------------------------------------------------------------
    def _arrive(self, r: RequestState) -> None:
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

    def _start(self, r: RequestState, pipe: list[Stage]) -> None:
        r.pipe = pipe
        r.kv = [0] * len(pipe)
        self.admissions += 1
        r.admit = self.admissions
        for i, _, _ in pipe:
            self.m.nodes[i].residents.add(r.id)
        tokens = r.inp + r.gen
        self._enqueue(pipe[0][0], (r.id, r.epoch, 0, tokens, 0, True))

    def _release(self, r: RequestState) -> None:
        nodes = self.m.nodes
        for s, (i, lo, hi) in enumerate(r.pipe):
            n = nodes[i]
            n.kv_used -= r.kv[s] * n.kv_bpt_layer * (hi - lo)
            n.residents.discard(r.id)
            if r.est:
                n.kv_est -= r.est[s]
        r.kv, r.est = [], []

    def _after_release(self, r: RequestState) -> None:
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

    def _miss(self, r: RequestState) -> None:
        if not r.missed:
            r.missed = True
            self.misses += 1

    def _token(self, r: RequestState) -> None:
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


def simulate_colocated(
    plan: Plan,
    cluster: nx.Graph,
    workload: Workload,
    requests: list[Request],
    options: ColocatedOptions | None = None,
) -> ColocatedResult:
    """Price ``plan`` on ``cluster`` and run ``requests`` through it."""
    return ColocatedSim(build_colocated(plan, cluster, workload), options).run(requests)
