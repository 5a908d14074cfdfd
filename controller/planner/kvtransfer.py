"""The KV transfer between prefill and decode instances (Eqs. 14-15).

- ``KVPricer``: the evaluator's pricer that pairs every deployed prefill and decode instance
  (round robin), routes each pair's KV shares, prices one request's transfer alone, and
  re-orders a decode instance's stages so that each sits near the prefill GPUs holding its
  layers when that is faster. Its caches (each bound where it is declared): prices per pair
  (``PairFlows``), which the search asks again for every split that deploys them, and each
  share's hops per route key (``_share_hops``: source, destination class, size), so that a
  route is turned into link numbers once (0.9 GB more at 8tracks-1,200 summarization; 1.4x
  faster on 2tracks-96); the links numbered, kept routes' hops, destination classes.
- ``PairFlows``: one pair's priced shares as the hop arrays their link loads are summed
  from (the flows are listed on demand); ``_pipelined_times``: ``flow_times`` on those
  arrays, float for float.
- ``ShareHops``: one share's route as ``_share_hops`` keeps it.
- ``KVLoad``: the load every pair puts on each link at a rate (one numpy ``bincount`` over
  every pair's hops), and T_f stretched by it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from controller.costmodel.kvcache import (
    KVFlow,
    kv_destination_class,
    kv_route,
    kv_route_parts,
    kv_shares,
    kv_time,
    stage_kv_shares,
)
from controller.costmodel.network import path_time
from controller.planner.context import PricingContext
from controller.planner.results import PhaseResult, stage_key
from controller.topology.fabric import Path

Edge = tuple[str, str]


@dataclass
class PairFlows:
    """One (prefill, decode) pair's KV shares priced alone (``KVPricer.kv_price``), laid
    out for summing link loads with numpy: per hop of every flow, in flow then hop order, the
    link's number (``KVPricer.pair_flows``), the flow's bytes and the link's 1/B; per flow
    its hop count, its time alone and its prefill GPU's number in the pair (first seen
    first). Arrays only: the search prices every pair it meets (tens of thousands on a
    large cluster) and lists the flows of the few it deploys again from their routes
    (``KVPricer.flows_of``); a flow object per share of every pair, with a memo of whole
    routes, took 7 GB planning 2tracks-600 summarization."""

    eids: np.ndarray
    nbytes: np.ndarray
    inv: np.ndarray
    hops: np.ndarray
    alone: np.ndarray
    senders: np.ndarray
    n_senders: int
    t_f: float  # the pair's T_f alone (Eq. 14)


class ShareHops(NamedTuple):
    """One share's route (``KVPricer._share_hops``): the fabric's kept list, its hops' link
    numbers, 1/B and latencies, and the switch before the destination (None: the list is
    the whole route). A named tuple, unpacked once per share in ``_kv_price``'s loop."""

    head: Path
    ids: list[int]
    inv: list[float]
    lat: list[float]
    last: str | None


def _pipelined_times(
    eids: np.ndarray,
    nbytes: np.ndarray,
    inv: np.ndarray,
    lat: np.ndarray,
    hops: np.ndarray,
    packet_bytes: float,
) -> np.ndarray:
    """``costmodel.network.flow_times`` on a pipelined fabric, for flows given per hop (link
    number, the flow's bytes, 1/B, latency; ``hops`` per flow), with its floats: link loads
    summed in flow then hop order (``bincount`` adds in input order), each flow's slowest
    hop (a max, exact in any order), and its latencies and 1/B summed hop by hop as
    ``Fabric.fixed_s`` does (one numpy step per hop position, never a pairwise sum)."""
    n = len(hops)
    out = np.zeros(n)
    some = hops > 0
    if not some.any():
        return out
    load = np.bincount(eids, weights=nbytes)
    starts = np.cumsum(hops) - hops
    busiest = np.maximum.reduceat(load[eids] * inv, starts[some])
    inv_max = np.maximum.reduceat(inv, starts[some])
    lat_sum = np.zeros(n)
    inv_sum = np.zeros(n)
    for k in range(int(hops.max())):
        on = hops > k
        lat_sum[on] += lat[starts[on] + k]
        inv_sum[on] += inv[starts[on] + k]
    out[some] = busiest + (lat_sum[some] + packet_bytes * (inv_sum[some] - inv_max))
    return out


class KVLoad:
    """The KV transfers of a deployment: every pair's request shares the links with the
    others'. Requests reach pair k at ``weights[k]`` of the rate, so at rate H link e is
    busy H * ``link_s[e]`` of the time (``link_s``: bytes per request over e, each pair's
    weighted, times 1/B, times the share of requests that transfer at all). A share is
    served as processor sharing serves a job: its time alone stretched by 1 / (1 -
    utilisation) of its busiest link (M/G/1-PS, Kleinrock: a job's mean time in the system
    is its size over 1 - rho), which holds for the simulator's fluid links, where concurrent
    transfers split a link's capacity.

    Built from each pair's ``PairFlows`` with numpy: the sum over links is one ``bincount``
    over every pair's hops in the order a loop over pairs, flows and hops adds them (bincount
    adds in input order), so the floats are that loop's, bit for bit."""

    def __init__(
        self,
        pairs: list[tuple[list[list[str]], list[list[str]]]],
        weights: list[float],
        parts: list[PairFlows],
        edges: list[Edge],
        pipelined: bool,
        share: float = 1.0,
        listed: Callable[[list[tuple[list[list[str]], list[list[str]]]]], list[KVFlow]]
        | None = None,
    ) -> None:
        """``share``: the fraction of requests that transfer KV at all (``kv_share``);
        ``listed``: the flows of pairs, priced alone (``KVPricer.flows_of``), for ``flows``."""
        self.pairs = pairs
        self._listed = listed
        self.weights = weights
        # a GPU's shares stream at once (its time is the slowest), otherwise one after the
        # other (summed, Eq. 15)
        self.pipelined = pipelined
        self._parts = parts
        self._flows: list[KVFlow] | None = None
        self.link_s: dict[Edge, float] = {}
        self.busiest_s = np.zeros(0)  # per flow, link_s of the busiest link it crosses
        self.alone_s = np.zeros(0)  # per flow, its time alone
        self.senders = np.zeros(0, dtype=int)  # per flow, its (pair, prefill GPU) number
        if not parts:
            return
        eids = np.concatenate([p.eids for p in parts])
        # ((share * w) * bytes) * 1/B per hop, as the loop's ``share * w * f.nbytes * inv``
        # associates
        vals = np.concatenate(
            [((share * w) * p.nbytes) * p.inv for p, w in zip(parts, weights, strict=True)]
        )
        per_link = np.bincount(eids, weights=vals, minlength=len(edges))
        touched = np.flatnonzero(np.bincount(eids, minlength=len(edges)))
        self.link_s = {edges[i]: float(per_link[i]) for i in touched}
        hops = np.concatenate([p.hops for p in parts])
        self.busiest_s = np.zeros(len(hops))
        some = hops > 0
        if some.any():
            starts = (np.cumsum(hops) - hops)[some]
            self.busiest_s[some] = np.maximum.reduceat(per_link[eids], starts)
        self.alone_s = np.concatenate([p.alone for p in parts])
        offsets = np.cumsum([0] + [p.n_senders for p in parts[:-1]])
        self.senders = np.concatenate(
            [p.senders + int(off) for p, off in zip(parts, offsets, strict=True)]
        )

    @property
    def flows(self) -> list[KVFlow]:
        """Every share of every pair, priced alone (its request's shares beside); listed
        on demand (the bisection asks only for the last load's)."""
        if self._flows is None:
            listed = self._listed
            self._flows = [f for p in self.pairs for f in listed([p])] if listed else []
        return self._flows

    @property
    def service_s(self) -> float:
        """Seconds the busiest link is busy per request: the rate saturates it at 1 / this."""
        return max(self.link_s.values(), default=0.0)

    def utilisation(self, rate: float) -> dict[Edge, float]:
        """The share of time each link carries KV at ``rate`` requests/s."""
        return {e: rate * s for e, s in self.link_s.items() if s > 0.0}

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
        if not len(self.alone_s):
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


class KVPricer:
    """Prices the KV transfer of deployed prefill/decode instance pairs on ``ctx``."""

    def __init__(self, ctx: PricingContext) -> None:
        self.ctx = ctx
        self._server_node = ctx.server_node
        # one entry per list of pairs priced together (one pair, from ``kv_load``; two stage
        # orders of one pair, from ``kv_stage_order``): at most the pairs one search deploys
        # in some settled deployment, with their re-orderings
        self._kv_prices: dict[tuple, PairFlows] = {}
        # a link's (number in ``PairFlows``, 1/B, latency): one entry per link a KV route
        # crosses, at most the fabric's links; ``_edges`` lists them by number
        self._edge_ids: dict[Edge, tuple[int, float, float]] = {}
        self._edges: list[Edge] = []
        # per kept route list (``kv_route_parts``), by id: (the list, its ``_link`` columns);
        # at most the routes the fabric keeps
        self._route_hops: dict[int, tuple[Path, list[int], list[float], list[float]]] = {}
        # ``_share_hops``' routes, per route key (source, destination or its class, size): at
        # most prefill GPUs x (destination classes + GPUs of their server) x share sizes
        self._share_memo: dict[tuple, ShareHops] = {}
        # ``kv_destination_class`` per decode GPU: at most the cluster's GPUs
        self._dst_class: dict[str, int] = {}

    def kv_transfer(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None = None, n_dec: int | None = None
    ) -> tuple[float, dict[tuple, list[list[str]]]]:
        """T_f of one mean-length request alone (the slowest of every deployed pair, Eq. 14)
        from each prefill instance to the decode instances it is paired with (round robin,
        ``kv_pairs``). Routes are each flow's cheapest alone; the flows are not listed
        (``kv_load(...).flows`` lists them: at 384 servers listing them here, for a caller
        that dropped them, was a ninth of a summarization plan's time).

        A decode instance's stages may be put in another order (``kv_stage_order``) so that
        each stage sits close to the prefill GPUs that hold its layers; the second value maps
        the key of every re-ordered instance (``stage_key``) to its new stages."""
        reorder: dict[tuple, list[list[str]]] = {}
        for p, d in self.kv_pairs(pre, dec, n_pre, n_dec):
            key = stage_key(d)
            if key not in reorder:
                best = self.kv_stage_order(p, d)
                if best != d:
                    reorder[key] = best
        load = self.kv_load(pre, dec, n_pre, n_dec, reorder)
        return load.t_f(0.0), reorder

    def kv_pairs(
        self, pre: PhaseResult, dec: PhaseResult, n_pre: int | None, n_dec: int | None
    ) -> list[tuple[list[list[str]], list[list[str]]]]:
        """The (prefill stages, decode stages) pairs that carry KV: the best ``n_pre`` and
        ``n_dec`` instances (as ``combine`` deploys them) paired round robin, pair k joining
        prefill instance k mod P (best first) and decode instance k mod D (in the phase's
        order), max(P, D) pairs, so that every deployed instance sends or receives.

        The decode instances keep the phase's order, not their rates': the KV load re-prices
        their rates (``contend_decode``) while the same ones stay deployed, and paired best
        first every such round met new pairs to price (25,061 of the 63,332 that planning
        8tracks-384 summarization priced, 80 CPU-s; 14 CPU-s in this order)."""
        pres = [i.stages for i in sorted(pre.instances, key=lambda i: -i.rate)][:n_pre]
        best = sorted(range(len(dec.instances)), key=lambda k: -dec.instances[k].rate)[:n_dec]
        decs = [dec.instances[k].stages for k in sorted(best)]
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
        parts = [self.pair_flows(p) for p in pairs]
        # requests that end at their first token transfer nothing
        return KVLoad(
            pairs, weights, parts, self._edges, self.ctx.ring_fabric.pipelined, self.ctx.kv_share,
            self.flows_of,
        )  # fmt: skip

    def pair_flows(self, pair: tuple[list[list[str]], list[list[str]]]) -> PairFlows:
        """``kv_price`` of one pair, with its arrays (``PairFlows``); memoised like it."""
        return self._priced([pair])

    def kv_price(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> tuple[float, list[KVFlow]]:
        """T_f of the given (prefill stages, decode stages) pairs transferring one request each
        at once, and the flows (Eqs. 14-15); memoised on the pairs (the search prices the same
        pairs again for every deployment that holds them)."""
        hit = self._priced(pairs)
        return hit.t_f, self.flows_of(pairs)

    def flows_of(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> list[KVFlow]:
        """The flows of ``pairs`` transferring at once (every share on its route, timed as
        ``kv_price`` priced them), routed again (``kv_route`` keeps its choices) and timed from
        the pair's priced arrays."""
        times = self._priced(pairs).alone
        return [KVFlow(*r, float(t)) for r, t in zip(self._routed(pairs), times, strict=True)]

    def _priced(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> PairFlows:
        key = tuple((tuple(map(tuple, p)), tuple(map(tuple, d))) for p, d in pairs)
        hit = self._kv_prices.get(key)
        if hit is None:
            hit = self._kv_prices[key] = self._kv_price(pairs)
        return hit

    def kv_routed(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> list[KVFlow]:
        """The KV shares of one mean-length transfer per pair (the mean prompt of the requests
        that reach decode, ``kv_tokens``), each on its route (times not priced: 0)."""
        return [KVFlow(s, d, nb, path, 0.0) for s, d, nb, path in self._routed(pairs)]

    def _routed(
        self, pairs: list[tuple[list[list[str]], list[list[str]]]]
    ) -> list[tuple[str, str, float, list[str]]]:
        """``kv_routed``'s (source, destination, bytes, route), not yet flows."""
        total = self.ctx.kv_tokens * self.ctx.model.kv_bytes_per_token()
        route = self.kv_route
        return [
            (s, dst, f * total, route(s, dst, f * total))
            for p, d in pairs
            for s, dst, f in kv_shares(self.ctx.model, p, d)
        ]

    def _kv_price(self, pairs: list[tuple[list[list[str]], list[list[str]]]]) -> PairFlows:
        """``kv_time`` of the pairs' routed shares, as ``PairFlows``. Pipelined, the times are
        ``flow_times``' arithmetic on the hop arrays (``_pipelined_times``); the paper's mode
        calls ``kv_time``. A share's hops up to its last come from ``_share_hops``, kept per
        route key: a route is converted into link numbers once, not for every share that
        takes it (a 1,200-server summarization search prices tens of millions of shares)."""
        fab = self.ctx.ring_fabric
        total = self.ctx.kv_tokens * self.ctx.model.kv_bytes_per_token()
        share_hops, edge_ids, link = self._share_hops, self._edge_ids, self._link
        eids: list[int] = []
        inv: list[float] = []
        lat: list[float] = []
        nbytes: list[float] = []
        hops: list[int] = []
        shares: list[tuple[str, Path, float]] = []
        local: dict[str, int] = {}  # prefill GPU -> its number in the pairs, first seen first
        senders: list[int] = []
        for p, d in pairs:
            for src, dst, f in kv_shares(self.ctx.model, p, d):
                nb = f * total
                head, h_ids, h_inv, h_lat, last = share_hops(src, dst, nb)
                eids += h_ids
                inv += h_inv
                lat += h_lat
                n = len(h_ids)
                if last is not None:
                    i, b, t = edge_ids.get((last, dst)) or link(last, dst)
                    eids.append(i)
                    inv.append(b)
                    lat.append(t)
                    n += 1
                nbytes += [nb] * n
                hops.append(n)
                senders.append(local.setdefault(src, len(local)))
                if not fab.pipelined:
                    shares.append((src, head + [dst] if last is not None else head, nb))
        a_eids = np.array(eids, dtype=np.intp)
        a_nb, a_inv, a_hops = np.array(nbytes), np.array(inv), np.array(hops, dtype=np.intp)
        if not hops:
            t_f, times = 0.0, []
        elif fab.pipelined:
            t = _pipelined_times(a_eids, a_nb, a_inv, np.array(lat), a_hops, fab.packet_bytes)
            t_f, times = float(t.max()), t.tolist()
        else:
            t_f, times = kv_time(fab, shares)
        return PairFlows(
            a_eids, a_nb, a_inv, a_hops, np.array(times, dtype=float),
            np.array(senders, dtype=np.intp), len(local), t_f,
        )  # fmt: skip

    def _share_hops(self, src: str, dst: str, nbytes: float) -> ShareHops:
        """One share's route (``ShareHops``) from ``kv_route_parts``, kept per (source,
        ``kv_destination_class``, size) for a rail route, which every destination of that
        class shares up to its switch, and per (source, destination, size) inside a server."""
        srv = self._server_node
        same = srv(src) == srv(dst)
        key = (src, dst if same else self._classes(dst), nbytes)
        hit = self._share_memo.get(key)
        if hit is None:
            head, last = kv_route_parts(self.ctx.ring_fabric, src, dst, nbytes)
            ids, inv, lat = self._hops_of(head)
            hit = ShareHops(head, ids, inv, lat, head[-1] if last is not None else None)
            if same or last is not None:  # a whole rail route is the destination's own
                self._share_memo[key] = hit
        return hit

    def _classes(self, dst: str) -> int:
        hit = self._dst_class.get(dst)
        if hit is None:
            hit = self._dst_class[dst] = kv_destination_class(self.ctx.ring_fabric, dst)
        return hit

    def _link(self, a: str, b: str) -> tuple[int, float, float]:
        """Link (a, b)'s number in ``PairFlows``, 1/B and latency, numbered at first sight."""
        hit = self._edge_ids.get((a, b))
        if hit is None:
            hit = self._edge_ids[(a, b)] = (
                len(self._edges),
                *self.ctx.ring_fabric.link_table[(a, b)],
            )
            self._edges.append((a, b))
        return hit

    def _hops_of(self, route: Path) -> tuple[list[int], list[float], list[float]]:
        """A kept route's (link numbers, 1/B, latencies) hop by hop, converted once per list
        (kept by identity, the list held beside so its id stays its own)."""
        hit = self._route_hops.get(id(route))
        if hit is None:
            parts = [self._link(a, b) for a, b in zip(route, route[1:], strict=False)]
            hit = self._route_hops[id(route)] = (
                route, [x[0] for x in parts], [x[1] for x in parts], [x[2] for x in parts],
            )  # fmt: skip
        return hit[1], hit[2], hit[3]

    def kv_route(self, src: str, dst: str, nbytes: float) -> list[str]:
        """``costmodel.kvcache.kv_route`` on the ring fabric. Not memoised here: the search
        meets most GPU pairs once at each size (1.36 M of 1.71 M calls on 2tracks-192
        summarization), and ``kv_route`` keeps its own choice per source, destination switch
        and size, so a memo of whole routes cost 0.28 GB there and saved little."""
        return kv_route(self.ctx.ring_fabric, src, dst, nbytes)

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
        srv = self._server_node
        if not {srv(x) for s in pre_stages for x in s} & {srv(x) for s in dec_stages for x in s}:
            return dec_stages
        total = self.ctx.kv_tokens * self.ctx.model.kv_bytes_per_token()
        fab = self.ctx.ring_fabric
        cost = np.zeros((pp, pp))
        tp = len(dec_stages[0])
        for j in range(pp):
            # the shares stage j receives, by member position q: the same for every group that
            # would hold it (groups of one instance have one size), so worked out once per stage
            shares = stage_kv_shares(self.ctx.model, pre_stages, pp, j, tp)
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
