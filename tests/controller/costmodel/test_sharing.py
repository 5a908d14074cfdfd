"""``costmodel.sharing``: the all-reduce stretch under KV transfers, against the birth-death
chain it is derived from, hand values, and a direct event simulation of the fluid sharing
rule (the simulator's: equal shares, a KV transfer weighing 1, the iteration ``w``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.costmodel.network import CompiledPhase
from controller.costmodel.sharing import SharedTraffic, allreduce_stretch, allreduce_stretches


def chain_stretch(u: float, w: float, n_max: int = 4000) -> float:
    """E[max(1, N + w)] with N the birth-death chain of transfers: arrivals u (per mean
    transfer), n in flight served together at n / max(1, n + w) of the link."""
    p = [1.0]
    for n in range(1, n_max):
        p.append(p[-1] * u * max(1.0, n + w) / n)
    probs = np.array(p) / sum(p)
    n = np.arange(n_max)
    return float(np.sum(probs * np.maximum(1.0, n + w) * (n > 0)) + probs[0])


def test_hand_values():
    # w = 0: P(N = 0) = 1 - u, E[N] = u / (1 - u): at u = 1/2, 1/2 + 1 = 1.5
    assert allreduce_stretch(0.5, 0.0) == pytest.approx(1.5, rel=1e-15)
    # w = 1: N + 1 >= 1 always, N negative binomial (2, 1/2), E[N] = 2: 3
    assert allreduce_stretch(0.5, 1.0) == pytest.approx(3.0, rel=1e-15)
    assert allreduce_stretch(0.0, 0.3) == 1.0
    assert allreduce_stretch(1.0, 0.3) == math.inf
    assert allreduce_stretch(0.5, 7.0) == allreduce_stretch(0.5, 1.0)  # w is a share


@pytest.mark.parametrize("u", [0.05, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("w", [0.0, 0.1, 0.26, 0.7, 1.0])
def test_closed_form_is_the_chain(u, w):
    assert allreduce_stretch(u, w) == pytest.approx(chain_stretch(u, w), rel=1e-9)


def test_arrays_match_the_scalar():
    u = np.array([0.0, 0.2, 0.5, 0.99, 1.0, 1.5])
    w = np.array([0.5, 0.0, 0.3, 1.0, 0.2, 0.1])
    got = allreduce_stretches(u, w)
    want = [allreduce_stretch(a, b) for a, b in zip(u, w, strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-15)


def test_fluid_sharing_simulated_by_events():
    """Poisson transfers of exponential size on one link beside an iteration of weight w
    that never stops: the time-average of the iteration's stretch (1 with no transfer,
    N + w with N in flight) where the simulator's rule shares the link, over 100,000
    transfers. The chain's figure within 2% (M/G/1 processor sharing, 1 / (1 - u) = 2.5,
    would be 6% above it)."""
    rng = np.random.default_rng(7)
    u, w = 0.6, 0.25
    arrivals = np.cumsum(rng.exponential(1.0 / u, 100_000))
    sizes = rng.exponential(1.0, len(arrivals))
    t, area, k = 0.0, 0.0, 0
    left: list[float] = []  # work left of each transfer in flight, at full link speed
    while k < len(arrivals) or left:
        x = max(1.0, len(left) + w)
        nxt = arrivals[k] if k < len(arrivals) else math.inf
        first = min(range(len(left)), key=left.__getitem__) if left else -1
        end = t + left[first] * x if left else math.inf
        to = min(nxt, end)
        area += (to - t) * (x if left else 1.0)
        left = [r - (to - t) / x for r in left]
        t = to
        if to == end:
            left.pop(first)
        else:
            left.append(float(sizes[k]))
            k += 1
    assert area / t == pytest.approx(allreduce_stretch(u, w), rel=0.02)


def test_shared_traffic_prices_as_the_compiled_phases():
    a, b, c = ("x", "s"), ("s", "y"), ("y", "s")
    ring = CompiledPhase(
        rounds=6.0,
        flows=((((a, 1e-11), (b, 1e-11)), 4e-6), (((c, 2e-11),), 3e-6)),
        const_s=1e-6,
        slopes=(1e-11, 2e-11),
        loads=((a, 1.0), (b, 1.0), (c, 2.0)),
        by_max=True,
    )
    paper = CompiledPhase(
        rounds=1.0,
        flows=((((a, 1e-11), (b, 3e-11)), 1e-6),),
        const_s=0.0,
        slopes=(4e-11,),
        loads=((a, 1.0), (b, 3.0)),
        by_max=False,
    )
    tr = SharedTraffic([ring, paper])
    assert tr.links == [a, b, c]
    # seconds per byte each link is busy: rounds x its term, once per phase
    assert tr.per_byte.tolist() == pytest.approx([6e-11 + 1e-11, 6e-11 + 3e-11, 12e-11])
    d = 1e6
    ones = np.ones(3)
    assert tr.time(d, ones) == pytest.approx(ring.time(d) + paper.time(d), rel=1e-15)
    s = np.array([1.0, 2.5, 1.2])
    want = ring.stretched_time(d, dict(zip(tr.links, s, strict=True))) + paper.stretched_time(
        d, dict(zip(tr.links, s, strict=True))
    )
    assert tr.time(d, s) == pytest.approx(want, rel=1e-15)
    # by hand: the ring's slowest flow is now the first (1e-11 x 2.5 per byte), the paper
    # phase sums 1e-11 + 3e-11 x 2.5
    assert tr.time(d, s) == pytest.approx(
        6 * max(d * 2.5e-11 + 4e-6, d * 2.4e-11 + 3e-6) + 1e-6 + d * 8.5e-11 + 1e-6, rel=1e-12
    )
