"""The engines' prefill pool as an executable model (docs/costmodel.md, "The engines'
admission"): prompts arrive, the router sends each to the instance with the least work, and
each instance admits them in batches as vLLM's engine core does (``BatchAdmission``: at most
PP batches and ``--max-num-seqs`` requests in flight, each batch up to the token budget)
into a FIFO pipeline whose stages take times affine in the batch's tokens (a proportionate
flow shop). What it leaves out is the network's load on the stages' all-reduces and hops.

- ``ROUTE_ALL_MAX``: up to this many instances the router compares them all, above it two.
- ``pool_run``: every request's first-token time, and every batch's (departure, size).
- ``saturated_departures``, ``saturated_rate``: one instance with every prompt waiting at 0,
  the throughput the engine's limits allow (``PrefillTimes.capacity``).
- ``PoolSample``, ``pool_ttft_quantile``, ``pool_max_rate``: the SLA's percentile of TTFT at
  a rate, over one fixed sample of arrivals scaled to the rate (common random numbers, so
  the percentile rises with the rate as a bisection needs), and the largest rate meeting a
  bound.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.costmodel.queueing import bisect_edge
from controller.models.engines import BatchAdmission

ROUTE_ALL_MAX = 8  # the router compares every instance up to this many (Simulator._choose)
BEHIND = 2.0  # last quarter's mean TTFT over the first's past which the pool falls behind


class _Pipeline:
    """One instance: its queue, the batches in flight (departure, requests, tokens) in
    admission order, and when each stage is next free."""

    __slots__ = ("a", "b", "c", "free", "queue", "flight", "held", "work", "speed")

    def __init__(self, cost: np.ndarray, mean_prompt: float) -> None:
        cost = np.asarray(cost, dtype=float)
        if cost.ndim != 2 or cost.shape[1] != 3 or len(cost) == 0:
            raise ValueError("stage_cost needs one (a, b, c) row per stage")
        self.a, self.b, self.c = (cost[:, j].tolist() for j in range(3))
        self.free = [0.0] * len(self.a)
        self.queue: deque[int] = deque()
        self.flight: deque[tuple[float, int, float]] = deque()
        self.held = 0
        self.work = 0.0  # tokens queued or in flight: the router's load
        # seconds per token of a mean prompt alone, the router's weight (Simulator.speed)
        m = max(mean_prompt, 1.0)
        self.speed = (
            sum(x + y * m + z * m * m for x, y, z in zip(self.a, self.b, self.c, strict=True)) / m
        )

    def admit(self, t: float, prompts: Sequence[float], adm: BatchAdmission, out: list) -> list:
        """Batches started at ``t`` while both limits allow; each request's departure goes
        into ``out``. Returns the departures started. A batch leaves stage s at
        max(it left s - 1, the batch ahead left s) + its time at s."""
        started = []
        while self.queue and len(self.flight) < adm.slots and self.held < adm.max_requests:
            k = k2 = 0.0
            batch = []
            while self.queue and self.held + len(batch) < adm.max_requests:
                x = float(prompts[self.queue[0]])
                if batch and k + x > adm.budget:
                    break
                batch.append(self.queue.popleft())
                k, k2 = k + x, k2 + x * x
            done = t
            for s, p in enumerate(self.free):
                done = (done if done > p else p) + self.a[s] + self.b[s] * k + self.c[s] * k2
                self.free[s] = done
            self.flight.append((done, len(batch), k))
            self.held += len(batch)
            for r in batch:
                out[r] = done
            started.append((done, len(batch)))
        return started

    def leave(self) -> None:
        _, size, k = self.flight.popleft()
        self.held -= size
        self.work -= k


def pool_run(
    arrivals: Sequence[float],
    prompts: Sequence[float],
    stage_costs: Sequence[np.ndarray],
    admission: BatchAdmission,
    seed: int = 0,
) -> tuple[np.ndarray, list[tuple[float, int]]]:
    """(each request's first-token time, each batch's (departure, requests) in start order)
    when ``prompts[i]`` tokens arrive at ``arrivals[i]`` (sorted) at a pool of instances,
    one per ``stage_costs`` entry: stage i of it takes a + b k + c k2 for a batch of k tokens
    whose prompts' squares sum to k2, (a, b, c) its row i. Each arrival goes to the
    instance with the least work (tokens queued or in flight, weighted by its seconds per
    token), among more than ``ROUTE_ALL_MAX`` the better of two drawn with ``seed``.

    An event loop over arrivals and departures: every event at one instant is applied
    before any instance admits, so prompts waiting together share batches. O((requests +
    batches) (log batches + stages + min(instances, ROUTE_ALL_MAX)))."""
    n = len(prompts)
    if len(arrivals) != n:
        raise ValueError("arrivals and prompts need one entry per request")
    mean = float(np.mean(prompts)) if n else 1.0
    pipes = [_Pipeline(c, mean) for c in stage_costs]
    if not pipes:
        raise ValueError("a pool needs at least one instance")
    rng = random.Random(seed)
    done = [math.nan] * n
    batches: list[tuple[float, int]] = []
    heap: list[tuple[float, int, int]] = []  # (departure, start order, instance)
    order = 0
    i = 0
    while i < n or heap:
        t = min(heap[0][0] if heap else math.inf, arrivals[i] if i < n else math.inf)
        touched = set()
        while heap and heap[0][0] <= t:
            j = heapq.heappop(heap)[2]
            pipes[j].leave()
            touched.add(j)
        while i < n and arrivals[i] <= t:
            j = _choose(pipes, rng)
            pipes[j].queue.append(i)
            pipes[j].work += float(prompts[i])
            touched.add(j)
            i += 1
        for j in sorted(touched):
            for d, size in pipes[j].admit(t, prompts, admission, done):
                heapq.heappush(heap, (d, order, j))
                order += 1
                batches.append((d, size))
    return np.asarray(done), batches


def _choose(pipes: list[_Pipeline], rng: random.Random) -> int:
    if len(pipes) <= ROUTE_ALL_MAX:
        return min(range(len(pipes)), key=lambda j: pipes[j].work * pipes[j].speed)
    cands = rng.sample(range(len(pipes)), 2)
    return min(cands, key=lambda j: pipes[j].work * pipes[j].speed)


def saturated_departures(
    prompts: Sequence[float], stage_cost: np.ndarray, admission: BatchAdmission
) -> list[tuple[float, int]]:
    """(departure time s, requests) of each batch when ``prompts`` (tokens each) all wait at
    time 0 for one instance (``pool_run``): a batch starts at the first moment both limits
    allow (a departure frees a slot and its requests).

    ``pool_run``'s loop with one instance and every arrival at 0, its floats step for step
    (the same batch sums, stage recurrence and departure order), without what only a pool
    needs: routing each prompt, each request's first-token time, the router's work. The
    planner asks it for every distinct prefill instance it prices (346 times, 4,000 prompts
    each, planning 2tracks-240), where the general loop took a third of the plan's time;
    a test holds the two equal on random stage costs. The batches the token budget cuts are
    the same for every call with the same prompts (``_budget_batches``, kept for the last
    few prompt lists); where the requests-in-flight limit would cut one shorter, the loop
    forms the batches prompt by prompt instead."""
    cuts = _budget_batches(prompts, admission.budget)
    out = _departures(cuts, stage_cost, admission)
    if out is None:  # the in-flight limit cut a batch: form them prompt by prompt
        xs = [float(x) for x in prompts]
        out = _departures(xs, stage_cost, admission)
    assert out is not None
    return out


# (id of the prompt list, its length, budget) -> (the list, its batches), the list held so
# its id stays its own; the planner keeps one prompt sample per search, so a few entries
_CUTS: dict[tuple[int, int, int], tuple[Sequence[float], list[tuple[int, float, float]]]] = {}
_CUTS_MAX = 8


def _budget_batches(prompts: Sequence[float], budget: int) -> list[tuple[int, float, float]]:
    """(requests, tokens k, sum of squares k2) of each batch the token budget alone cuts
    from ``prompts`` in order, summed as ``_Pipeline.admit`` sums them."""
    key = (id(prompts), len(prompts), budget)
    hit = _CUTS.get(key)
    if hit is not None and hit[0] is prompts:
        return hit[1]
    cuts: list[tuple[int, float, float]] = []
    size, k, k2 = 0, 0.0, 0.0
    for x in prompts:
        x = float(x)
        if size and k + x > budget:
            cuts.append((size, k, k2))
            size, k, k2 = 0, 0.0, 0.0
        size, k, k2 = size + 1, k + x, k2 + x * x
    if size:
        cuts.append((size, k, k2))
    if len(_CUTS) >= _CUTS_MAX:
        _CUTS.pop(next(iter(_CUTS)))
    _CUTS[key] = (prompts, cuts)
    return cuts


def _departures(
    work: list, stage_cost: np.ndarray, admission: BatchAdmission
) -> list[tuple[float, int]] | None:
    """The batches of ``saturated_departures``. ``work``: the budget's batches as (requests,
    k, k2), or the prompts (floats) to form them one by one; with batches, None as soon as
    one would pass the requests-in-flight limit (which would have cut it shorter)."""
    pipe = _Pipeline(stage_cost, 1.0)
    a, b, c, free = pipe.a, pipe.b, pipe.c, pipe.free
    slots, cap, budget = admission.slots, admission.max_requests, admission.budget
    cut = bool(work) and isinstance(work[0], tuple)
    n, q, held, order = len(work), 0, 0, 0
    heap: list[tuple[float, int]] = []  # (departure, start order), popped as pool_run's
    flight: deque[int] = deque()  # requests per batch in flight, in admission order
    batches: list[tuple[float, int]] = []
    t = 0.0
    while True:
        while q < n and len(flight) < slots and held < cap:
            if cut:
                size, k, k2 = work[q]
                if held + size > cap:
                    return None
                q += 1
            else:
                k = k2 = 0.0
                size = 0
                while q < n and held + size < cap:
                    x = work[q]
                    if size and k + x > budget:
                        break
                    q, size, k, k2 = q + 1, size + 1, k + x, k2 + x * x
            done = t
            for s, p in enumerate(free):
                done = (done if done > p else p) + a[s] + b[s] * k + c[s] * k2
                free[s] = done
            heapq.heappush(heap, (done, order))
            flight.append(size)
            order += 1
            held += size
            batches.append((done, size))
        if not heap:
            return batches
        t = heap[0][0]
        while heap and heap[0][0] <= t:
            heapq.heappop(heap)
            held -= flight.popleft()  # as _Pipeline.leave: the oldest batch's requests


def saturated_rate(
    prompts: Sequence[float], stage_cost: np.ndarray, admission: BatchAdmission
) -> float:
    """Requests/s that ``saturated_departures``' pipeline serves in steady state: the
    requests after the first batch over the time from its departure to the last one's, which
    leaves out the pipeline's fill (one pass: (PP - 1) of 337 batches of chatbot's 4,000
    prompts, 3% at PP = 12). One batch: its requests over its departure."""
    out = saturated_departures(prompts, stage_cost, admission)
    (first, size), (last, _) = out[0], out[-1]
    if len(out) == 1:
        return size / first
    return (len(prompts) - size) / (last - first)


@dataclass(frozen=True)
class PoolSample:
    """One fixed draw of requests for the pool's percentile: ``gaps`` (unit-rate exponential
    inter-arrival times, scaled by 1 / rate), ``prompts`` (tokens each, drawn from the
    workload) and ``warmup`` (the share of the first arrivals left out: the pool starts
    empty)."""

    gaps: np.ndarray
    prompts: list[float]
    warmup: float = 0.1

    @staticmethod
    def draw(lengths: np.ndarray, share: np.ndarray, n: int, seed: int) -> PoolSample:
        rng = np.random.default_rng(seed)
        prompts = lengths[rng.choice(len(lengths), size=n, p=share)]
        return PoolSample(np.cumsum(rng.exponential(1.0, n)), prompts.astype(float).tolist())


def pool_ttft_quantile(
    rate: float,
    q: float,
    sample: PoolSample,
    stage_costs: Sequence[np.ndarray],
    admission: BatchAdmission,
) -> float:
    """The TTFT (s) that a share ``q`` of ``sample``'s requests meet at Poisson ``rate``
    requests/s into the pool (``pool_run``), past its warm-up; inf where the pool falls
    behind (its last quarter's mean TTFT passes ``BEHIND`` times its first quarter's)."""
    if rate <= 0.0:
        rate = 1e-9
    arrivals = (sample.gaps / rate).tolist()
    done, _ = pool_run(arrivals, sample.prompts, stage_costs, admission)
    start = int(len(arrivals) * sample.warmup)
    ttft = done[start:] - np.asarray(arrivals[start:])
    # a pool behind its arrivals waits longer the later a request comes: its backlog grows
    # from the warm-up on, so the last quarter's mean wait is about four times the first's
    # (their centres at 21% and 89% of the run); a stable queue's quarters agree within
    # their noise
    quarter = max(1, len(ttft) // 4)
    if float(np.mean(ttft[-quarter:])) > BEHIND * float(np.mean(ttft[:quarter])):
        return math.inf
    return float(np.quantile(ttft, q))


def pool_max_rate(
    bound_s: float,
    q: float,
    sample: PoolSample,
    stage_costs: Sequence[np.ndarray],
    admission: BatchAdmission,
    top: float,
    steps: int = 14,
) -> float:
    """The largest rate up to ``top`` req/s at which ``pool_ttft_quantile`` meets ``bound_s``,
    by ``steps`` bisections (2^-14 of ``top`` by default); 0 when even a trickle misses."""

    def meets(r: float) -> bool:
        return pool_ttft_quantile(r, q, sample, stage_costs, admission) <= bound_s

    if meets(top):
        return top
    if not meets(top * 2.0**-steps):
        return 0.0
    return bisect_edge(meets, 0.0, top, steps)[0]
