"""A deployment of two priced phases settled on its KV transfer, and what a search returns.

- ``settle_kv``: from the deployment at T_f = 0, price the KV transfer between the instances
  it deploys (Eqs. 14-15), re-price decode at that T_f and combine again (Eq. 1) until the
  counts repeat; then bound H by the links' capacity for KV (P-K wait, bisection).
- ``SearchResult``: the settled deployment a planner's search returns, which
  ``assemble.build_plan`` turns into a plan.

Shared by the common search (``search``) and DistServe's low-affinity layouts
(``colocated``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from controller.costmodel.kvcache import kv_busiest_link_s
from controller.costmodel.queueing import pk_queue_delay
from controller.planner.combine import Combination, combine
from controller.planner.evaluate import Evaluator
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
    kv_flows: list
    candidates_tried: int
    split: Split | None = None
    splits_priced: int = 0


KV_BISECT_STEPS = 12  # the KV-bound rate to 1/4096 of the first bracket


def settle_kv(
    ev: Evaluator,
    pre: PhaseResult,
    dec: PhaseResult,
    price_decode: Callable[[float], PhaseResult],
    comb: Combination,
    beat: float = 0.0,
) -> tuple[Combination, PhaseResult, float, list] | None:
    """The decode phase priced at the KV transfer of the instances it deploys: from the
    deployment at T_f = 0 (``comb`` of ``pre`` and ``dec``; ``price_decode(T_f)`` prices the
    same decode instances at another T_f), price T_f between the deployed instances (re-ordering
    decode stages next to their layers, ``Evaluator.kv_transfer``), price decode at that T_f,
    combine again, until the numbers deployed repeat (three rounds at most). The flows
    returned are those of exactly the instances deployed, in their final stage order, so the
    plan's KV transfers name its own GPUs.

    H is then bounded by the links' capacity for KV (see below). ``beat``: an H the caller
    already has; None as soon as this deployment cannot exceed it (its KV capacity is
    judged on the instances deployed at T_f = 0, before re-pricing)."""
    problem = ev.problem
    cap = problem.options.max_gpus
    reorder: dict[tuple, list[list[str]]] = {}
    rd = dec
    t_f = 0.0
    if beat > 0.0:
        # Drop a deployment whose KV capacity at T_f = 0 cannot beat ``beat`` before pricing
        # its transfer (the search meets thousands of them). Pair by pair: the busiest
        # link's load only grows as pairs are added, so n over it bounds the capacity.
        pairs = ev.kv_pairs(pre, dec, comb.n_prefill, comb.n_decode)
        loads: dict = {}
        for pair in pairs:
            busy = kv_busiest_link_s(ev.ring_fabric, ev.kv_routed([pair]), loads)
            if busy > 0.0 and len(pairs) / busy <= beat * (1 + 1e-9):
                return None
    for _ in range(3):
        t_f, _, more = ev.kv_transfer(pre, rd, comb.n_prefill, comb.n_decode)
        reorder.update(more)
        rd = ev.reprice_decode(price_decode(t_f), t_f, reorder)
        new = combine(pre, rd, problem.sla.ttft_s, cap)
        if new is None:
            return None
        same = (new.n_prefill, new.n_decode) == (comb.n_prefill, comb.n_decode)
        comb = new
        if same:
            break
    pairs = ev.kv_pairs(pre, rd, comb.n_prefill, comb.n_decode)
    t_dep, flows = ev.kv_price(pairs)
    t_f = max(t_f, t_dep)
    # The links carry H requests' KV per second: the busiest one's utilisation must stay
    # below 1, and a request queues behind others' transfers there (P-K, deterministic
    # service). Per request, the bottleneck is busy ``service`` seconds (the priced pairs
    # each moving one request, shared out: exact when every pair is priced, pessimistic for
    # pairs on disjoint links otherwise). H is the fixed point where the decode phase, priced
    # at T_f plus that wait, serves the rate that causes the wait.
    service = kv_busiest_link_s(ev.ring_fabric, flows) / max(1, len(pairs))
    if service <= 0.0:
        return comb, rd, t_f, flows

    def at(load: float) -> tuple[Combination | None, PhaseResult, float]:
        t = t_f + pk_queue_delay(load, service)
        d = ev.reprice_decode(price_decode(t), t, reorder)
        return combine(pre, d, problem.sla.ttft_s, cap), d, t

    hi = min(comb.rate, (1.0 - 1e-9) / service)
    if hi <= beat * (1 + 1e-9):
        return None
    top, d_hi, t_hi = at(hi)
    if top is not None and top.rate >= hi * (1 - 1e-6):
        return _kv_bound(ev, pre, top, hi, d_hi, t_hi)
    lo, best = 0.0, None
    if beat > 0.0:  # the fixed point lies below beat when the rate at beat's wait is lower
        got = at(beat * (1 + 1e-9))
        if got[0] is None or got[0].rate < beat * (1 + 1e-9):
            return None
        lo, best = beat * (1 + 1e-9), got
    for _ in range(KV_BISECT_STEPS):
        mid = (lo + hi) / 2
        got = at(mid)
        if got[0] is not None and got[0].rate >= mid:
            lo, best = mid, got
        else:
            hi = mid
    if best is None or best[0] is None:
        return None
    c, d, t = best
    return _kv_bound(ev, pre, c, lo, d, t)


def _kv_bound(
    ev: Evaluator, pre: PhaseResult, comb: Combination, rate: float, dec: PhaseResult, t: float
) -> tuple[Combination, PhaseResult, float, list]:
    """``comb`` at the KV-bound ``rate``, with the flows of exactly the instances it deploys
    (the count may have changed with the wait)."""
    _, flows = ev.kv_price(ev.kv_pairs(pre, dec, comb.n_prefill, comb.n_decode))
    return replace(comb, rate=rate, rate_per_gpu=rate / comb.gpus_used), dec, t, flows
