"""The fast path's compiled event loop (docs/simulator.md "The fast path"): the simulator's
rules (``engine.py``, ``decode.py``) over plain arrays, compiled by Numba, with every
activity taking its time alone. ``fastpath.py`` builds its tables from a priced plan.

Holds :data:`Requests`, :data:`PrefillSide`, :data:`DecodeSide` (named tuples of arrays: the
per-request record, each side's parameters and run state) and :func:`run_core` (one run).

What it runs, rule for rule as the unabridged simulator does: arrivals routed to the prefill
instance with the least weighted work (of all up to ``ROUTE_ALL_MAX``, else the better of
the request's ``route_choices`` candidates, drawn up front by ``engine.route_draws``);
vLLM's engine admission (at most PP batches and ``max_requests`` in flight, each batch up
to the token budget) into a FIFO pipeline, a permutation flow shop
computed at admission (``start_s = max(end_{s-1}, free_s)``); the KV transfer to the decode
instance with the fewest requests per slot, once it has room; continuous batching of P_pipe
micro-batches as whole passes; vLLM's preemption with a swap delay; the KV-memory samples.
Queues are linked lists through per-request arrays (``link``: prefill queue and batch,
``dlink``: a decode instance's pending, waiting or swapped queue); a micro-batch's requests
are a binary heap of (last step, request) in a row of ``mb_end`` / ``mb_req``.
"""

from __future__ import annotations

import heapq
from collections import namedtuple

import numpy as np
from numba import njit

from controller.costmodel.prefill_pool import ROUTE_ALL_MAX

# event kinds
ARRIVE, PREFILLED, KV_DONE, PASS_DONE, SWAPPED_IN, KV_SAMPLE = 0, 1, 2, 3, 4, 5
# integer counters (``ctr``)
SEQ, DONE, Q_LEN, SYS_LEN, ADMISSIONS, PREEMPTIONS, OVERFLOW, BATCHES, EVENTS = range(9)
N_COUNTERS = 9
# float accumulators (``acc``)
Q_AREA, SYS_AREA, LAST_T, PEAK_GPU, PEAK_FRAC = range(5)
N_ACCUMULATORS = 5

Requests = namedtuple(
    "Requests",
    "arrival inp out start_pf first kv_done finish pre_of dec_of left admitted link dlink "
    "pre_draws dec_draws",
)
PrefillSide = namedtuple(
    "PrefillSide",
    # parameters: stages, compute (A k + B k^2 sum + C per stage), routing weight (s per
    # token), token budget, batches and requests in flight at most, stage extras
    # [instance, stage, tokens]; state: queue head/tail, work, in flight, stage free times,
    # batches (head, size, tokens) and statistics (batches, tokens)
    "nst abc speed budget slots max_requests extra "
    "q_head q_tail work requests batches free b_head b_size b_tok n_batches n_tokens",
)
DecodeSide = namedtuple(
    "DecodeSide",
    # parameters: stages (= micro-batches), layers per stage, Eq. 13 terms (a, b, c, d), KV
    # room (tokens), batch size, GPUs, first micro-batch's index, stage extras [instance,
    # stage, batch]; KV envelopes [prefill, decode, point] (s per token, s);
    # state per instance and per micro-batch; statistics (passes, batch tokens), KV tokens
    # moved per (prefill, decode) pair
    "nst layers terms cap max_batch gpus mb0 extra kv_k kv_l "
    "members reserved held swapping free p_head p_tail w_head w_tail s_head s_tail "
    "mb_count mb_ctx mb_step mb_run mb_end mb_req n_passes n_batched kv_tokens",
)


@njit(cache=True)
def _push(heap, ctr, t, kind, a, b):
    ctr[SEQ] += 1
    heapq.heappush(heap, (t, ctr[SEQ], kind, a, b))


@njit(cache=True)
def _load(j, base, weight, divide):
    # as the simulator computes it: work * seconds per token, or members / slots
    return base[j] / weight[j] if divide else base[j] * weight[j]


@njit(cache=True)
def _pick(n, base, weight, divide, draws):
    """The least-loaded of ``n`` instances (``_load``); among more than ``ROUTE_ALL_MAX``,
    of the request's ``draws`` (``engine.route_draws``; ties: the first)."""
    if n <= ROUTE_ALL_MAX:  # a compile-time constant
        best, best_v = 0, _load(0, base, weight, divide)
        for j in range(1, n):
            v = _load(j, base, weight, divide)
            if v < best_v:
                best, best_v = j, v
        return best
    best, best_v = draws[0], _load(draws[0], base, weight, divide)
    for i in range(1, draws.shape[0]):
        v = _load(draws[i], base, weight, divide)
        if v < best_v:
            best, best_v = draws[i], v
    return best


# -- micro-batch heaps: (last step, request), smallest step on top ----------------------
@njit(cache=True)
def _mb_push(end, req, m, size, step, r):
    i = size
    while i > 0:
        up = (i - 1) // 2
        if end[m, up] <= step:
            break
        end[m, i], req[m, i] = end[m, up], req[m, up]
        i = up
    end[m, i], req[m, i] = step, r


@njit(cache=True)
def _mb_remove(end, req, m, size, i):
    """Remove entry ``i`` of a heap of ``size`` entries (``size - 1`` remain)."""
    last = size - 1
    step, r = end[m, last], req[m, last]
    if i == last:
        return
    while i > 0 and end[m, (i - 1) // 2] > step:  # sift the moved entry up
        up = (i - 1) // 2
        end[m, i], req[m, i] = end[m, up], req[m, up]
        i = up
    while True:  # then down
        c = 2 * i + 1
        if c >= last:
            break
        if c + 1 < last and end[m, c + 1] < end[m, c]:
            c += 1
        if end[m, c] >= step:
            break
        end[m, i], req[m, i] = end[m, c], req[m, c]
        i = c
    end[m, i], req[m, i] = step, r


@njit(cache=True)
def _flow_shop(free, stages, now, compute, extra, size):
    """A pass started at ``now`` through ``stages`` FIFO stages (``free``: when each is next
    free, updated), each taking ``compute`` plus its ``extra[stage, size]``: its end. No item
    overtakes another, so ``start_s = max(end_{s-1}, free_s)`` is the stage-by-stage
    schedule exactly."""
    t = now
    for s in range(stages):
        if free[s] > t:
            t = free[s]
        t += compute + extra[s, size]
        free[s] = t
    return t


# -- prefill ---------------------------------------------------------------------------
@njit(cache=True)
def _admit(p, now, R, P, ctr, heap):
    """vLLM's engine admission on instance ``p``; each batch's pass through the pipeline is
    fixed at once (a FIFO flow shop with times known at the start)."""
    while P.q_head[p] >= 0 and P.batches[p] < P.slots[p] and P.requests[p] < P.max_requests[p]:
        head = P.q_head[p]
        r = head
        size = 0
        k = 0
        k2 = 0.0
        while r >= 0 and P.requests[p] + size < P.max_requests[p]:
            x = R.inp[r]
            if size > 0 and k + x > P.budget[p]:
                break
            R.start_pf[r] = now
            size += 1
            k += x
            k2 += float(x) * float(x)
            r = R.link[r]
        P.q_head[p] = r
        if r < 0:
            P.q_tail[p] = -1
        ctr[Q_LEN] -= size
        P.requests[p] += size
        P.batches[p] += 1
        b = ctr[BATCHES]
        ctr[BATCHES] += 1
        P.b_head[b], P.b_size[b], P.b_tok[b] = head, size, k
        compute = P.abc[p, 0] * k + P.abc[p, 1] * k2 + P.abc[p, 2]
        t = _flow_shop(P.free[p], P.nst[p], now, compute, P.extra[p], k)
        P.n_batches[p] += 1
        P.n_tokens[p] += k
        _push(heap, ctr, t, PREFILLED, p, b)


# -- decode ----------------------------------------------------------------------------
@njit(cache=True)
def _note_kv(d, D, acc, ctr):
    tok = D.reserved[d] + D.held[d]
    per_gpu = tok / D.gpus[d]
    if per_gpu > acc[PEAK_GPU]:
        acc[PEAK_GPU] = per_gpu
    cap = D.cap[d]
    if cap > 0 and tok / cap > acc[PEAK_FRAC]:
        acc[PEAK_FRAC] = tok / cap
    if tok > cap:
        ctr[OVERFLOW] += 1


@njit(cache=True)
def _kv_try(d, now, R, D, ctr, acc, heap):
    """Start the KV transfers decode instance ``d`` has room for, FCFS, each taking its
    time alone (the largest of its envelope's K tokens + lat)."""
    while D.p_head[d] >= 0 and D.s_head[d] < 0 and D.swapping[d] == 0:
        r = D.p_head[d]
        need = R.inp[r] + 1
        tok = D.reserved[d] + D.held[d]
        if tok + need > D.cap[d] and tok > 0:
            return
        _pop(D.p_head, D.p_tail, R.dlink, d)
        D.reserved[d] += need
        _note_kv(d, D, acc, ctr)
        p = R.pre_of[r]
        tokens = float(R.inp[r])
        t = 0.0
        for e in range(D.kv_k.shape[2]):
            x = D.kv_k[p, d, e] * tokens + D.kv_l[p, d, e]
            if x > t:
                t = x
        D.kv_tokens[p, d] += tokens
        _push(heap, ctr, now + t, KV_DONE, r, d)


@njit(cache=True)
def _append(head, tail, link, d, r):
    link[r] = -1
    if tail[d] < 0:
        head[d] = r
    else:
        link[tail[d]] = r
    tail[d] = r


@njit(cache=True)
def _pop(head, tail, link, d):
    r = head[d]
    head[d] = link[r]
    if head[d] < 0:
        tail[d] = -1
    return r


@njit(cache=True)
def _join(d, m, r, ctx, R, D, ctr):
    D.mb_ctx[m] += ctx
    D.held[d] += ctx
    _mb_push(D.mb_end, D.mb_req, m, D.mb_count[m], D.mb_step[m] + R.left[r], r)
    D.mb_count[m] += 1
    ctr[ADMISSIONS] += 1
    R.admitted[r] = ctr[ADMISSIONS]


@njit(cache=True)
def _begin_step(d, m, now, R, D, ctr, heap):
    """Continuous batching: swapped-out requests back in first when they fit, then those
    whose KV arrived; a non-empty micro-batch starts its pass through every stage."""
    cap_b = D.max_batch[d]
    while D.s_head[d] >= 0 and D.mb_count[m] < cap_b:
        r = D.s_head[d]
        ctx = R.inp[r] + R.out[r] - R.left[r]
        tok = D.reserved[d] + D.held[d]
        if tok + ctx > D.cap[d] and tok > 0:
            break
        _pop(D.s_head, D.s_tail, R.dlink, d)
        _join(d, m, r, ctx, R, D, ctr)
    while D.w_head[d] >= 0 and D.mb_count[m] < cap_b:
        r = _pop(D.w_head, D.w_tail, R.dlink, d)
        need = R.inp[r] + 1
        D.reserved[d] -= need
        _join(d, m, r, need, R, D, ctr)
    b = D.mb_count[m]
    if b == 0:
        D.mb_run[m] = False
        return
    D.mb_run[m] = True
    a, bb, c, dd = D.terms[d, 0], D.terms[d, 1], D.terms[d, 2], D.terms[d, 3]
    w = a if a > bb * b else bb * b
    compute = D.layers[d] * (w + c * D.mb_ctx[m] + dd)
    t = _flow_shop(D.free[d], D.nst[d], now, compute, D.extra[d], b)
    D.n_passes[d] += 1
    D.n_batched[d] += b
    _push(heap, ctr, t, PASS_DONE, d, m)


@njit(cache=True)
def _wake_idle(d, now, R, D, ctr, heap):
    for m in range(D.mb0[d], D.mb0[d] + D.nst[d]):
        if not D.mb_run[m]:
            _begin_step(d, m, now, R, D, ctr, heap)


@njit(cache=True)
def _finish(r, now, R, ctr):
    R.finish[r] = now
    ctr[SYS_LEN] -= 1
    ctr[DONE] += 1


@njit(cache=True)
def _preempt(d, m, now, R, D, ctr, heap, kv_bytes_per_token, swap_bps):
    """vLLM's rule when the cache is full: the micro-batch's newest request leaves, its KV
    out to host memory and back, one delay before it may rejoin."""
    size = D.mb_count[m]
    best = 0
    for i in range(1, size):
        if R.admitted[D.mb_req[m, i]] > R.admitted[D.mb_req[m, best]]:
            best = i
    r, end = D.mb_req[m, best], D.mb_end[m, best]
    _mb_remove(D.mb_end, D.mb_req, m, size, best)
    D.mb_count[m] -= 1
    R.left[r] = end - D.mb_step[m]
    ctx = R.inp[r] + R.out[r] - R.left[r]
    D.mb_ctx[m] -= ctx
    D.held[d] -= ctx
    ctr[PREEMPTIONS] += 1
    D.swapping[d] += 1
    per_gpu = ctx * kv_bytes_per_token / D.gpus[d]
    _push(heap, ctr, now + 2 * per_gpu / swap_bps, SWAPPED_IN, d, r)


@njit(cache=True)
def _step_done(d, m, now, R, D, ctr, acc, heap, kv_bytes_per_token, swap_bps):
    D.mb_step[m] += 1
    step = D.mb_step[m]
    D.mb_ctx[m] += D.mb_count[m]
    D.held[d] += D.mb_count[m]
    while D.mb_count[m] > 0 and D.mb_end[m, 0] <= step:
        r = D.mb_req[m, 0]
        _mb_remove(D.mb_end, D.mb_req, m, D.mb_count[m], 0)
        D.mb_count[m] -= 1
        gone = R.inp[r] + R.out[r]
        D.mb_ctx[m] -= gone
        D.held[d] -= gone
        D.members[d] -= 1
        _finish(r, now, R, ctr)
    while D.reserved[d] + D.held[d] > D.cap[d] and D.mb_count[m] > 1:
        _preempt(d, m, now, R, D, ctr, heap, kv_bytes_per_token, swap_bps)
    _note_kv(d, D, acc, ctr)
    _begin_step(d, m, now, R, D, ctr, heap)
    if D.p_head[d] >= 0:
        _kv_try(d, now, R, D, ctr, acc, heap)


# -- the run ---------------------------------------------------------------------------
@njit(cache=True)
def run_core(R, P, D, ctr, acc, timeline, options):
    """One run over requests sorted by arrival. ``options``: (KV bytes per token, swap
    bytes/s, KV samples). Fills ``R``'s times, the sides' statistics,
    ``ctr``, ``acc`` and ``timeline`` (time, KV fraction); returns (end time, samples)."""
    kvpt, swap_bps, samples = options[0], options[1], int(options[2])
    n = R.arrival.shape[0]
    n_pre, n_dec = P.nst.shape[0], D.nst.shape[0]
    slots = np.empty(n_dec)
    for j in range(n_dec):
        slots[j] = D.max_batch[j] * D.nst[j]
    cap_total = 0.0
    for j in range(n_dec):
        cap_total += D.cap[j]
    heap = [(0.0, 0, 0, 0, 0)]
    heap.pop()
    nxt = 0
    _push(heap, ctr, R.arrival[0], ARRIVE, 0, 0)
    span = max(R.arrival[n - 1] - R.arrival[0], 1e-3)
    sample_dt = span / max(1, samples // 2)
    _push(heap, ctr, 0.0, KV_SAMPLE, 0, 0)
    kept = 0
    now = 0.0
    while len(heap) > 0:
        t, _, kind, a, b = heapq.heappop(heap)
        if ctr[DONE] == n and kind == KV_SAMPLE:
            continue
        dt = t - acc[LAST_T]
        if dt > 0:
            acc[Q_AREA] += ctr[Q_LEN] * dt
            acc[SYS_AREA] += ctr[SYS_LEN] * dt
            acc[LAST_T] = t
        now = t
        ctr[EVENTS] += 1
        if kind == ARRIVE:
            r = nxt
            nxt += 1
            if nxt < n:
                _push(heap, ctr, R.arrival[nxt], ARRIVE, 0, 0)
            p = _pick(n_pre, P.work, P.speed, False, R.pre_draws[r])
            R.pre_of[r] = p
            _append(P.q_head, P.q_tail, R.link, p, r)
            P.work[p] += R.inp[r]
            ctr[Q_LEN] += 1
            ctr[SYS_LEN] += 1
            _admit(p, now, R, P, ctr, heap)
        elif kind == PREFILLED:
            p = a
            P.work[p] -= P.b_tok[b]
            P.requests[p] -= P.b_size[b]
            P.batches[p] -= 1
            r = P.b_head[b]
            size = P.b_size[b]
            _admit(p, now, R, P, ctr, heap)  # the slots it frees admit more
            for _ in range(size):
                after = R.link[r]
                R.first[r] = now
                if R.out[r] <= 1:
                    _finish(r, now, R, ctr)
                else:
                    d = _pick(n_dec, D.members, slots, True, R.dec_draws[r])
                    R.dec_of[r] = d
                    D.members[d] += 1
                    _append(D.p_head, D.p_tail, R.dlink, d, r)
                    _kv_try(d, now, R, D, ctr, acc, heap)
                r = after
        elif kind == KV_DONE:
            R.kv_done[a] = now
            _append(D.w_head, D.w_tail, R.dlink, b, a)
            _wake_idle(b, now, R, D, ctr, heap)
        elif kind == PASS_DONE:
            _step_done(a, b, now, R, D, ctr, acc, heap, kvpt, swap_bps)
        elif kind == SWAPPED_IN:
            D.swapping[a] -= 1
            _append(D.s_head, D.s_tail, R.dlink, a, b)
            _wake_idle(a, now, R, D, ctr, heap)
        else:  # KV_SAMPLE
            used = 0.0
            for j in range(n_dec):
                used += D.reserved[j] + D.held[j]
            timeline[kept, 0] = now
            timeline[kept, 1] = used / cap_total if cap_total > 0 else 0.0
            kept += 1
            if kept >= 2 * samples:  # keep every other sample, double the period
                half = 0
                for i in range(0, kept, 2):
                    timeline[half, 0], timeline[half, 1] = timeline[i, 0], timeline[i, 1]
                    half += 1
                kept = half
                sample_dt *= 2
            if len(heap) > 0:
                _push(heap, ctr, now + sample_dt, KV_SAMPLE, 0, 0)
    return now, kept
