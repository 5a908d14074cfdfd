"""The KV transfer between prefill and decode instances (Eqs. 14-15).

``KVPricing`` is the evaluator's part that pairs the deployed prefill and decode instances
(round robin), routes each pair's KV shares, prices T_f with the flows sharing links, and
re-orders a decode instance's stages so that each sits near the prefill GPUs holding its
layers when that is faster. Its caches: routes per (source, destination, size) and prices
per set of pairs, which the search asks again for every split that deploys them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from controller.costmodel.kvcache import KVFlow, kv_route, kv_shares, kv_time, stage_kv_shares
from controller.costmodel.network import path_time
from controller.planner.context import EvalContext
from controller.planner.options import Policy, Problem
from controller.planner.results import PhaseResult, stage_key


class KVPricing(EvalContext):
    """Prices the KV transfer of deployed prefill/decode instance pairs."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        super().__init__(problem, policy)
        g = self.g
        self._server_of = lambda x: g.nodes[x].get("server") or x
        self._kv_prices: dict[tuple, tuple[float, list[KVFlow]]] = {}
        self._kv_routes: dict[tuple[str, str, float], list[str]] = {}

    def kv_transfer(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None = None, n_dec: int | None = None
    ) -> tuple[float, list[KVFlow], dict[tuple, list[list[str]]]]:
        """T_f for one mean-length request from each prefill instance to the decode instance
        it is paired with (round robin), all pairs at once; at most ``kv_pairs_max`` pairs are
        priced. Routes are each flow's cheapest alone; the price counts shared links.

        A decode instance's stages may be put in another order (``kv_stage_order``) so that
        each stage sits close to the prefill GPUs that hold its layers; the third value maps
        the key of every re-ordered instance (``stage_key``) to its new stages."""
        reorder: dict[tuple, list[list[str]]] = {}
        paired = []
        for p, d in self.kv_pairs(pre, dec, n_pre, n_dec):
            key = stage_key(d)
            if key not in reorder:
                best = self.kv_stage_order(p, d)
                if best != d:
                    reorder[key] = best
            paired.append((p, reorder.get(key, d)))
        if not paired:
            return 0.0, [], {}
        t_f, flows = self.kv_price(paired)
        return t_f, flows, reorder

    def kv_pairs(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None, n_dec: int | None
    ) -> list[tuple[list[list[str]], list[list[str]]]]:
        """The (prefill stages, decode stages) pairs whose KV transfer is priced: the best
        ``n_pre`` and ``n_dec`` instances (as ``combine`` deploys them), prefill instance i
        paired with decode instance i round robin, at most ``kv_pairs_max`` pairs."""
        pres = [i.stages for i in sorted(pre.instances, key=lambda i: -i.rate)][:n_pre]
        decs = [i.stages for i in sorted(dec.instances, key=lambda i: -i.rate)][:n_dec]
        if not decs:
            return []
        n = min(len(pres), self.problem.options.kv_pairs_max)
        return [(pres[i], decs[i % len(decs)]) for i in range(n)]

    def kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        """T_f of the given (prefill stages, decode stages) pairs transferring at once, and
        the flows (Eqs. 14-15); memoised on the pairs (the search prices the same deployment
        again when it settles its KV transfer)."""
        key = tuple((tuple(map(tuple, p)), tuple(map(tuple, d))) for p, d in pairs)
        hit = self._kv_prices.get(key)
        if hit is None:
            hit = self._kv_prices[key] = self._kv_price(pairs)
        return hit[0], list(hit[1])

    def kv_routed(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> list[KVFlow]:
        """The KV shares of one mean-length request per pair, each on its route (times not
        priced: 0)."""
        total = self.mean_in * self.model.kv_bytes_per_token()
        out = []
        for p, d in pairs:
            for s, dst, f in kv_shares(self.model, p, d):
                out.append(KVFlow(s, dst, f * total, self.kv_route(s, dst, f * total), 0.0))
        return out

    def _kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        routed = self.kv_routed(pairs)
        if not routed:
            return 0.0, []
        t_f, times = kv_time(self.ring_fabric, [(f.src, f.path, f.nbytes) for f in routed])
        return t_f, [replace(f, time_s=t) for f, t in zip(routed, times, strict=True)]

    def kv_route(self, src: str, dst: str, nbytes: float) -> list[str]:
        """``costmodel.kvcache.kv_route`` on the ring fabric, memoised: the search routes the
        same GPU pairs again for every split that deploys them."""
        key = (src, dst, nbytes)
        hit = self._kv_routes.get(key)
        if hit is None:
            hit = self._kv_routes[key] = kv_route(self.ring_fabric, src, dst, nbytes)
        return hit

    def kv_stage_order(
        self, pre_stages: list[list[str]], dec_stages: list[list[str]]
    ) -> list[list[str]]:
        """The order of a decode instance's stages that makes its KV transfer from
        ``pre_stages`` fastest: decode stage j receives the KV of layers [jL/P, (j+1)L/P),
        so each group is assigned the stage whose layers sit nearest (an assignment problem
        over the alone-price of each stage's KV shares, solved exactly with SciPy's
        ``linear_sum_assignment``; O(P^3)). The order the pipeline hops chose is kept when
        it is at least as fast (ties keep the hops' order). Only instances that share a
        server with their prefill instance are re-ordered: elsewhere every stage's KV crosses
        Ethernet whatever the order, and the order the hops chose stands."""
        pp = len(dec_stages)
        if pp == 1:
            return dec_stages
        srv = self._server_of
        if not {srv(x) for s in pre_stages for x in s} & {srv(x) for s in dec_stages for x in s}:
            return dec_stages
        total = self.mean_in * self.model.kv_bytes_per_token()
        fab = self.ring_fabric
        cost = np.zeros((pp, pp))
        tp = len(dec_stages[0])
        for j in range(pp):
            # the shares stage j receives, by member position q: the same for every group that
            # would hold it (groups of one instance have one size), so worked out once per stage
            shares = stage_kv_shares(self.model, pre_stages, pp, j, tp)
            for k, grp in enumerate(dec_stages):
                for src, q, f in shares:
                    nb = f * total
                    cost[j, k] += path_time(fab, self.kv_route(src, grp[q], nb), nb)
        rows, cols = linear_sum_assignment(cost)
        order = [dec_stages[int(c)] for _, c in sorted(zip(rows, cols, strict=True))]
        if order == dec_stages:
            return dec_stages
        now, _ = self.kv_price([(pre_stages, dec_stages)])
        new, _ = self.kv_price([(pre_stages, order)])
        return order if new < now * (1 - 1e-9) else dec_stages
