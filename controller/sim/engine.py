"""The discrete-event simulator of a disaggregated cluster running a plan (docs/design.md §7).

A heap of events in simulated seconds. Requests arrive (Poisson, gamma or a trace), queue FCFS
at the prefill instance with the least work, are batched up to a token budget and flow through
the instance's pipeline stages; when the last stage finishes, the first token is out (TTFT; the
KV transfer is not part of it, as in the planner's Eq. 3) and the request's KV cache moves to
the decode instance with the most room (Eqs. 14-15, as link flows that contend). Decode
instances run continuous batching: ``P_pipe`` micro-batches of at most the plan's batch size
cycle through the stages, requests join a micro-batch at the start of its next step when their
KV cache has arrived, and leave after their last token. Every stage iteration is an activity
of the fluid network (``network.py``): its compute time (Eqs. 12-13) plus the 2 L/P_pipe
all-reduces of its layers over the links of the policy in use (the plan's, or the online
scheduler's choice, ``scheduler.py``) plus the pipeline hop (Eq. 6).

Each request's TPOT is (last token - first token) / (output tokens - 1): it includes the KV
transfer once, spread over the tokens (the planner's Eq. 4 charges T_f to every token, an upper
bound; the low-load test compares each term with the cost model separately).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field

from controller.errors import InputError
from controller.sim.metrics import RunRecord, SimResult, summarise
from controller.sim.model import CommOption, InstanceModel, PlanModel, StageModel
from controller.sim.network import Activity, FluidNetwork, Work
from controller.sim.scheduler import GroupSchedulers
from controller.workload import Request


@dataclass(frozen=True)
class SimOptions:
    prefill_token_budget: int = 2048  # most input tokens in one prefill batch
    online_scheduler: bool = False  # docs/design.md §8 on every group with several policies
    window_s: float = 0.05  # T_u: the scheduler's utilisation window
    gamma: float = 0.3  # Eq. 18 smoothing
    kv_samples: int = 400  # points of the KV-memory timeline
    route_choices: int = 2  # instances compared per routing decision when there are many
    seed: int = 0  # routing tie-breaks among many instances
    # relative drift of a link's stretch before the activities on it are re-rated
    # (network.py): 0 is the exact fluid model; 0.02 keeps large runs O(1) per event
    rerate_tolerance: float = 0.02
    # decode KV room is enforced as vLLM does: a step that would overflow the cache preempts
    # the micro-batch's most recently admitted requests, whose KV is swapped to host memory
    # over each GPU's host link at this rate (bytes/s; PCIe 3.0 x16 by default) and back
    swap_bytes_per_s: float = 16e9


@dataclass
class _PrefillState:
    model: InstanceModel
    queue: deque = field(default_factory=deque)
    inbox: list[deque] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    work_tokens: float = 0.0  # tokens queued or in flight (the routing load)
    speed: float = 1.0  # seconds per token when alone (routing weight)


@dataclass
class _MicroBatch:
    index: int
    reqs: set = field(default_factory=set)
    k_ctx: float = 0.0  # context tokens held by its requests
    step: int = 0
    ends: dict = field(default_factory=dict)  # step -> requests finishing at it
    running: bool = False


@dataclass
class _DecodeState:
    model: InstanceModel
    mbs: list[_MicroBatch] = field(default_factory=list)
    inbox: list[deque] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)  # KV arrived, waiting for a batch slot
    swapped: deque = field(default_factory=deque)  # preempted, KV in host memory, ready
    swapping: int = 0  # preempted, still being swapped out and in
    free: list[float] = field(default_factory=list)  # per stage: when a whole-pass run frees it
    held: float = 0.0  # context tokens of its micro-batches (the sum of their k_ctx)
    pending: deque = field(default_factory=deque)  # waiting for KV room before the transfer
    reserved: float = 0.0  # tokens of transfers in flight and of waiting requests
    members: int = 0  # requests assigned (pending, transferring, waiting or decoding)

    def tokens(self) -> float:
        return self.reserved + self.held


class Simulator:
    """One run: ``Simulator(model, options).run(requests)`` -> :class:`SimResult`."""

    def __init__(self, model: PlanModel, options: SimOptions | None = None) -> None:
        self.m = model
        self.o = options or SimOptions()
        if self.o.window_s <= 0:
            raise InputError(f"scheduler window must be positive, got {self.o.window_s}")
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
        self.rng = random.Random(self.o.seed)
        n = len(requests)
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
            # seconds per token of a mean request alone: the least-work routing weight
            ev = m.evaluator
            st.speed = ev.prefill_instance([s.gpus for s in im.stages]).serve_s / max(
                1.0, ev.mean_in
            )
            self.pre.append(st)
        self.dec = []
        for im in m.decode:
            st = _DecodeState(im)
            st.mbs = [_MicroBatch(i) for i in range(im.pp)]
            st.free = [0.0] * len(im.stages)
            st.inbox = [deque() for _ in im.stages]
            st.busy = [False] * len(im.stages)
            self.dec.append(st)
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
        self.kv_bytes = 0.0
        self.policy_use: dict[str, int] = {}
        self.kv_peak_frac = 0.0
        self.kv_peak_tokens_gpu = 0.0
        self.kv_timeline: list[tuple[float, float]] = []
        self.kv_overflow = 0
        self.preemptions = 0
        self._kv_seen: set[int] = set()
        # id(decode state) -> (network risk version, whole-pass steps allowed)
        self._pass_ok: dict[int, tuple[int, bool]] = {}
        self._extras: dict[tuple[int, int], tuple] = {}  # (id(decode state), batch) -> extras
        self._passes: dict[tuple[int, int], int] = {}  # whole-pass steps not yet booked
        self.left = [o - 1 for o in self.out]  # decode steps still to run, per request
        self.admitted = [0] * n  # admission order, to preempt the newest first
        self._admissions = 0
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
                self._step_done(*payload)
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
    def _choose(self, n: int, load) -> int:
        """Least-loaded instance; among many, the better of ``route_choices`` random ones
        (power of d choices: near-optimal balance at O(d) per decision)."""
        if n <= 8:
            return min(range(n), key=load)
        cands = self.rng.sample(range(n), min(n, self.o.route_choices))
        return min(cands, key=load)

    def _arrive(self) -> None:
        r = self._order[self._next_arrival]
        self._next_arrival += 1
        if self._next_arrival < len(self._order):
            self._push(self.arrival[self._order[self._next_arrival]], "arr", None)
        p = self._choose(len(self.pre), lambda i: self.pre[i].work_tokens * self.pre[i].speed)
        st = self.pre[p]
        self.pre_of[r] = p
        st.queue.append(r)
        st.work_tokens += self.inp[r]
        self.q_len += 1
        self.sys_len += 1
        self._prefill_try(st, 0)

    def _prefill_try(self, st: _PrefillState, i: int) -> None:
        if st.busy[i]:
            return
        if i == 0:
            if not st.queue:
                return
            batch, k, k2 = [], 0, 0.0
            budget = self.o.prefill_token_budget
            while st.queue and (not batch or k + self.inp[st.queue[0]] <= budget):
                r = st.queue.popleft()
                batch.append(r)
                k += self.inp[r]
                k2 += float(self.inp[r]) ** 2
                self.start_pf[r] = self.now
            self.q_len -= len(batch)
            item = (batch, k, k2)
        else:
            if not st.inbox[i]:
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
        for r in batch:
            self.first[r] = self.now
            if self.out[r] <= 1:  # the first token was the last: no decode
                self._finish(r)
                continue
            d = self._choose(
                len(self.dec),
                lambda j: (
                    self.dec[j].members / (self.dec[j].model.max_batch * self.dec[j].model.pp)
                ),
            )
            ds = self.dec[d]
            self.dec_of[r] = d
            ds.members += 1
            ds.pending.append(r)
            self._kv_try(ds)

    # -- KV transfer ---------------------------------------------------------------------
    def _kv_try(self, ds: _DecodeState) -> None:
        """Start the KV transfers the decode instance has room for (FCFS; the cache stays on
        the prefill GPUs until then)."""
        cap = ds.model.kv_capacity_tokens
        while ds.pending and not (ds.swapped or ds.swapping):  # preempted requests go first
            r = ds.pending[0]
            need = self.inp[r] + 1
            if ds.tokens() + need > cap and ds.tokens() > 0:
                return
            ds.pending.popleft()
            ds.reserved += need
            self._note_kv(ds)
            kvm = self.m.kv(self.pre_of[r], self.dec_of[r])
            if id(kvm) not in self._kv_seen:  # a new route: its links may now be shared
                self._kv_seen.add(id(kvm))
                self.net.make_risky(kvm.links, self.now)
            tok = float(self.inp[r])

            def done(now: float, r=r, ds=ds) -> None:
                self.kv_done[r] = now
                ds.waiting.append(r)
                for mb in ds.mbs:
                    if not mb.running:
                        self._begin_step(ds, mb)

            a = Activity(
                0.0, tok, kvm.work, None, (kvm.bytes_per_token, tok), done, kvm.links,
                ("kv", self.pre_of[r], self.dec_of[r]),
            )  # fmt: skip
            self.kv_bytes += tok * self.m.model.kv_bytes_per_token()
            self.net.start(a, self.now)

    # -- decode --------------------------------------------------------------------------
    def _begin_step(self, ds: _DecodeState, mb: _MicroBatch) -> None:
        """Continuous batching: admit waiting requests, then queue the micro-batch for stage
        0, or park it when it is empty."""
        cap = ds.model.max_batch
        room = ds.model.kv_capacity_tokens
        while ds.swapped and len(mb.reqs) < cap:  # swapped back in first, when they fit
            r = ds.swapped[0]
            ctx = self._context(r)
            if ds.tokens() + ctx > room and ds.tokens() > 0:
                break
            ds.swapped.popleft()
            self._join(ds, mb, r, ctx)
        while ds.waiting and len(mb.reqs) < cap:
            r = ds.waiting.popleft()
            need = self.inp[r] + 1
            ds.reserved -= need
            self._join(ds, mb, r, need)
        if not mb.reqs:
            mb.running = False
            return
        mb.running = True
        if self._whole_pass(ds):
            self._decode_pass(ds, mb)
            return
        ds.inbox[0].append(mb)
        self._decode_try(ds, 0)

    def _whole_pass(self, ds: _DecodeState) -> bool:
        """Whether a micro-batch's step may be run through all stages at once: every stage
        time is then fixed in advance (each stage's policy is known, without the online
        scheduler or with one option, and crosses no risky link)."""
        hit = self._pass_ok.get(id(ds))
        if hit is None or hit[0] != self.net.risk_version:
            hit = self._pass_ok[id(ds)] = (
                self.net.risk_version,
                all(
                    not st.options
                    or (
                        (self.sched is None or len(st.options) == 1)
                        and self._is_safe(st.options[0])
                    )
                    for st in ds.model.stages
                ),
            )
        return hit[1]

    def _decode_pass(self, ds: _DecodeState, mb: _MicroBatch) -> None:
        """One decode step of ``mb`` through every stage in one go, the same schedule as stage
        by stage. Stages serve micro-batches first come first served and a stage's time
        depends only on the micro-batch (fixed during its step): a permutation flow shop, in
        which no micro-batch overtakes another, so its pass is exactly
        ``start_s = max(end_{s-1}, free_s); end_s = start_s + t_s`` with ``free_s`` left by
        the passes computed before it. One event per step instead of one per stage."""
        b = len(mb.reqs)
        extra = self._pass_extra(ds, b)
        # every stage holds L / P_pipe layers: the same Eq. 13 compute in each
        compute = self.m.decode_compute(ds.model, ds.model.stages[0], b, mb.k_ctx)
        t = self.now
        free = ds.free
        for i, x in enumerate(extra):
            start = t if t > free[i] else free[i]
            t = free[i] = start + compute + x
        self._push(t, "pass", (ds, mb))

    def _pass_extra(self, ds: _DecodeState, b: int) -> tuple[float, ...]:
        """Per stage, the seconds a step of ``b`` requests spends besides compute (pipeline
        hop and all-reduces, Eqs. 6-11); the step's statistics and link bytes are counted
        here, once per step, as ``_iteration`` counts them once per stage."""
        key = (id(ds), b)
        hit = self._extras.get(key)
        if hit is None:
            nbytes = self.m.message_bytes(b)
            extra, stats = [], []
            for stage in ds.model.stages:
                x = self.m.hop(stage, nbytes)
                if stage.options:
                    opt = stage.options[0]
                    fixed, work = self._stage_terms(stage, opt, x)
                    x = work.time_alone(fixed, nbytes)
                    stats.append((opt, stage.allreduces * nbytes))
                extra.append(x)
            hit = self._extras[key] = (tuple(extra), stats)
        self._passes[key] = self._passes.get(key, 0) + 1  # its statistics, counted later
        return hit[0]

    def _book(self) -> None:
        """Count the whole-pass steps run since the last call into the statistics and the
        links' bytes (``_pass_extra`` leaves them in ``_passes``), then book the bytes."""
        for key, n in self._passes.items():
            for opt, nbytes in self._extras[key][1]:
                self._count(opt, nbytes, n)
                self.net.note_usage((opt.bytes_per_byte, nbytes * n))
        self._passes.clear()
        self.net.book()

    def _context(self, r: int) -> int:
        """Tokens of KV cache request ``r`` holds: its prompt and the tokens made so far."""
        return self.inp[r] + self.out[r] - self.left[r]

    @staticmethod
    def _hold(ds: _DecodeState, mb: _MicroBatch, tokens: float) -> None:
        """``tokens`` more context tokens in ``mb`` (negative: fewer), kept in ``ds.held``."""
        mb.k_ctx += tokens
        ds.held += tokens

    def _join(self, ds: _DecodeState, mb: _MicroBatch, r: int, ctx: float) -> None:
        self._hold(ds, mb, ctx)
        mb.reqs.add(r)
        mb.ends.setdefault(mb.step + self.left[r], []).append(r)
        self._admissions += 1
        self.admitted[r] = self._admissions

    def _preempt(self, ds: _DecodeState, mb: _MicroBatch) -> None:
        """vLLM's rule when the cache is full: the newest request of the micro-batch leaves it
        and its KV goes to host memory (out and back in over the host link, charged as one
        delay before it may rejoin); it keeps its place ahead of new requests."""
        r = max(mb.reqs, key=self.admitted.__getitem__)
        end = next(s for s, rs in mb.ends.items() if r in rs)
        mb.ends[end].remove(r)
        mb.reqs.discard(r)
        self.left[r] = end - mb.step
        ctx = self._context(r)
        self._hold(ds, mb, -ctx)
        self.preemptions += 1
        ds.swapping += 1
        per_gpu = ctx * self.m.model.kv_bytes_per_token() / (ds.model.tp * ds.model.pp)
        self._push(self.now + 2 * per_gpu / self.o.swap_bytes_per_s, "swap", (ds, r))

    def _swapped_in(self, ds: _DecodeState, r: int) -> None:
        ds.swapping -= 1
        ds.swapped.append(r)
        for mb in ds.mbs:
            if not mb.running:
                self._begin_step(ds, mb)

    def _decode_try(self, ds: _DecodeState, i: int) -> None:
        if ds.busy[i] or not ds.inbox[i]:
            return
        mb = ds.inbox[i].popleft()
        b = len(mb.reqs)
        compute = self.m.decode_compute(ds.model, ds.model.stages[i], b, mb.k_ctx)
        self._run_stage(
            ds, i, mb, compute, self.m.message_bytes(b), self._decode_try, self._step_done
        )

    def _step_done(self, ds: _DecodeState, mb: _MicroBatch) -> None:
        mb.step += 1
        self._hold(ds, mb, len(mb.reqs))
        for r in mb.ends.pop(mb.step, ()):
            mb.reqs.discard(r)
            self._hold(ds, mb, -(self.inp[r] + self.out[r]))
            ds.members -= 1
            self._finish(r)
        cap = ds.model.kv_capacity_tokens
        while ds.tokens() > cap and len(mb.reqs) > 1:  # the step's new tokens overflow
            self._preempt(ds, mb)
        self._note_kv(ds)
        self._begin_step(ds, mb)
        if ds.pending:
            self._kv_try(ds)

    def _finish(self, r: int) -> None:
        self.finish[r] = self.now
        self.sys_len -= 1
        self.done += 1

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

    # -- KV memory -----------------------------------------------------------------------
    def _note_kv(self, ds: _DecodeState) -> None:
        tok = ds.tokens()
        cap = ds.model.kv_capacity_tokens
        per_gpu = tok / (ds.model.tp * ds.model.pp)
        if per_gpu > self.kv_peak_tokens_gpu:
            self.kv_peak_tokens_gpu = per_gpu
        if cap > 0 and tok / cap > self.kv_peak_frac:
            self.kv_peak_frac = tok / cap
        if tok > cap:
            self.kv_overflow += 1

    def _sample_kv(self) -> None:
        used = sum(d.tokens() for d in self.dec)
        cap = sum(d.model.kv_capacity_tokens for d in self.dec)
        self.kv_timeline.append((self.now, used / cap if cap > 0 else 0.0))
