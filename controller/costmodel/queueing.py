"""Queueing delay (paper §III-C1): Pollaczek-Khinchine for deterministic service,
T_queue = lambda T_serve^2 / (2 (1 - rho)), rho = lambda T_serve."""

from __future__ import annotations

import math


def pk_queue_delay(rate: float, service_s: float) -> float:
    """Mean wait in queue, s. ``rho >= 1`` is unstable: the wait is infinite, not negative."""
    if rate < 0 or service_s < 0:
        raise ValueError("rate and service time must be non-negative")
    rho = rate * service_s
    if rho >= 1.0:
        return math.inf
    return rate * service_s**2 / (2.0 * (1.0 - rho))


def max_rate_within(latency_bound_s: float, fixed_s: float, service_s: float) -> float:
    """Largest arrival rate with ``fixed_s + pk_queue_delay(rate, service_s) <= bound``.

    ``service_s`` is the time the queue's server is busy per request (a pipeline's slowest
    stage), ``fixed_s`` what a request spends outside the queue. From
    lambda S^2 / (2 (1 - lambda S)) <= W  =>  lambda <= 2W / (S (S + 2W)), W = bound - fixed.
    Returns 0 when even an empty queue misses the bound."""
    slack = latency_bound_s - fixed_s
    if slack < 0 or service_s <= 0:
        return 0.0 if slack < 0 else math.inf
    return 2.0 * slack / (service_s * (service_s + 2.0 * slack))
