"""A decode group's all-reduce on links that KV transfers share (docs/costmodel.md "An
all-reduce beside the KV transfers").

Holds ``allreduce_stretch`` (and ``allreduce_stretches`` for arrays): the mean factor by
which a tensor group's all-reduce traffic on one link is slowed when KV transfers arrive on
that link at random; ``SharedTraffic``: a group's all-reduce laid out to be priced under
such stretches with numpy.

The rule is the simulator's fluid sharing (``controller/sim/network.py``): a link is shared
equally by what crosses it, a KV transfer counting as one transfer for its whole life and a
stage iteration as ``w`` of one, ``w`` being the share of the iteration's time alone that the
link spends on its bytes; the link's stretch factor is ``max(1, n)`` with ``n`` the sum.

With the group always iterating (a busy decode instance) and KV transfers arriving as a
Poisson stream that alone would keep the link busy ``u`` of the time, the number ``N`` of
transfers in flight is a birth-death chain: with ``n`` of them each moves at ``1 / (n + w)``
of its speed alone, so the transfers together are served at ``n / (n + w)`` of the link.
Its balance equations give ``P(N = n) = (1 - u)^(1 + w) (1 + w)_n u^n / n!`` (a negative
binomial: ``(a)_n`` is the rising factorial), hence ``P(N = 0) = (1 - u)^(1 + w)`` and
``E[N] = (1 + w) u / (1 - u)``. The iteration's bytes on the link move at stretch 1 while no
transfer is in flight and ``N + w`` otherwise, so on average at

    E[max(1, N + w)] = P(N = 0) + E[N] + w (1 - P(N = 0)).

At ``u = 0`` this is 1; it grows without bound as ``u`` nears 1 (the link saturates). The
mean stretch stands for the iteration's mean time (the iteration's time is affine in the
stretch, so its mean is exact; the rate of iterations is its harmonic mean, at most the
mean stretch's: 2% on the 8tracks-16 summarization plan, docs/costmodel.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.costmodel.network import CompiledPhase
from controller.topology.fabric import Edge


def allreduce_stretch(u: float, w: float) -> float:
    """The mean stretch factor of a stage's all-reduce bytes on a link whose KV transfers,
    alone, keep it busy ``u`` of the time (0 <= u), the stage's own traffic keeping it busy
    ``w`` of its iterations' time (clamped to [0, 1]). ``inf`` when ``u >= 1``. O(1)."""
    return float(allreduce_stretches(np.array([u]), np.array([w]))[0])


def allreduce_stretches(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``allreduce_stretch`` of each (u, w), for arrays (the one place its formula is
    written)."""
    u = np.asarray(u, dtype=float)
    w = np.clip(np.asarray(w, dtype=float), 0.0, 1.0)
    out = np.ones(u.shape)
    some = (u > 0.0) & (u < 1.0)
    uu, ww = u[some], w[some]
    idle = (1.0 - uu) ** (1.0 + ww)
    out[some] = idle + (1.0 + ww) * uu / (1.0 - uu) + ww * (1.0 - idle)
    out[u >= 1.0] = np.inf
    return out


class SharedTraffic:
    """A group's all-reduce (its compiled phases) laid out to be priced under link loads
    with numpy: per link, seconds busy per byte of message; per phase, its flows' terms as
    a padded matrix of seconds per byte and link numbers. Built once per group and scheme."""

    def __init__(self, phases: Sequence[CompiledPhase]) -> None:
        index: dict[Edge, int] = {}
        per_byte: list[float] = []
        self.phases: list[tuple[float, float, np.ndarray, np.ndarray, np.ndarray, bool]] = []
        for c in phases:
            width = max((len(t) for t, _ in c.flows), default=0)
            k = np.zeros((len(c.flows), width))
            idx = np.zeros((len(c.flows), width), dtype=np.intp)
            for i, (terms, _) in enumerate(c.flows):
                for j, (e, ke) in enumerate(terms):
                    n = index.setdefault(e, len(index))
                    if n == len(per_byte):
                        per_byte.append(0.0)
                    k[i, j], idx[i, j] = ke, n
            # a link's seconds per byte counted once per phase (every flow's term on it is
            # the link's whole load; priced alone, each flow's term is its own bytes, which
            # add up to the load), times the phase's rounds
            if c.alone:
                for terms, _ in c.flows:
                    for e, ke in terms:
                        per_byte[index[e]] += c.rounds * ke
            else:
                for e, ke in {e: ke for terms, _ in c.flows for e, ke in terms}.items():
                    per_byte[index[e]] += c.rounds * ke
            lat = np.array([lat for _, lat in c.flows], dtype=float)
            self.phases.append((c.rounds, c.const_s, k, idx, lat, c.by_max))
        self.links = list(index)
        self.per_byte = np.array(per_byte, dtype=float)

    def time(self, nbytes: float, stretch: np.ndarray) -> float:
        """One all-reduce of ``nbytes`` with each link's seconds per byte multiplied by
        ``stretch`` (per link of ``links``); ``CompiledPhase.stretched_time`` summed."""
        total = 0.0
        for rounds, const, k, idx, lat, by_max in self.phases:
            if not len(lat):
                total += const
                continue
            ks = k * stretch[idx]  # padding: k = 0
            slope = ks.max(axis=1) if by_max else ks.sum(axis=1)
            total += rounds * float(np.max(nbytes * slope + lat)) + const
        return total
