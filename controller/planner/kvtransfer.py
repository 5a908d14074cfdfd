"""The KV transfer between prefill and decode instances (Eqs. 14-15).

- ``KVPricing``: the evaluator's part that pairs every deployed prefill and decode instance
  (round robin), routes each pair's KV shares, prices one request's transfer alone, and
  re-orders a decode instance's stages so that each sits near the prefill GPUs holding its
  layers when that is faster. Its caches: routes per (source, destination, size) and prices
  per pair, which the search asks again for every split that deploys them.
- ``KVLoad``: the load every pair puts on each link at a rate, and T_f stretched by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from controller.costmodel.kvcache import KVFlow, kv_route, kv_shares, kv_time, stage_kv_shares
from controller.costmodel.network import path_time
from controller.planner.context import EvalContext
from controller.planner.options import Policy, Problem
from controller.planner.results import PhaseResult, stage_key

Edge = tuple[str, str]


@dataclass
class KVLoad:
    """The KV transfers of a deployment: every pair's request shares the links with the
    others'. Requests reach pair k at ``weights[k]`` of the rate, so at rate H link e is
    busy H * ``link_s[e]`` of the time (``link_s``: bytes per request over e, each pair's
    weighted, times 1/B, times the share of requests that transfer at all). A share is
    served as processor sharing serves a job: its time alone stretched by 1 / (1 -
    utilisation) of its busiest link (M/G/1-PS, Kleinrock: a job's mean time in the system
    is its size over 1 - rho), which holds for the simulator's fluid links, where concurrent
    transfers split a link's capacity."""

    pairs: list[tuple[list[list[str]], list[list[str]]]]
    weights: list[float]
    link_s: dict[Edge, float]
    flows: list[KVFlow]  # every share of every pair, priced alone (its request's shares beside)
    # per flow, its (pair, prefill GPU) number; ``pipelined``: a GPU's shares stream at once
    # (its time is the slowest), otherwise one after the other (summed, Eq. 15)
    senders: np.ndarray
    pipelined: bool
    busiest_s: np.ndarray = field(init=False)  # per flow, link_s of the busiest link it crosses
    alone_s: np.ndarray = field(init=False)  # per flow, its time alone

    def __post_init__(self) -> None:
        self.busiest_s = np.array(
            [
                max((self.link_s[e] for e in zip(f.path, f.path[1:], strict=False)), default=0.0)
                for f in self.flows
            ]
        )
        self.alone_s = np.array([f.time_s for f in self.flows])

    @property
    def service_s(self) -> float:
        """Seconds the busiest link is busy per request: the rate saturates it at 1 / this."""
        return max(self.link_s.values(), default=0.0)

    def bottleneck(self) -> Edge | None:
        """The busiest link, or None without transfers over links."""
        if not self.link_s:
            return None
        return max(self.link_s, key=lambda e: (self.link_s[e], e))

    def stretched(self, rate: float) -> np.ndarray:
        """Each flow's time at ``rate`` requests/s (inf on a saturated link)."""
        util = rate * self.busiest_s
        with np.errstate(divide="ignore"):
            return np.where(util < 1.0, self.alone_s / np.maximum(1.0 - util, 0.0), np.inf)

    def t_f(self, rate: float) -> float:
        """T_f at ``rate``: the slowest prefill GPU of any pair (Eq. 14), each share
        stretched, a GPU's shares taken together as its cost mode says (``kv_time``)."""
        if not self.flows:
            return 0.0
        times = self.stretched(rate)
        if self.pipelined:
            return float(np.max(times))
        return float(np.max(np.bincount(self.senders, weights=times)))

    def flows_at(self, rate: float) -> list[KVFlow]:
        """The flows with their times at ``rate``."""
        return [
            replace(f, time_s=float(t))
            for f, t in zip(self.flows, self.stretched(rate), strict=True)
        ]


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
        """T_f of one mean-length request alone (the slowest of every deployed pair, Eq. 14)
        from each prefill instance to the decode instances it is paired with (round robin,
        ``kv_pairs``), and the flows. Routes are each flow's cheapest alone.

        A decode instance's stages may be put in another order (``kv_stage_order``) so that
        each stage sits close to the prefill GPUs that hold its layers; the third value maps
        the key of every re-ordered instance (``stage_key``) to its new stages."""
        reorder: dict[tuple, list[list[str]]] = {}
        for p, d in self.kv_pairs(pre, dec, n_pre, n_dec):
            key = stage_key(d)
            if key not in reorder:
                best = self.kv_stage_order(p, d)
                if best != d:
                    reorder[key] = best
        load = self.kv_load(pre, dec, n_pre, n_dec, reorder)
        return load.t_f(0.0), load.flows, reorder

    def kv_pairs(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None, n_dec: int | None
    ) -> list[tuple[list[list[str]], list[list[str]]]]:
        """The (prefill stages, decode stages) pairs that carry KV: the best ``n_pre`` and
        ``n_dec`` instances (as ``combine`` deploys them) paired round robin, pair k joining
        prefill instance k mod P and decode instance k mod D, max(P, D) pairs, so that every
        deployed instance sends or receives."""
        pres = [i.stages for i in sorted(pre.instances, key=lambda i: -i.rate)][:n_pre]
        decs = [i.stages for i in sorted(dec.instances, key=lambda i: -i.rate)][:n_dec]
        if not decs or not pres:
            return []
        return [
            (pres[k % len(pres)], decs[k % len(decs)]) for k in range(max(len(pres), len(decs)))
        ]

    def kv_load(
        self,
        pre: PhaseResult,
        dec: PhaseResult,
        n_pre: int | None,
        n_dec: int | None,
        reorder: dict[tuple, list[list[str]]] | None = None,
    ) -> KVLoad:
        """The links' load of the deployment's KV transfers (``KVLoad``), ``reorder``'s decode
        stage orders applied. A prefill instance takes requests in proportion to its rate (the
        simulator routes to the least work) and splits them evenly over its pairs; only the
        requests that reach decode (``kv_share`` of them) transfer. Pairs of the same GPUs
        are priced once (``kv_price``); the sum over links is O(shares)."""
        pairs = self.kv_pairs(pre, dec, n_pre, n_dec)
        if reorder:
            pairs = [(p, reorder.get(stage_key(d), d)) for p, d in pairs]
        rates = {stage_key(i.stages): i.rate for i in pre.instances}
        per_pre: dict[tuple, int] = {}
        for p, _ in pairs:
            per_pre[stage_key(p)] = per_pre.get(stage_key(p), 0) + 1
        raw = [max(rates.get(stage_key(p), 0.0), 0.0) / per_pre[stage_key(p)] for p, _ in pairs]
        total = sum(raw)
        weights = [r / total if total > 0 else 1.0 / len(pairs) for r in raw]
        table = self.ring_fabric.link_table
        share = self.kv_share  # requests that end at their first token transfer nothing
        link_s: dict[Edge, float] = {}
        flows: list[KVFlow] = []
        senders: list[int] = []
        ids: dict[tuple[int, str], int] = {}
        for k, (pair, wk) in enumerate(zip(pairs, weights, strict=True)):
            _, fl = self.kv_price([pair])
            flows += fl
            senders += [ids.setdefault((k, f.src), len(ids)) for f in fl]
            for f in fl:
                for e in zip(f.path, f.path[1:], strict=False):
                    link_s[e] = link_s.get(e, 0.0) + share * wk * f.nbytes * table[e][0]
        senders_a = np.array(senders, dtype=int)
        return KVLoad(pairs, weights, link_s, flows, senders_a, self.ring_fabric.pipelined)

    def kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        """T_f of the given (prefill stages, decode stages) pairs transferring one request each
        at once, and the flows (Eqs. 14-15); memoised on the pairs (the search prices the same
        pairs again for every deployment that holds them)."""
        key = tuple((tuple(map(tuple, p)), tuple(map(tuple, d))) for p, d in pairs)
        hit = self._kv_prices.get(key)
        if hit is None:
            hit = self._kv_prices[key] = self._kv_price(pairs)
        return hit[0], list(hit[1])

    def kv_routed(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> list[KVFlow]:
        """The KV shares of one mean-length transfer per pair (the mean prompt of the requests
        that reach decode, ``kv_tokens``), each on its route (times not priced: 0)."""
        total = self.kv_tokens * self.model.kv_bytes_per_token()
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
        total = self.kv_tokens * self.model.kv_bytes_per_token()
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
