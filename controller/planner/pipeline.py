"""Pipeline stages (Eq. 6): the hop between two stages, and chaining groups into instances.

``PipelinePricer`` is the evaluator's pricer that prices a hop at any message size from two
latency matrices per stage pair (shared by stage pairs of the same shape), and chains a
pool's groups into instances of PP stages, cheapest hop first. Its caches (each bound where
it is declared): the hop matrices per stage pair and per shape, and the chains per set of
groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.planner.context import PricingContext
from controller.planner.grouping import latency_matrix


class PipelinePricer:
    """Prices pipeline hops on ``ctx`` and orders groups into pipeline stages."""

    def __init__(self, ctx: PricingContext) -> None:
        self.ctx = ctx
        # one entry per (stage, next stage) priced: at most the stage pairs of one search's
        # instances (and a made plan's)
        self._hops: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # one entry per stage-pair shape: at most the entries of ``_hops``
        self._hop_by_shape: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # ``order_stages``, which no T_f changes: one entry per (PP, groups to chain), at most
        # the (pod or window of left-over groups, PP) pairs of one search
        self._chains: dict[tuple, tuple] = {}

    def pipeline_hop_time(self, a: Sequence[str], b: Sequence[str], nbytes: float) -> float:
        """Eq. 6: T_pp(i) = min over receivers r in stage i+1 of max over senders k in stage i
        of the cost of sending the activation k -> r. Each pair's cost is affine in the size
        on its route (latency plus bytes over bandwidth, in either cost mode), so two
        matrices per pair of stages price every size; stage pairs of the same shape
        (``shape_signature``) share them, as the min-max does not depend on the order."""
        lat, slope = self._hop_matrices(a, b)
        return float(np.min(np.max(lat + slope * nbytes, axis=0)))

    def pipeline_hop_times(
        self, a: Sequence[str], b: Sequence[str], nbytes: np.ndarray
    ) -> np.ndarray:
        """``pipeline_hop_time`` at every size of ``nbytes`` at once (s per entry)."""
        lat, slope = self._hop_matrices(a, b)
        sizes = np.asarray(nbytes, dtype=float)
        return np.min(np.max(lat[..., None] + slope[..., None] * sizes, axis=0), axis=0)

    def _hop_matrices(self, a: Sequence[str], b: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(latency s, s per byte) of every sender -> receiver pair of the hop a -> b."""
        key = (tuple(a), tuple(b))
        hit = self._hops.get(key)
        if hit is None:
            shape = self.ctx.shape(a, b)
            hit = self._hop_by_shape.get(shape)
            if hit is None:
                ref = self.ctx.prefill_bytes()
                members = [*a, *b]
                d0 = latency_matrix(self.ctx.ring_fabric, members, 0.0)
                d1 = latency_matrix(self.ctx.ring_fabric, members, ref)
                na = len(a)
                lat = d0[:na, na:]
                hit = self._hop_by_shape[shape] = (lat, (d1[:na, na:] - lat) / ref)
            self._hops[key] = hit
        return hit

    def order_stages(
        self, groups: list[list[str]], pp: int
    ) -> tuple[list[list[list[str]]], list[list[str]]]:
        """Chain groups into instances of ``pp`` stages: start from the first free group (in
        server order) and append the free group with the cheapest pipeline hop (Eq. 6 at the
        prefill message, every pair of groups priced at once from the GPUs' latency matrix:
        O(N^2 S) for N GPUs). Returns the instances and the groups left over."""
        if pp == 1:
            return [[grp] for grp in groups], []
        key = (pp, tuple(tuple(grp) for grp in groups))
        hit = self._chains.get(key)
        if hit is None:
            hit = self._chains[key] = self._order_stages(groups, pp)
        chains, rest = hit  # fresh outer lists: callers extend what they get
        return [list(c) for c in chains], list(rest)

    def _order_stages(
        self, groups: list[list[str]], pp: int
    ) -> tuple[list[list[list[str]]], list[list[str]]]:
        n, size = len(groups), len(groups[0])
        members = [x for grp in groups for x in grp]
        d = latency_matrix(self.ctx.ring_fabric, members, self.ctx.prefill_bytes())
        # hop[a, b] = min over receivers r in b of max over senders k in a of d[k, r]
        hop = d.reshape(n, size, n, size).max(axis=1).min(axis=2)
        free = list(range(n))
        out = []
        while len(free) >= pp:
            chain = [free.pop(0)]
            while len(chain) < pp:
                row = hop[chain[-1]]
                best = min(range(len(free)), key=lambda i: row[free[i]])
                chain.append(free.pop(best))
            out.append([groups[i] for i in chain])
        return out, [groups[i] for i in free]
