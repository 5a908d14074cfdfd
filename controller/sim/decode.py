"""The decode side of the simulator (docs/design.md §7): KV transfers into a decode instance,
continuous batching, whole-pass decode steps, vLLM-style preemption with swapping, and the
KV-memory statistics.

Holds :class:`MicroBatch` and :class:`DecodeState` (a decode instance's state during a run),
:data:`LAZY_STEPS` and :func:`_min_pass_s` (the lazy steps' horizon) and :class:`DecodeSide`,
the part of :class:`~controller.sim.engine.Simulator` that runs them (a mixin: the engine
owns the event loop and the stage iterations it calls).

Lazy step ends (an exact shortcut, docs/simulator.md "Speed"): an instance whose steps are
whole passes, with no transfer waiting for KV room, nothing swapped and KV headroom for
``LAZY_STEPS`` more steps of every micro-batch keeps its passes in flight in a heap of its
own instead of the event heap, and runs their ends, each at its own time, when anything
reads or changes it (``_advance``) or at a wake-up event after at most that many steps.

A request's KV transfer starts when its decode instance has room for the prompt's cache
(Eqs. 14-15, as link flows that contend). Decode instances run continuous batching:
``P_pipe`` micro-batches of at most the plan's batch size cycle through the stages,
requests join a micro-batch at the start of its next step when their KV cache has arrived,
and leave after their last token. A step that overflows the cache preempts the
micro-batch's newest requests, as vLLM does.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.sim.flows import Work
from controller.sim.model import CommOption, InstanceModel, PlanModel, StageModel
from controller.sim.network import Activity, FluidNetwork
from controller.sim.options import SimOptions
from controller.sim.scheduler import GroupSchedulers


@dataclass
class MicroBatch:
    """One of a decode instance's ``P_pipe`` micro-batches: its requests and their context."""

    index: int
    reqs: set = field(default_factory=set)
    k_ctx: float = 0.0  # context tokens held by its requests
    step: int = 0
    ends: dict = field(default_factory=dict)  # step -> requests finishing at it
    running: bool = False


@dataclass
class DecodeState:
    """A decode instance during a run: its micro-batches, stage queues and KV bookkeeping."""

    model: InstanceModel
    mbs: list[MicroBatch] = field(default_factory=list)
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
    # lazy steps (``_settle``): passes in flight as a heap of (end, seq, micro-batch) that
    # only this instance reads, its wake-up event's version (0: none armed) and the steps per
    # micro-batch its KV headroom allowed when the wake-up was armed
    lazy: bool = False
    due: list = field(default_factory=list)
    wake: int = 0
    lazy_k: int = 0
    min_pass_s: float = 0.0  # no step's pass through every stage is shorter (Eq. 13's floor)

    def tokens(self) -> float:
        return self.reserved + self.held


LAZY_STEPS = 64  # most steps per micro-batch between a lazy instance's wake-ups


def _min_pass_s(im: InstanceModel) -> float:
    """A lower bound on one decode step's pass through every stage: Eq. 13 over each
    stage's layers at a batch of 1 and no context (its terms are non-negative, and a pass also
    waits and communicates). 0 when the terms do not allow a bound (no lazy steps then)."""
    a, b, c, d = im.decode_terms
    per_layer = max(a, b) + d
    if c < 0 or per_layer <= 0:
        return 0.0
    return sum(st.layers for st in im.stages) * per_layer


class DecodeSide:
    """Decode instances of one run. The engine provides the attributes annotated below (set
    in its ``_reset``, the decode ones by :meth:`_reset_decode`) and the methods ``_push``,
    ``_finish``, ``_run_stage``, ``_count``, ``_stage_terms`` and ``_is_safe``."""

    m: PlanModel
    o: SimOptions
    net: FluidNetwork
    sched: GroupSchedulers | None
    now: float
    inp: list[int]
    out: list[int]
    pre_of: list[int]
    dec_of: list[int]
    kv_done: list[float]
    dec: list[DecodeState]
    _push: Callable[[float, str, Any], None]
    _finish: Callable[[int], None]
    _run_stage: Callable[..., None]
    _count: Callable[..., None]
    _stage_terms: Callable[[StageModel, CommOption, float], tuple[float, Work]]
    _is_safe: Callable[[CommOption], bool]

    def _reset_decode(self) -> None:
        """Idle decode instances and zero decode statistics: the state before a run."""
        n = len(self.inp)
        self.dec = []
        for im in self.m.decode:
            st = DecodeState(im)
            st.mbs = [MicroBatch(i) for i in range(im.pp)]
            st.free = [0.0] * len(im.stages)
            st.inbox = [deque() for _ in im.stages]
            st.busy = [False] * len(im.stages)
            st.min_pass_s = _min_pass_s(im)
            self.dec.append(st)
        self.kv_bytes = 0.0
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
        self._due_seq = itertools.count()
        self._wakes = itertools.count(1)
        # lazy steps need every step's time fixed when it starts and no one else reading the
        # run's state between steps: not with the online scheduler (its windows read bytes)
        self._lazy_on = self.o.shortcuts and self.sched is None

    # -- KV transfer ---------------------------------------------------------------------
    def _kv_try(self, ds: DecodeState) -> None:
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
                self._make_risky(kvm.links)
            tok = float(self.inp[r])

            def done(now: float, r=r, ds=ds) -> None:
                self._advance(ds, now)
                self.kv_done[r] = now
                ds.waiting.append(r)
                for mb in ds.mbs:
                    if not mb.running:
                        self._begin_step(ds, mb)
                self._settle(ds)

            a = Activity(
                0.0, tok, kvm.work, None, (kvm.bytes_per_token, tok), done, kvm.links,
                ("kv", self.pre_of[r], self.dec_of[r]),
            )  # fmt: skip
            self.kv_bytes += tok * self.m.model.kv_bytes_per_token()
            self.net.start(a, self.now)

    # -- decode --------------------------------------------------------------------------
    def _begin_step(self, ds: DecodeState, mb: MicroBatch) -> None:
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
        if ds.lazy or self._whole_pass(ds):  # lazy: whole passes (``_settle``)
            self._decode_pass(ds, mb)
            return
        ds.inbox[0].append(mb)
        self._decode_try(ds, 0)

    def _whole_pass(self, ds: DecodeState) -> bool:
        """Whether a micro-batch's step may be run through all stages at once: every stage
        time is then fixed in advance (each stage's policy is known, without the online
        scheduler or with one option, and crosses no risky link)."""
        if not self.o.shortcuts:  # the unabridged run: every stage iteration an event
            return False
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

    def _decode_pass(self, ds: DecodeState, mb: MicroBatch) -> None:
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
        if ds.lazy:
            heapq.heappush(ds.due, (t, next(self._due_seq), mb))
        else:
            self._push(t, "pass", (ds, mb))

    def _pass_extra(self, ds: DecodeState, b: int) -> tuple[float, ...]:
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
    def _hold(ds: DecodeState, mb: MicroBatch, tokens: float) -> None:
        """``tokens`` more context tokens in ``mb`` (negative: fewer), kept in ``ds.held``."""
        mb.k_ctx += tokens
        ds.held += tokens

    def _join(self, ds: DecodeState, mb: MicroBatch, r: int, ctx: float) -> None:
        self._hold(ds, mb, ctx)
        mb.reqs.add(r)
        mb.ends.setdefault(mb.step + self.left[r], []).append(r)
        self._admissions += 1
        self.admitted[r] = self._admissions

    def _preempt(self, ds: DecodeState, mb: MicroBatch) -> None:
        """vLLM's rule when the cache is full: the newest request of the micro-batch leaves it
        and its KV goes to host memory (out and back in over the host link, charged as one
        delay before it may rejoin); it keeps its place ahead of new requests."""
        if ds.lazy:  # _settle's headroom rules this out; a step in the past cannot preempt
            raise RuntimeError("a lazy decode instance outgrew the KV headroom it was given")
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

    def _swapped_in(self, ds: DecodeState, r: int) -> None:
        self._advance(ds, self.now)
        ds.swapping -= 1
        ds.swapped.append(r)
        for mb in ds.mbs:
            if not mb.running:
                self._begin_step(ds, mb)
        self._settle(ds)

    def _decode_try(self, ds: DecodeState, i: int) -> None:
        if ds.busy[i] or not ds.inbox[i]:
            return
        mb = ds.inbox[i].popleft()
        b = len(mb.reqs)
        compute = self.m.decode_compute(ds.model, ds.model.stages[i], b, mb.k_ctx)
        self._run_stage(
            ds, i, mb, compute, self.m.message_bytes(b), self._decode_try, self._step_done
        )

    def _step_done(self, ds: DecodeState, mb: MicroBatch) -> None:
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

    # -- lazy steps -----------------------------------------------------------------------
    def _advance(self, ds: DecodeState, t: float) -> None:
        """Run a lazy instance's step ends up to time ``t``, in time order, each at its own
        time: the same calls the step events would have made. Whatever reads or changes the
        instance calls this first, so nothing sees it out of date."""
        due = ds.due
        if not due or due[0][0] > t:
            return
        real = self.now
        pop = heapq.heappop
        while due and due[0][0] <= t:
            end, _, mb = pop(due)
            self.now = end
            self._step_done(ds, mb)
        self.now = real

    def _settle(self, ds: DecodeState) -> None:
        """Decide, at the current time and with ``ds`` advanced to it, whether its steps may
        end lazily: only whole-pass steps (fixed times), no request waiting for KV room, none
        swapped (both need the step end at its own time to start something), and KV headroom
        for ``lazy_k`` more steps of every micro-batch at their largest (so no step before the
        wake-up can preempt). Otherwise its passes in flight go back on the event heap."""
        cap = ds.model.kv_capacity_tokens
        per_step = ds.model.pp * ds.model.max_batch  # tokens every micro-batch's step adds
        ok = (
            self._lazy_on
            and ds.min_pass_s > 0
            and not (ds.pending or ds.swapped or ds.swapping)
            and self._whole_pass(ds)
        )
        if ok and ds.wake:  # a wake-up is armed: the headroom must last until it
            ok = ds.tokens() + ds.lazy_k * per_step <= cap
        elif ok:
            k = (
                min(LAZY_STEPS, int((cap - ds.tokens()) // per_step))
                if cap < float("inf")
                else LAZY_STEPS
            )
            ok = k >= 1
            if ok and ds.due:
                ds.lazy_k = k
                ds.wake = next(self._wakes)
                self._push(self.now + k * ds.min_pass_s, "wake", (ds, ds.wake))
        if ok:
            ds.lazy = True
            return
        if ds.lazy:
            for end, _, mb in ds.due:
                self._push(end, "pass", (ds, mb))
            ds.due.clear()
            ds.lazy = False
            ds.wake = 0

    def _woken(self, ds: DecodeState, version: int) -> None:
        """A lazy instance's wake-up: its steps up to now, then a new decision."""
        if ds.wake != version:
            return  # superseded: the instance went eager since
        ds.wake = 0
        self._advance(ds, self.now)
        self._settle(ds)

    def _make_risky(self, links: tuple[int, ...]) -> None:
        """``FluidNetwork.make_risky`` with lazy instances brought up to now first: their
        passes so far were fixed while those links were safe, and one whose stages now cross
        a risky link must step eagerly from here on."""
        version = self.net.risk_version
        lazy = [ds for ds in self.dec if ds.lazy]
        for ds in lazy:
            self._advance(ds, self.now)
        self.net.make_risky(links, self.now)
        if self.net.risk_version != version:
            for ds in lazy:
                self._settle(ds)

    # -- KV memory -----------------------------------------------------------------------
    def _note_kv(self, ds: DecodeState) -> None:
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
        for ds in self.dec:
            self._advance(ds, self.now)
        used = sum(d.tokens() for d in self.dec)
        cap = sum(d.model.kv_capacity_tokens for d in self.dec)
        self.kv_timeline.append((self.now, used / cap if cap > 0 else 0.0))
