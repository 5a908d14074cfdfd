"""Queueing delay (paper §III-C1, docs/costmodel.md "Latency, rate and the objective").

- ``pk_queue_delay``: Pollaczek-Khinchine for deterministic service,
  T_queue = lambda T_serve^2 / (2 (1 - rho)), rho = lambda T_serve.
- ``PrefillTimes``, ``pipeline_ttft_cdf``, ``pipeline_ttft_quantile``, ``pipeline_max_rate``:
  TTFT of a FIFO prefill pipeline fed by Poisson arrivals of requests of varied lengths, as
  the simulator runs it: no request overtakes another in the pipeline, so a short request
  that follows a long one leaves after it (``pipeline_ttft_cdf`` gives the closed form).
  The search ranks prefill instances by it; the plan's own TTFT is the executable pool's
  (``prefill_pool``), whose one-instance saturated rate is ``PrefillTimes.capacity``.
- ``bisect_edge``: where a predicate turns false, by bisection.
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
    requests of that length, summing to 1), and ``q``, the TTFT percentile the SLA asks for.
    ``capacity``: the requests/s the instance serves saturated where the engine holds only a
    few batches in flight (``saturated_rate``); where that is below the open pipeline's
    1 / E[busiest], the busiest stage is priced as if slower by their ratio
    (``service_scale``), which is what a stage left idle waiting for a free slot costs."""

    alone: np.ndarray
    busiest: np.ndarray
    weights: np.ndarray
    q: float
    capacity: float = math.inf
    _sorted: np.ndarray = field(init=False, repr=False, compare=False)
    _w_sorted: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_wt: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_w: np.ndarray = field(init=False, repr=False, compare=False)
    # the queue's first two moments of service, fixed with the arrays: the bisections of
    # ``pipeline_ttft_cdf`` read them at every step
    _moments: tuple[float, float, float] = field(init=False, repr=False, compare=False)
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
        b = np.asarray(self.busiest, dtype=float)
        mean, mean_sq = float(np.dot(w, b)), float(np.dot(w, np.square(b)))
        scale = max(1.0, (1.0 / mean) / self.capacity)
        object.__setattr__(self, "_moments", (scale, mean * scale, mean_sq * scale**2))

    @property
    def service_scale(self) -> float:
        """How much slower than its busiest stage the instance serves saturated (>= 1)."""
        return self._moments[0]

    @property
    def mean_busiest(self) -> float:
        """Mean service time (s) of the queue that requests wait in: the busiest stage's,
        scaled by ``service_scale``."""
        return self._moments[1]

    @property
    def mean_busiest_sq(self) -> float:
        return self._moments[2]

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
    return bisect_edge(lambda x: pipeline_ttft_cdf(x, rate, t) < t.q, 0.0, top)[1]


def bisect_edge(
    below: Callable[[float], bool], lo: float, hi: float, steps: int = BISECT_STEPS
) -> tuple[float, float]:
    """(lo, hi) narrowed by ``steps`` bisections around where ``below`` turns false (true
    at ``lo``, false at ``hi``)."""
    for _ in range(steps):
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
    return bisect_edge(
        lambda r: pipeline_ttft_cdf(bound_s, r, t) >= t.q, 0.0, 1.0 / t.mean_busiest
    )[0]
