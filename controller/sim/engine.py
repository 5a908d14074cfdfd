"""The discrete-event simulator of a disaggregated cluster running a plan (docs/design.md §7).

Holds :class:`Simulator` (one run: the event loop, arrivals, prefill instances, and every
stage iteration over the fluid network) and the prefill instances' run state. The decode
side (KV transfers, continuous batching, preemption) is :class:`~controller.sim.decode.
DecodeSide`, a base of :class:`Simulator`; the settings are :class:`~controller.sim.options.
SimOptions`.

A heap of events in simulated seconds. Requests arrive (Poisson, gamma or a trace), queue FCFS
at the prefill instance with the least work and are admitted in batches (``_admit``, by
``SimOptions.prefill_admission``: when the first stage is free, everything waiting up to the
token budget; or as vLLM's engine admits under the export's request limit). Batches flow
through the instance's pipeline stages; when the last stage finishes, the first token is out
(TTFT; the KV transfer is not part of it, as in the planner's Eq. 3) and the request's KV
cache moves to the decode instance with the most room (``decode.py``). Every stage
iteration is an activity of the fluid network (``network.py``): its compute time (Eqs. 12-13)
plus the 2 L/P_pipe all-reduces of its layers over the links of the policy in use (the
plan's, or the online scheduler's choice, ``scheduler.py``) plus the pipeline hop (Eq. 6).

With ``SimOptions.shortcuts`` (the default) decode steps run as whole passes with lazy ends
(``decode.py``); ``--exact`` turns the shortcuts off.

Each request's TPOT is (last token - first token) / (output tokens - 1): it includes the KV
transfer once, spread over the tokens (the planner's Eq. 4 charges T_f to every token, an upper
bound; the low-load test compares each term with the cost model separately).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from controller.costmodel.prefill_pool import ROUTE_ALL_MAX
from controller.errors import InputError
from controller.models.engines import engine_profile, prefill_admission
from controller.sim.decode import DecodeSide
from controller.sim.flows import Work
from controller.sim.metrics import RunRecord, SimResult, summarise
from controller.sim.model import CommOption, InstanceModel, PlanModel, StageModel
from controller.sim.network import Activity, FluidNetwork
from controller.sim.options import SimOptions
from controller.sim.scheduler import GroupSchedulers
from controller.workload import Request


@dataclass
class _PrefillState:
    """A prefill instance during a run: its FCFS queue, stage inboxes, what it holds in flight
    and its routing load."""

    model: InstanceModel
    queue: deque = field(default_factory=deque)
    inbox: list[deque] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    max_batches: float = 1  # batches in flight at most (engine admission: vLLM's PP)
    max_requests: float = 1  # requests in flight at most (engine admission: --max-num-seqs)
    budget: int = 1  # prompt tokens per batch at most (max_num_batched_tokens)
    requests: int = 0  # requests admitted, not yet out of the last stage
    batches: int = 0  # batches admitted, not yet out of the last stage
    work_tokens: float = 0.0  # tokens queued or in flight (the routing load)
    speed: float = 1.0  # seconds per token when alone (routing weight)


def route_draws(seed: int, side: int, requests: int, instances: int, choices: int) -> np.ndarray:
    """Each request's candidates for the router among more than ``ROUTE_ALL_MAX``
    instances: ``choices`` distinct instances a row (all when there are fewer), drawn up
    front from ``seed`` and ``side`` (0 prefill, 1 decode). Drawn per request rather than
    per decision, a request meets the same candidates whatever order events take, so the
    event simulator and the fast path route alike. Empty when the router compares all."""
    if instances <= ROUTE_ALL_MAX:
        return np.zeros((requests, 0), dtype=np.int64)
    rng = np.random.default_rng([seed, side])
    k = min(choices, instances)
    out = np.empty((requests, k), dtype=np.int64)
    for c in range(k):  # each column distinct from those before it: redraw the clashes
        col = rng.integers(0, instances, requests)
        clash = (out[:, :c] == col[:, None]).any(axis=1)
        while clash.any():
            col[clash] = rng.integers(0, instances, int(clash.sum()))
            clash = (out[:, :c] == col[:, None]).any(axis=1)
        out[:, c] = col
    return out


def prefill_limits(
    m: PlanModel, im: InstanceModel, o: SimOptions
) -> tuple[int, float, float, float]:
    """(token budget, batches in flight, requests in flight, routing weight in s per token)
    of prefill instance ``im``: the limits of the plan's engine, else vLLM's, as the planner
    prices them (``"stage"`` admission: no limit in flight), and the seconds per token of a
    mean request alone, the least-work router's weight."""
    limits = prefill_admission(engine_profile(m.plan.options.get("engine") or "vllm"), im.pp)
    budget = o.prefill_token_budget or limits.budget
    if o.prefill_admission == "engine":
        batches, requests = limits.slots, o.prefill_max_requests or limits.max_requests
    else:  # a free first stage with nothing in its inbox takes what is waiting
        batches = requests = math.inf
    ev = m.evaluator
    speed = ev.prefill_instance([s.gpus for s in im.stages]).serve_s / max(1.0, ev.mean_in)
    return budget, batches, requests, speed


class Simulator(DecodeSide):
    """One run: ``Simulator(model, options).run(requests)`` -> :class:`SimResult`."""

    def __init__(self, model: PlanModel, options: SimOptions | None = None) -> None:
        self.m = model
        self.o = options or SimOptions()
        if self.o.window_s <= 0:
            raise InputError(f"scheduler window must be positive, got {self.o.window_s}")
        if self.o.prefill_max_requests < 0:
            raise InputError(
                f"prefill requests in flight must be >= 0, got {self.o.prefill_max_requests}"
            )
        if self.o.prefill_token_budget < 0:
            raise InputError(
                f"prefill token budget must be >= 0, got {self.o.prefill_token_budget}"
            )
        if self.o.swap_bytes_per_s <= 0:
            raise InputError(f"swap bandwidth must be positive, got {self.o.swap_bytes_per_s}")
        if not 0.0 <= self.o.rerate_tolerance < 1.0:
            raise InputError(
                f"re-rating tolerance must be in [0, 1), got {self.o.rerate_tolerance}"
            )

    # -- set-up --------------------------------------------------------------------------
    def _reset(self, requests: list[Request]) -> None:
        m = self.m
        self.now = 0.0
        self.events: list = []
        self._seq = itertools.count()
        self.links = m.links
        self.links.reset()
        self.net = FluidNetwork(
            self.links, self.events, lambda: next(self._seq), self.o.rerate_tolerance
        )
        n = len(requests)
        self.pre_draws = route_draws(self.o.seed, 0, n, len(m.prefill), self.o.route_choices)
        self.dec_draws = route_draws(self.o.seed, 1, n, len(m.decode), self.o.route_choices)
        self.reqs = requests
        self.inp = [r.input_tokens for r in requests]
        self.out = [r.output_tokens for r in requests]
        self.arrival = [r.arrival_s for r in requests]
        self.start_pf = [math.nan] * n
        self.first = [math.nan] * n
        self.kv_done = [math.nan] * n
        self.finish = [math.nan] * n
        self.dec_of = [-1] * n
        self.pre_of = [-1] * n
        self.pre = []
        for im in m.prefill:
            st = _PrefillState(im)
            st.inbox = [deque() for _ in im.stages]
            st.busy = [False] * len(im.stages)
            st.budget, st.max_batches, st.max_requests, st.speed = prefill_limits(m, im, self.o)
            self.pre.append(st)
        self.sched = (
            GroupSchedulers(m, self.o.window_s, self.o.gamma) if self.o.online_scheduler else None
        )
        # statistics
        self.q_len = 0  # requests waiting for prefill
        self.q_area = 0.0
        self.sys_len = 0
        self.sys_area = 0.0
        self.last_t = 0.0
        self.ina_bytes = 0.0
        self.ar_bytes = 0.0
        self.policy_use: dict[str, int] = {}
        self._reset_decode()
        self.done = 0

    def _push(self, t: float, kind: str, payload) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, payload))

    # -- run -----------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> SimResult:
        if not requests:
            raise InputError("no requests to simulate")
        t0 = time.perf_counter()
        self._reset(requests)
        order = sorted(range(len(requests)), key=lambda i: self.arrival[i])
        self._order = order
        self._next_arrival = 0
        self._push(self.arrival[order[0]], "arr", None)
        span = max(self.arrival[order[-1]] - self.arrival[order[0]], 1e-3)
        self._sample_dt = span / max(1, self.o.kv_samples // 2)
        self._push(0.0, "kv", None)
        periodic = 1
        if self.sched is not None:
            self._push(self.o.window_s, "win", None)
            periodic = 2
        n_events = 0
        ev = self.events
        pop = heapq.heappop
        total = len(requests)
        while ev:
            t, _, kind, payload = pop(ev)
            if self.done == total and kind in ("kv", "win"):
                continue  # periodic events stop once every request has finished
            dt = t - self.last_t
            if dt > 0:
                self.q_area += self.q_len * dt
                self.sys_area += self.sys_len * dt
                self.last_t = t
            self.now = t
            n_events += 1
            if kind == "act":
                a = self.net.finish(payload[0], payload[1], t)
                if a is not None:
                    a.on_done(t)
            elif kind == "fix":
                self.net.end_delay(payload, t)
            elif kind == "pass":
                ds = payload[0]
                self._advance(ds, t)
                self._step_done(ds, payload[1])
                self._settle(ds)
            elif kind == "wake":
                self._woken(*payload)
            elif kind == "arr":
                self._arrive()
            elif kind == "swap":
                self._swapped_in(*payload)
            elif kind == "kv":
                self._sample_kv()
                if len(self.kv_timeline) >= 2 * self.o.kv_samples:
                    # the run outlasts its arrivals' span (one request, all at once): keep
                    # every other sample and double the period, so the timeline stays within
                    # 2 kv_samples and its events grow with log(duration), not duration
                    self.kv_timeline = self.kv_timeline[::2]
                    self._sample_dt *= 2
                if len(ev) > periodic - 1:  # something else is still to happen
                    self._push(t + self._sample_dt, "kv", None)
            elif kind == "win":
                self._book()
                self.sched.close_window(self.links)
                if len(ev) > periodic - 1:
                    self._push(t + self.o.window_s, "win", None)
        self._book()
        wall = time.perf_counter() - t0
        return summarise(self.m, self._record(), wall, n_events)

    def _record(self) -> RunRecord:
        """The finished run as plain data, for ``metrics.summarise``."""
        return RunRecord(
            self.arrival, self.start_pf, self.first, self.kv_done, self.finish, self.out,
            self.now, self.q_area, self.sys_area, self.ina_bytes, self.ar_bytes,
            self.policy_use, self.kv_peak_tokens_gpu, self.kv_peak_frac, self.kv_overflow,
            self.preemptions, self.net.rerates, self.kv_timeline,
        )  # fmt: skip

    # -- arrivals and prefill ------------------------------------------------------------
    @staticmethod
    def _choose(n: int, load, draws) -> int:
        """Least-loaded instance; among many, the better of the request's ``route_choices``
        random ones (``route_draws``; power of d choices: near-optimal balance at O(d) per
        decision)."""
        if n <= ROUTE_ALL_MAX:
            return min(range(n), key=load)
        return min(draws.tolist(), key=load)

    def _arrive(self) -> None:
        r = self._order[self._next_arrival]
        self._next_arrival += 1
        if self._next_arrival < len(self._order):
            self._push(self.arrival[self._order[self._next_arrival]], "arr", None)
        p = self._choose(
            len(self.pre), lambda i: self.pre[i].work_tokens * self.pre[i].speed, self.pre_draws[r]
        )
        st = self.pre[p]
        self.pre_of[r] = p
        st.queue.append(r)
        st.work_tokens += self.inp[r]
        self.q_len += 1
        self.sys_len += 1
        self._prefill_try(st, 0)

    def _admit(self, st: _PrefillState) -> None:
        """Batches of waiting requests, each up to the token budget (at least one request).
        ``"stage"``: one batch when the first stage is free and has nothing else to run.
        ``"engine"``, as vLLM's engine core runs it (``step_with_batch_queue``): while fewer
        than PP batches are in flight, one more, up to the free request slots (the export's
        ``--max-num-seqs``); it then waits for stage 0 like any other."""
        budget = st.budget
        stage = self.o.prefill_admission == "stage"
        while st.queue and st.batches < st.max_batches and st.requests < st.max_requests:
            if stage and (st.busy[0] or st.inbox[0]):
                return
            batch, k, k2 = [], 0, 0.0
            while (
                st.queue
                and st.requests + len(batch) < st.max_requests
                and (not batch or k + self.inp[st.queue[0]] <= budget)
            ):
                r = st.queue.popleft()
                batch.append(r)
                k += self.inp[r]
                k2 += float(self.inp[r]) ** 2
                self.start_pf[r] = self.now
            self.q_len -= len(batch)
            st.requests += len(batch)
            st.batches += 1
            st.inbox[0].append((batch, k, k2))

    def _prefill_try(self, st: _PrefillState, i: int) -> None:
        if i == 0:
            self._admit(st)
        if st.busy[i] or not st.inbox[i]:
            return
        item = st.inbox[i].popleft()
        _, k, k2 = item
        compute = self.m.prefill_compute(st.model, st.model.stages[i], k, k2)
        self._run_stage(
            st, i, item, compute, self.m.message_bytes(k), self._prefill_try, self._prefill_done
        )

    def _run_stage(
        self, st, i: int, item, compute_s: float, nbytes: float, try_next, finish
    ) -> None:
        """Stage ``i`` of a pipeline works on ``item``: compute plus its all-reduces and the hop
        to the next stage; then the item moves on (or ``finish``es) and the stage takes more."""
        st.busy[i] = True
        stage = st.model.stages[i]
        hop = self.m.hop(stage, nbytes)

        def done(now: float) -> None:
            st.busy[i] = False
            if i + 1 < len(st.model.stages):
                st.inbox[i + 1].append(item)
                try_next(st, i + 1)
            else:
                finish(st, item)
            try_next(st, i)

        self._iteration(stage, compute_s + hop, nbytes, done)

    def _prefill_done(self, st: _PrefillState, item) -> None:
        batch, k, _ = item
        st.work_tokens -= k
        st.requests -= len(batch)
        st.batches -= 1
        self._prefill_try(st, 0)  # the slots it frees admit more
        for r in batch:
            self.first[r] = self.now
            if self.out[r] <= 1:  # the first token was the last: no decode
                self._finish(r)
                continue
            d = self._choose(len(self.dec), self._decode_load, self.dec_draws[r])
            ds = self.dec[d]
            self.dec_of[r] = d
            ds.members += 1
            ds.pending.append(r)
            self._kv_try(ds)
            self._settle(ds)

    def _decode_load(self, j: int) -> float:
        """Requests per batch slot of decode instance ``j`` now (the KV routing load)."""
        ds = self.dec[j]
        self._advance(ds, self.now)
        return ds.members / (ds.model.max_batch * ds.model.pp)

    def _finish(self, r: int) -> None:
        self.finish[r] = self.now
        self.sys_len -= 1
        self.done += 1
        if self.now < self.last_t:  # a lazy step's end: the run counted r in the system since
            self.sys_area -= self.last_t - self.now

    # -- one stage iteration over the network --------------------------------------------
    def _iteration(self, stage: StageModel, fixed_s: float, nbytes: float, done) -> None:
        """Start one stage's iteration: ``fixed_s`` of compute and pipeline hop plus
        2 L/P_pipe all-reduces of ``nbytes`` bytes under the policy in use."""
        if not stage.options:
            self.net.delay(fixed_s, None, done, self.now)
            return
        k = 0
        if self.sched is not None:
            k = self.sched.choose(stage, stage.allreduces * nbytes)
        opt = stage.options[k]
        self._count(opt, stage.allreduces * nbytes)
        fixed, work = self._stage_terms(stage, opt, fixed_s)
        acct = (opt.bytes_per_byte, nbytes * stage.allreduces)
        if self._is_safe(opt):  # nothing can stretch it, so it needs no activity
            self.net.delay(work.time_alone(fixed, nbytes), acct, done, self.now)
            return
        a = Activity(fixed, nbytes, work, None, acct, done, opt.links, ("it", id(stage), k))
        self.net.start(a, self.now)

    def _count(self, opt: CommOption, nbytes: float, times: int = 1) -> None:
        """``times`` iterations' all-reduce bytes on ``opt`` into the run's statistics."""
        self.ar_bytes += nbytes * times
        if opt.scheme != "ring":  # flat or hierarchical INA: aggregated in switches
            self.ina_bytes += nbytes * times
        key = opt.use_key
        self.policy_use[key] = self.policy_use.get(key, 0) + times

    @staticmethod
    def _stage_terms(stage: StageModel, opt: CommOption, fixed_s: float) -> tuple[float, Work]:
        """(fixed seconds, work) of an iteration's activity: ``fixed_s`` of compute and hop
        plus the 2 L/P_pipe all-reduces on ``opt``."""
        n_ar = stage.allreduces
        return fixed_s + n_ar * opt.const_s, opt.work(n_ar)

    def _is_safe(self, opt: CommOption) -> bool:
        """The option crosses no risky link (``Links.risky``)."""
        return self.net.is_safe(id(opt), opt.links)
