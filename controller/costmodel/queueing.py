"""Queueing delay (paper §III-C1, docs/costmodel.md "Latency, rate and the objective").

- ``pk_queue_delay``: Pollaczek-Khinchine for deterministic service,
  T_queue = lambda T_serve^2 / (2 (1 - rho)), rho = lambda T_serve.
- ``PrefillTimes``, ``pipeline_ttft_cdf``, ``pipeline_ttft_quantile``, ``pipeline_max_rate``:
  TTFT of a FIFO prefill pipeline fed by Poisson arrivals of requests of varied lengths, as
  the simulator runs it: no request overtakes another in the pipeline, so a short request
  that follows a long one leaves after it (``pipeline_ttft_cdf`` gives the closed form).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


def pk_queue_delay(rate: float, service_s: float) -> float:
    """Mean wait in queue, s. ``rho >= 1`` is unstable: the wait is infinite, not negative."""
    if rate < 0 or service_s < 0:
        raise ValueError("rate and service time must be non-negative")
    rho = rate * service_s
    if rho >= 1.0:
        return math.inf
    return rate * service_s**2 / (2.0 * (1.0 - rho))


@dataclass(frozen=True)
class PrefillTimes:
    """A prefill instance's times per request length: ``alone`` (through every stage, alone
    in the pipeline), ``busiest`` (its busiest stage, hop included), ``weights`` (the share of
    requests of that length, summing to 1), and ``q``, the TTFT percentile the SLA asks for."""

    alone: np.ndarray
    busiest: np.ndarray
    weights: np.ndarray
    q: float
    _sorted: np.ndarray = field(init=False, repr=False, compare=False)
    _w_sorted: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_wt: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_w: np.ndarray = field(init=False, repr=False, compare=False)
    # percentile per rate: the search combines the same instances at the same rates again
    _quantiles: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=float)
        if len(w) == 0 or len(w) != len(self.alone) or len(w) != len(self.busiest):
            raise ValueError("alone, busiest and weights need one entry per length")
        w = w / w.sum()
        object.__setattr__(self, "weights", w)
        order = np.argsort(self.alone, kind="stable")
        a, ws = np.asarray(self.alone, dtype=float)[order], w[order]
        # suffix sums: sum over lengths with alone >= a[i] of w * alone, and of w
        object.__setattr__(self, "_sorted", a)
        object.__setattr__(self, "_w_sorted", ws)
        object.__setattr__(self, "_tail_wt", np.append(np.cumsum((ws * a)[::-1])[::-1], 0.0))
        object.__setattr__(self, "_tail_w", np.append(np.cumsum(ws[::-1])[::-1], 0.0))

    @property
    def mean_busiest(self) -> float:
        return float(np.dot(self.weights, self.busiest))

    @property
    def mean_busiest_sq(self) -> float:
        return float(np.dot(self.weights, np.square(self.busiest)))

    def excess(self, y: np.ndarray) -> np.ndarray:
        """E[(alone - y)^+] over the lengths' distribution, for each entry of ``y``."""
        i = np.searchsorted(self._sorted, y, side="right")
        return self._tail_wt[i] - y * self._tail_w[i]


def _wait(rate: float, t: PrefillTimes) -> tuple[float, float]:
    """(rho, P-K mean wait) of the busiest stage as an M/G/1 server; rho >= 1: (rho, inf)."""
    rho = rate * t.mean_busiest
    if rho >= 1.0:
        return rho, math.inf
    return rho, rate * t.mean_busiest_sq / (2.0 * (1.0 - rho))


def pipeline_ttft_cdf(bound_s: float, rate: float, t: PrefillTimes) -> float:
    """P(TTFT <= ``bound_s``) at Poisson ``rate`` requests/s into one FIFO pipeline.

    A request of length j is served in ``alone_j`` after a wait W at the busiest stage (the
    Pollaczek-Khinchine mean wait of an M/G/1 server with service ``busiest``). It cannot
    leave before any earlier request i has left and its own last stage has run: i, arrived u
    seconds before, leaves about alone_i + W + rho u after that arrival (the requests between
    them add their busiest-stage work, rho per second), so j misses the bound when
    u < (alone_i + busiest_j + W - bound) / (1 - rho). Poisson arrivals make the number of
    such i Poisson, with mean rate E[(alone + busiest_j + W - bound)^+] / (1 - rho); j meets
    the bound when it has none and alone_j + W <= bound:

        P = sum_j w_j [alone_j + W <= bound] exp(-rate E[(alone + busiest_j + W - bound)^+]
                                                 / (1 - rho)),   rho = rate E[busiest].

    0 when the busiest stage is saturated (rho >= 1)."""
    rho, wait = _wait(rate, t)
    if not math.isfinite(wait):
        return 0.0
    own = t.alone + wait <= bound_s
    if rate <= 0.0:
        return float(np.dot(t.weights, own))
    shadow = t.excess(bound_s - t.busiest - wait) * (rate / (1.0 - rho))
    return float(np.dot(t.weights, own * np.exp(-shadow)))


BISECT_STEPS = 40  # to 2^-40 of the bracket: below any figure the plan prints


def pipeline_ttft_quantile(rate: float, t: PrefillTimes) -> float:
    """The TTFT that ``t.q`` of the requests meet at ``rate`` (the smallest bound with
    ``pipeline_ttft_cdf >= q``, by bisection); inf when the pipeline is saturated.
    Memoised per rate on ``t``."""
    hit = t._quantiles.get(rate)
    if hit is None:
        hit = _quantile(rate, t)
        if len(t._quantiles) < 10_000:
            t._quantiles[rate] = hit
    return hit


def _quantile(rate: float, t: PrefillTimes) -> float:
    _, wait = _wait(rate, t)
    if not math.isfinite(wait):
        return math.inf
    top = float(np.max(t.alone) + np.max(t.busiest) + wait)  # everyone meets it by then
    return _edge(lambda x: pipeline_ttft_cdf(x, rate, t) < t.q, 0.0, top)[1]


def _edge(below: Callable[[float], bool], lo: float, hi: float) -> tuple[float, float]:
    """(lo, hi) narrowed by ``BISECT_STEPS`` bisections around where ``below`` turns false
    (true at ``lo``, false at ``hi``)."""
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if below(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def pipeline_max_rate(bound_s: float, t: PrefillTimes) -> float:
    """The largest Poisson rate at which ``t.q`` of the requests meet ``bound_s``
    (``pipeline_ttft_cdf`` falls as the rate grows; bisection below saturation). 0 when even
    requests alone miss it."""
    if pipeline_ttft_cdf(bound_s, 0.0, t) < t.q:
        return 0.0
    return _edge(lambda r: pipeline_ttft_cdf(bound_s, r, t) >= t.q, 0.0, 1.0 / t.mean_busiest)[0]


# -- a pipeline that holds at most a few requests (the engines' batch queue): on branch
# prefill-slots, not used by the planner yet (docs/planner.md, "With vLLM's own prefill
# admission ...") --


def slotted_departures(stage_s: np.ndarray, slots: int) -> np.ndarray:
    """Departure times (s) of requests that are all waiting at time 0, through a FIFO
    pipeline that admits request k only when request k - ``slots`` has left (vLLM keeps at
    most PP batches in flight; a long prompt fills a batch alone). ``stage_s[k, i]``: request
    k's time at stage i. Request k leaves stage i at D[k][i] = max(D[k][i-1], D[k-1][i]) +
    s[k][i], entering at D[k-slots][last]; each row is one max-plus scan,
    D[k] = c + max.accumulate(E - c + s[k]) with c the row's running sum. O(requests x
    stages)."""
    s = np.asarray(stage_s, dtype=float)
    if s.ndim != 2 or slots < 1:
        raise ValueError("stage_s needs one row per request and slots must be at least 1")
    n, stages = s.shape
    done = np.zeros((n, stages))
    prev = np.zeros(stages)
    for k in range(n):
        entry = prev.copy()
        entry[0] = max(entry[0], done[k - slots, -1] if k >= slots else 0.0)
        c = np.cumsum(s[k])
        done[k] = c + np.maximum.accumulate(entry - c + s[k])
        prev = done[k]
    return done[:, -1]


def slotted_pipeline_rate(
    stage_s: np.ndarray, weights: np.ndarray, slots: int, requests: int = 4000, seed: int = 0
) -> float:
    """Saturated throughput (requests/s) of ``slotted_departures``' pipeline: ``stage_s[i, j]``
    is stage i's time for length class j, ``weights[j]`` that class's share; ``requests``
    lengths drawn from the weights (``seed``), over the last departure."""
    w = np.asarray(weights, dtype=float)
    rng = np.random.default_rng(seed)
    jobs = rng.choice(len(w), size=requests, p=w / w.sum())
    out = slotted_departures(np.asarray(stage_s, dtype=float)[:, jobs].T, slots)
    return requests / float(out[-1])


def slotted_batch_rate(
    lengths: np.ndarray,
    weights: np.ndarray,
    stage_s_of: Callable[[float, float], np.ndarray],
    slots: int,
    budget: int,
    requests: int = 4000,
    seed: int = 0,
) -> float:
    """Saturated throughput (requests/s) of ``slotted_departures``' pipeline when every batch
    takes the waiting requests in order up to ``budget`` tokens (at least one), as vLLM forms
    a batch once its PP slots are full: prompts of ``lengths`` tokens (``weights`` their
    shares, ``requests`` drawn with ``seed``); ``stage_s_of(k, k2)`` prices a batch of k
    tokens (k2 the sum of their squares) at every stage."""
    w = np.asarray(weights, dtype=float)
    rng = np.random.default_rng(seed)
    drawn = np.asarray(lengths, dtype=float)[rng.choice(len(w), size=requests, p=w / w.sum())]
    rows, k, k2 = [], 0.0, 0.0
    for x in drawn:
        if k and k + x > budget:
            rows.append(stage_s_of(k, k2))
            k = k2 = 0.0
        k, k2 = k + x, k2 + x * x
    rows.append(stage_s_of(k, k2))
    out = slotted_departures(np.vstack(rows), slots)
    return requests / float(out[-1])
