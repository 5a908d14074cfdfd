"""Every planner's plan measured the same way (``heroserve compare``, in controller/cli/):

- :func:`sla_rate`: the largest request rate at which a plan still serves the SLA's share of
  requests, by bisection;
- :func:`attainment_at_rate`: the simulator that measures it (``controller.sim`` for
  disaggregated plans, ``controller.related.colocated`` for colocated ones);
- :data:`OPTIMISES`, :data:`SHORT`: what each planner optimises, long and short.

One measure for every plan: Eq. 1's H, whatever each planner aimed at.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import networkx as nx

from controller.plan import Plan
from controller.workload import Workload


def sla_rate(
    attainment_at: Callable[[float], float], guess: float, target: float, steps: int
) -> tuple[float, float]:
    """(largest rate with attainment >= target, its attainment) by bisection, starting from
    the bracket [0, 2 * guess] (doubled while its top still meets the target, at most 4 times).
    0 when even the lowest rate tried misses."""
    hi = max(guess, 1e-3) * 2.0
    at_hi = attainment_at(hi)
    grow = 0
    while at_hi >= target and grow < 4:
        hi *= 2
        at_hi = attainment_at(hi)
        grow += 1
    if at_hi >= target:
        return hi, at_hi
    lo, at_lo = 0.0, math.nan
    for _ in range(steps):
        mid = (lo + hi) / 2
        a = attainment_at(mid)
        if a >= target:
            lo, at_lo = mid, a
        else:
            hi = mid
    return lo, at_lo


def attainment_at_rate(
    plan: Plan, g: nx.Graph, w: Workload, count: Callable[[float], int], seed: int, target: float
) -> Callable[[float], float]:
    """Attainment at a rate, ``count(rate)`` requests per point. A colocated run stops once
    enough requests miss the SLA that ``target`` is out of reach (its attainment is then a
    figure below ``target``, not the full run's)."""
    from controller.sim import make_requests

    if plan.layout == "colocated":
        from controller.related.colocated import ColocatedOptions, ColocatedSim, build_colocated

        cm = build_colocated(plan, g, w)

        def colocated(rate: float) -> float:
            n = count(rate)
            stop = n - math.floor(target * n) + 1  # then fewer than target * n can meet it
            opts = ColocatedOptions(seed=seed, stop_misses=stop)
            return ColocatedSim(cm, opts).run(make_requests(w, rate, n, seed)).attainment

        return colocated
    from controller.sim import SimOptions, build_model
    from controller.sim.engine import Simulator

    dm = build_model(plan, g, w)
    return lambda rate: (
        Simulator(dm, SimOptions(seed=seed))
        .run(make_requests(w, rate, count(rate), seed))
        .attainment
    )
