"""A deployment of two priced phases settled on its KV transfer, and what a search returns.

- ``settle_kv``: from the deployment at T_f = 0, price the KV transfer between the instances
  it deploys (Eqs. 14-15), re-price decode at that T_f and combine again (Eq. 1) until the
  counts repeat; then bound H where the decode phase, priced at T_f stretched by the links'
  KV load at H (``kvtransfer.KVLoad``), still serves H (bisection).
- ``Settled``: what ``settle_kv`` returns: the combination deployed, decode priced at its
  KV transfer, T_f and the flows.
- ``SearchResult``: the settled deployment a planner's search returns, which
  ``assemble.build_plan`` turns into a plan.

Shared by the common search (``search``) and DistServe's low-affinity layouts
(``colocated``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from controller.planner.combine import Combination, best_prefill, combine, deployed_ttft
from controller.planner.evaluate import Evaluator
from controller.planner.options import TimeLimitReached
from controller.planner.results import PhaseResult
from controller.planner.roles import Split


@dataclass
class SearchResult:
    """The deployment a search chose: its phases, the combination deployed (Eq. 1), its KV
    transfer, and how much the search priced to find it."""

    evaluator: Evaluator
    prefill: PhaseResult
    decode: PhaseResult
    combination: Combination
    t_f: float
    # lists the KV flows of the deployment (timed at H); a function, since a search settles
    # many deployments and keeps one: listing every settled one's flows was 8% of
    # 2tracks-1200 summarization's plan (16 lists of about 90,000 flows)
    kv_flows: Callable[[], list]
    candidates_tried: int
    split: Split | None = None
    splits_priced: int = 0
    pair: tuple[int, int] | None = None  # the split's (prefill, decode) candidates, numbered
    # decode priced under the KV transfers' load on its groups' links (``settle_kv``); False
    # only when the time limit stopped the search before that pass settled a deployment
    kv_contention: bool = True


@dataclass
class Settled:
    """A deployment settled on its KV transfer (``settle_kv``): the combination deployed
    (Eq. 1), its decode phase priced at T_f, T_f, and a function listing the KV flows of
    exactly the instances it deploys."""

    combination: Combination
    decode: PhaseResult
    t_f: float
    kv_flows: Callable[[], list]


@dataclass
class _At:
    """What ``settle_kv``'s bisection prices at one rate: the deployment (None if it does not
    serve that rate), decode, T_f, and a function listing the flows timed at that rate."""

    combination: Combination | None
    decode: PhaseResult
    t_f: float
    kv_flows: Callable[[], list]


KV_BISECT_STEPS = 12  # the KV-bound rate to 1/4096 of the first bracket


def settle_kv(
    ev: Evaluator,
    pre: PhaseResult,
    dec: PhaseResult,
    price_decode: Callable[[float], PhaseResult],
    comb: Combination,
    beat: float = 0.0,
    *,
    kv_contention: bool,
) -> Settled | None:
    """The decode phase priced at the KV transfer of the instances it deploys: from the
    deployment at T_f = 0 (``comb`` of ``pre`` and ``dec``; ``price_decode(T_f)`` prices the
    same decode instances at another T_f), price T_f between the deployed instances (re-ordering
    decode stages next to their layers, ``KVPricer.kv_transfer``), price decode at that T_f,
    combine again, until the numbers deployed repeat (three rounds at most). The flows
    returned (as a function that lists them) are those of exactly the instances deployed, in
    their final stage order, so the plan's KV transfers name its own GPUs.

    H is then bounded by the links' capacity for KV (see below). ``beat``: an H the caller
    already has; None as soon as this deployment cannot exceed it (its KV capacity is
    judged on the instances deployed at T_f = 0, before re-pricing). ``kv_contention``:
    whether the decode groups are priced under the KV load too (``contend_decode``), which is
    costly and only lowers H: the search's first pass leaves it out."""
    problem = ev.problem
    cap = problem.options.max_gpus
    reorder: dict[tuple, list[list[str]]] = {}
    rd = dec
    t_f = 0.0
    if beat > 0.0:
        # Drop a deployment whose links saturate below ``beat`` before re-pricing decode
        # (the search meets thousands of them).
        busy = ev.kv_load(pre, dec, comb.n_prefill, comb.n_decode).service_s
        if busy > 0.0 and 1.0 / busy <= beat * (1 + 1e-9):
            return None
    for _ in range(3):
        t_f, more = ev.kv_transfer(pre, rd, comb.n_prefill, comb.n_decode)
        reorder.update(more)
        rd = ev.reprice_decode(price_decode(t_f), t_f, reorder)
        new = combine(pre, rd, problem.sla.ttft_s, cap)
        if new is None:
            return None
        same = (new.n_prefill, new.n_decode) == (comb.n_prefill, comb.n_decode)
        comb = new
        if same:
            break
    # At H every deployed pair moves H x its share of requests per second: each link carries
    # the sum, and a request's T_f is its shares' times alone stretched by their busiest
    # link's utilisation (``KVLoad``). H is the fixed point where the decode phase, priced at
    # T_f(H), serves H; it stays below the rate that saturates the busiest link.
    load = ev.kv_load(pre, rd, comb.n_prefill, comb.n_decode)
    service = load.service_s
    if service <= 0.0:
        return Settled(comb, rd, t_f, lambda: load.flows)

    def at(rate: float) -> _At:
        # decode priced at T_f(rate) of the pairs deployed so far, its deployed instances'
        # all-reduces sharing links with those pairs' KV at ``rate`` (``contend_decode``);
        # when that deploys other instances, their pairs load the links differently: price
        # again under their load (the deployment settles in a round or two), and a rate that
        # saturates them serves nothing. The flows come as a function: only the rate kept
        # needs them listed.
        problem.tick()  # a rate is the step between two checks (TimeLimitReached)
        c, d, t, cur = None, rd, 0.0, load
        lost: dict[tuple, float] = {}  # per shape, the rate its instances lost to KV load
        for _ in range(3):
            t = cur.t_f(rate)
            if not math.isfinite(t):
                return _At(None, d, t, list)
            d = ev.reprice_decode(price_decode(t), t, reorder)
            contended = False
            if kv_contention:
                d, contended = ev.contend_decode(d, t, cur, rate, lost)
            c = combine(pre, d, problem.sla.ttft_s, cap)
            if c is None:
                return _At(None, d, t, list)
            nxt = ev.kv_load(pre, d, c.n_prefill, c.n_decode)
            # the instances deployed are the ones priced under this load, or no KV crossed
            # a deployed decode group's links
            priced = not contended or nxt.pairs == cur.pairs
            cur = nxt
            if priced and cur.t_f(rate) <= t * (1 + 1e-9):
                return _At(c, d, t, partial(cur.flows_at, rate))
        return _At(None, d, t, list)

    hi = min(comb.rate, (1.0 - 1e-9) / service)
    if hi <= beat * (1 + 1e-9):
        return None
    lo, best, served = 0.0, None, 0.0
    if beat > 0.0:
        # the fixed point lies below beat when the rate at beat's load is lower. Asked
        # before the top: most deployments the search settles cannot beat the best so far
        # (202 of 214 planning 2tracks-96 summarization), and they fail here
        got = at(beat * (1 + 1e-9))
        if got.combination is None or got.combination.rate < beat * (1 + 1e-9):
            return None
        served, best = beat * (1 + 1e-9), got
    top = at(hi)
    if top.combination is not None and top.combination.rate >= hi * (1 - 1e-6):
        return _kv_bound(top, hi, pre, problem.sla.ttft_s)
    # the bisection's points are the same whatever ``beat`` is (rates up to ``served`` are
    # served without pricing them), so a deployment's H does not depend on the order the
    # search meets it in: planners whose candidates contain another's find its H exactly
    for _ in range(KV_BISECT_STEPS):
        mid = (lo + hi) / 2
        if mid <= served:
            lo = mid
            continue
        try:
            got = at(mid)
        except TimeLimitReached:
            if best is None or best.combination is None:
                raise
            # the time limit: the highest rate served so far (``best`` was priced at it), a
            # lower bound on the deployment's H
            return _kv_bound(best, max(lo, served), pre, problem.sla.ttft_s)
        if got.combination is not None and got.combination.rate >= mid:
            lo, best = mid, got
        else:
            hi = mid
    if best is None or best.combination is None:
        return None
    return _kv_bound(best, lo, pre, problem.sla.ttft_s)


def _kv_bound(got: _At, rate: float, pre: PhaseResult, sla_ttft: float) -> Settled:
    """The deployment ``at`` priced, at the KV-bound ``rate``, with (a function listing) the
    flows of exactly the instances it deploys timed at the rate ``at`` priced them, and its
    TTFT at ``rate`` (the combination's was priced at the rate its phases serve, which the KV
    bound lowers: on 8tracks-96 summarization the SLA's 25 s at 98.1 req/s, against 1.73 s at
    H = 81.7)."""
    comb = got.combination
    assert comb is not None
    ttft = deployed_ttft(best_prefill(pre, comb.n_prefill), rate, sla_ttft)
    return Settled(
        replace(comb, rate=rate, rate_per_gpu=rate / comb.gpus_used, ttft_s=ttft),
        got.decode,
        got.t_f,
        got.kv_flows,
    )
