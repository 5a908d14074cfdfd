"""Alg. 1 (scalability-oriented offline planner) as a search shared by every planner, in the
style of DistServe's: list candidates, evaluate each, pick.

1. **Role splits** (``roles.py``): which servers prefill and which decode. Every split is
   priced when there are at most ``max_splits``; otherwise the splits around the balance
   point of a per-class linear model (each class's rate per server in each role).
2. **Phases**: for each split and role, the (TP, PP) candidates of Alg. 1 line 2. Each gets a
   cheap upper bound on its capacity (compute alone: no communication, the fastest GPU type,
   the most memory); candidates are grouped (the planner's own grouping, Alg. 2) and priced
   in decreasing order of that bound, and the search stops at the first candidate whose bound
   cannot beat the best capacity found (branch and bound). Phase results are cached per pool,
   so splits that share a prefill or a decode pool price it once.
3. **Pairs**: the prefill and decode candidates of a split are combined (Eq. 1: H, the
   total SLA-meeting rate, with the fewest GPUs at equal H) best upper bound first (T_f = 0),
   each with its KV transfer priced (Eqs. 14-15), until no remaining pair's bound beats the
   best plan found.

The result is the split, the pair of phases and the combination with the highest H.

Here: ``search`` (the loop over splits), ``PhaseSearch`` and ``PhaseOption`` (phases per
role, pool and candidate, cached), ``PairFound`` (a split's best pair), ``candidates_for``
(step 2's list), ``decode_ref_bytes`` (decode's reference all-reduce size for grouping),
``split_bound`` and the ``Grouper`` type.
Shared with DistServe's low-affinity layouts, and so in their own modules: the capacity
bound (``bounds``), the KV settling of a pair and the ``SearchResult`` (``deployment``), and
those layouts themselves (``colocated``), which HeroServe's search prices too. Why a search
found nothing is told by ``infeasible``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.errors import InputError
from controller.models.engines import pair_problem, parallelism_problem
from controller.planner.bounds import capacity_bound
from controller.planner.candidates import check_forced, tp_pp_candidates
from controller.planner.colocated import colocated_search
from controller.planner.combine import combine
from controller.planner.deployment import SearchResult, Settled, settle_kv
from controller.planner.evaluate import Evaluator
from controller.planner.grouping import PodGroups
from controller.planner.infeasible import explain_infeasible
from controller.planner.options import Policy, Problem, TimeLimitReached
from controller.planner.results import PhaseResult
from controller.planner.roles import (
    ROLES,
    RoleSpace,
    Split,
    balanced_splits,
    exhaustive_splits,
    role_space,
)
from controller.planner.ttft import checked_ttft

# A grouper turns a pool of GPUs into TP-sized groups for one phase.
Grouper = Callable[[Evaluator, str, list[str], int, int, float], list[PodGroups]]


@dataclass
class PhaseOption:
    """One (TP, PP) candidate of one role on one pool, grouped and priced at T_f = 0."""

    tp: int
    pp: int
    groups: list[PodGroups]
    result: PhaseResult


@dataclass
class PairFound:
    """The best prefill/decode pair of one split (``_best_pair``): its prefill phase, the
    deployment settled on its KV transfer, how many pairs were priced with their KV transfer
    to find it, and its (prefill, decode) candidate numbers in the split's bounds."""

    prefill: PhaseResult
    settled: Settled
    tried: int
    pair: tuple[int, int]


def decode_ref_bytes(ev: Evaluator, pool: Sequence[str], tp: int, pp: int) -> float:
    """Reference all-reduce size for grouping decode GPUs: the batch the KV memory allows,
    capped by ``max_batch`` (the batch search later re-prices the same routes)."""
    ctx = ev.problem.workload.mean_kv_tokens
    gp = ev.fit(pool, tp, pp)
    room = ev.kv_room_bytes(gp, tp, pp) if gp else 0.0
    b = max(
        1, min(ev.problem.options.max_batch, int(room * tp / (ctx * ev.model.kv_bytes_per_token())))
    )
    return ev.activation_bytes(b)


def candidates_for(
    problem: Problem, policy: Policy, role: str, pool: Sequence[str]
) -> list[tuple[int, int]]:
    """(TP, PP) candidates for ``pool`` (Alg. 1 line 2). DistServe-like policies keep TP
    inside a server where that fits; HeroServe takes the union of that list and the
    unrestricted one, so its candidates contain every baseline's. A plan for an engine
    keeps the candidates that engine runs in ``role``."""
    engine = problem.engine
    if engine is None:
        return _candidates(problem, policy, role, pool)
    return [
        c
        for c in _candidates(problem, policy, role, pool)
        if parallelism_problem(engine, role, *c) is None
    ]


def _candidates(
    problem: Problem, policy: Policy, role: str, pool: Sequence[str]
) -> list[tuple[int, int]]:
    g, model, opts = problem.cluster, problem.model, problem.options
    forced = opts.prefill_par if role == "prefill" else opts.decode_par
    mem = [g.nodes[x]["memory_gb"] for x in pool]
    if forced is not None:
        return [forced] if forced in tp_pp_candidates(model, mem, opts.r_frac, 10**6) else []
    per_server: dict[str, int] = {}
    for x in pool:
        s = g.nodes[x].get("server") or x
        per_server[s] = per_server.get(s, 0) + 1
    max_tp = max(per_server.values(), default=0)
    local = tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi, max_tp)
    if policy.prefer_intra_server:
        return local or tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi)
    out = tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi)
    return sorted(set(out) | set(local), key=lambda c: (c[0] * c[1], c[1]))


class PhaseSearch:
    """Prices the phases of one planner: per role, pool and candidate, a cheap capacity
    bound and, on demand, the grouped and priced phase; both cached."""

    def __init__(self, ev: Evaluator, policy: Policy, groupers: Sequence[Grouper]) -> None:
        self.ev = ev
        self.policy = policy
        self.groupers = tuple(groupers)
        self.problem = ev.problem
        # one entry per (role, pool, TP, PP) priced: at most the pools of the role splits x
        # their candidates
        self._cache: dict[tuple, PhaseOption | None] = {}
        # one entry per (role, pool): at most 2 x the role splits' pools
        self._bounds: dict[tuple, list[tuple[float, int, int]]] = {}
        # one entry per (grouping, role, fitting GPUs, TP, PP, message): at most the groupings
        # x the entries of ``_cache``
        self._groupings: dict[tuple, list[PodGroups]] = {}
        self.n_priced = 0  # candidates grouped and priced

    # -- bounds ----------------------------------------------------------------------------
    def capacity_bound(self, role: str, pool: Sequence[str], tp: int, pp: int) -> float:
        return capacity_bound(self.ev, role, pool, tp, pp)

    def bounds(self, role: str, pool: Sequence[str]) -> list[tuple[float, int, int]]:
        """(capacity bound, TP, PP) of every candidate of ``role`` on ``pool`` with a
        positive bound, highest first; cached per (role, pool)."""
        key = (role, frozenset(pool))
        hit = self._bounds.get(key)
        if hit is None:
            cands = candidates_for(self.problem, self.policy, role, pool)
            hit = sorted(
                (b, tp, pp)
                for tp, pp in cands
                if (b := self.capacity_bound(role, pool, tp, pp)) > 0
            )
            hit.sort(key=lambda b: (-b[0], b[1] * b[2], b[2]))
            self._bounds[key] = hit
        return hit

    # -- phases ----------------------------------------------------------------------------
    def most_capacity(self, role: str, pool: Sequence[str]) -> PhaseOption | None:
        """The candidate with the most capacity on ``pool`` (T_f = 0 for decode), by branch
        and bound over the candidates' capacity bounds."""
        best: PhaseOption | None = None
        for bound, tp, pp in self.bounds(role, pool):
            if best is not None and bound <= best.result.capacity * (1 + 1e-9):
                break
            opt = self.priced(role, pool, tp, pp)
            if opt is not None and (best is None or opt.result.capacity > best.result.capacity):
                best = opt
        return best

    def priced(self, role: str, pool: Sequence[str], tp: int, pp: int) -> PhaseOption | None:
        """Candidate (TP, PP) of ``role`` on ``pool`` grouped and priced (T_f = 0 for decode);
        None when it serves nothing. Cached."""
        key = (role, frozenset(pool), tp, pp)
        if key not in self._cache:
            self._cache[key] = self._price(role, pool, tp, pp)
        return self._cache[key]

    def _price(self, role: str, pool: Sequence[str], tp: int, pp: int) -> PhaseOption | None:
        """Group ``pool`` with each of the planner's groupings and price the phase; the
        grouping with the most capacity is kept."""
        ev = self.ev
        fit = ev.fit(pool, tp, pp)
        if len(fit) < tp * pp:  # Alg. 1 lines 7-8
            return None
        if role == "prefill":
            nbytes = ev.prefill_bytes()
        else:  # one reference size per power of two: groupings are shared between PPs
            nbytes = 2.0 ** round(math.log2(decode_ref_bytes(ev, pool, tp, pp)))
        best: PhaseOption | None = None
        for grouper in self.groupers:
            gkey = (grouper, role, frozenset(fit), tp, pp, nbytes)
            groups = self._groupings.get(gkey)
            if groups is None:
                # Named, since each grouping of one candidate is its own line of work.
                name = getattr(grouper, "__name__", "").removesuffix("_grouper")
                self.problem.say(f"  {role}: TP={tp} PP={pp} on {len(fit)} GPUs, {name} grouping")
                groups = grouper(ev, role, fit, tp, pp, nbytes)
                self._groupings[gkey] = groups
            self.n_priced += 1
            if role == "prefill":
                res = ev.prefill_phase(tp, pp, groups)
            else:
                res = ev.decode_phase(tp, pp, groups, 0.0)
            if res.capacity > 0 and (best is None or res.capacity > best.result.capacity):
                best = PhaseOption(tp, pp, groups, res)
        return best


def split_bound(ps: PhaseSearch, split: Split) -> float:
    """An upper bound on H for ``split``: the best min(prefill bound, decode bound)."""
    pb = ps.bounds("prefill", split.prefill)
    db = ps.bounds("decode", split.decode)
    if not pb or not db:
        return 0.0
    return min(pb[0][0], db[0][0])


def _best_pair(
    ps: PhaseSearch,
    split: Split,
    floor: float,
    first: tuple[int, int] | None = None,
    *,
    kv_contention: bool,
) -> PairFound | None:
    """The best prefill/decode pair of one split, with its KV transfer priced. Pairs are
    visited in decreasing order of min(prefill bound, decode bound) and priced on demand;
    the visit stops at the first pair whose bound cannot beat ``floor`` (the best H of
    earlier splits) or the best pair found (branch and bound: every bound is an upper bound
    on the H the pair can reach, its KV transfer included). ``first``: a pair (prefill,
    decode candidate numbers) to price before the others, whose H then prunes them; the
    pair found is returned last. ``kv_contention``: ``settle_kv``'s."""
    ev, problem = ps.ev, ps.problem
    cap = problem.options.max_gpus
    engine = problem.engine
    pb = ps.bounds("prefill", split.prefill)
    db = ps.bounds("decode", split.decode)
    pairs = sorted(
        ((min(bp, bd), i, j) for i, (bp, _, _) in enumerate(pb) for j, (bd, _, _) in enumerate(db)),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    if first is not None:
        pairs.sort(key=lambda x: (x[1], x[2]) != first)  # stable: the rest keep their order
    best: PairFound | None = None
    tried = 0
    for bound, i, j in pairs:
        beat = max(floor, best.settled.combination.rate if best is not None else 0.0)
        if bound <= beat * (1 + 1e-9):
            if (i, j) == first:
                continue
            break
        if problem.out_of_time(beat > 0.0):
            break
        po = ps.priced("prefill", split.prefill, pb[i][1], pb[i][2])
        d0 = ps.priced("decode", split.decode, db[j][1], db[j][2])
        if po is None or d0 is None:
            continue
        if engine is not None and pair_problem(engine, po.tp, d0.tp) is not None:
            continue
        comb0 = combine(po.result, d0.result, problem.sla.ttft_s, cap)
        if comb0 is None or comb0.rate <= beat * (1 + 1e-9):
            continue  # T_f = 0 already cannot beat it; the KV transfer only lowers H
        tried += 1
        pre = po.result
        try:
            settled = settle_kv(
                ev,
                pre,
                d0.result,
                lambda t_f, d0=d0: ev.decode_phase(d0.tp, d0.pp, d0.groups, t_f),
                comb0,
                beat,
                kv_contention=kv_contention,
            )
        except TimeLimitReached:
            if best is None:
                raise  # the split above keeps its best
            break
        if settled is None:
            continue
        if best is None or settled.combination.better_than(best.settled.combination):
            best = PairFound(pre, settled, 0, (i, j))
    if best is not None:
        best.tried = tried
    return best


def _class_rates(
    ps: PhaseSearch, space: RoleSpace, sample: int
) -> tuple[list[float], list[float], tuple[int, int]]:
    """Per class, the rate one of its servers adds in each role: the best candidate priced on
    up to ``sample`` servers of every class at once in that role (fixed-role GPUs included),
    its instance rates shared out over the servers of their GPUs. A sample rather than the
    whole class: on a rail cluster a class is hundreds of twin servers, whose per-server rate
    a few dozen of them already show (what it misses is the left-over GPUs of the last
    instance, a fraction of a percent at that size). Also the GPUs (TP x PP) of those best
    prefill and decode candidates, whose instances set the steps ``balanced_splits`` takes."""
    rates: dict[str, list[float]] = {}
    size: dict[str, int] = {}
    g = ps.ev.g
    picked = [k.servers[:sample] for k in space.classes]
    cls_of = {s: c for c, ss in enumerate(picked) for s in ss}
    everyone = [x for ss in picked for s in ss for x in space.free[s]]
    for role in ROLES:
        fixed = space.fixed_prefill if role == "prefill" else space.fixed_decode
        per = [0.0] * len(space.classes)
        top = ps.most_capacity(role, [*fixed, *everyone])
        size[role] = top.tp * top.pp if top is not None else 1
        if top is not None:
            for inst in top.result.instances:
                members = [x for st in inst.stages for x in st]
                for x in members:
                    c = cls_of.get(g.nodes[x].get("server") or x)
                    if c is not None:
                        per[c] += inst.rate / len(members)
        rates[role] = [
            per[c] * len(space.free[ss[0]]) / sum(len(space.free[s]) for s in ss)
            for c, ss in enumerate(picked)
        ]
    return rates["prefill"], rates["decode"], (size["prefill"], size["decode"])


def _role_splits(
    ps: PhaseSearch, space: RoleSpace, contained: Sequence[tuple[Policy, Sequence[Grouper]]]
) -> tuple[list[Split], str]:
    """The role splits to price and how they were chosen: every split where there are at
    most ``max_splits``; otherwise the splits around this planner's balance point and around
    the balance point of every planner in ``contained``, whose candidates this planner's
    contain (each planner's per-server rates, and so its balance point, are its own: without
    theirs, a planner that may do more could price none of the splits a baseline wins on)."""
    opts = ps.problem.options
    if space.n_splits <= opts.max_splits:
        splits = exhaustive_splits(space)
        return splits, f"all {len(splits)} role splits"
    found: dict[tuple[int, ...], Split] = {}
    for each in [ps, *(PhaseSearch(Evaluator(ps.problem, p), p, gs) for p, gs in contained)]:
        p_rate, d_rate, sizes = _class_rates(each, space, opts.class_sample)
        for sp in balanced_splits(space, p_rate, d_rate, instance_gpus=sizes):
            found.setdefault(sp.counts, sp)
    splits = sorted(found.values(), key=lambda sp: sp.counts)
    points = f"balance points of {1 + len(contained)} planners" if contained else "balance point"
    return splits, f"{len(splits)} role splits around the {points} of {space.n_splits}"


def search(
    problem: Problem,
    policy: Policy,
    groupers: Sequence[Grouper],
    contained: Sequence[tuple[Policy, Sequence[Grouper]]] = (),
) -> SearchResult:
    """The best deployment ``policy`` finds with ``groupers``. ``contained``: the planners
    (policy, groupings) whose candidates this one's contain; their balance points' role
    splits are priced too (``_role_splits``), so its H is never below theirs."""
    check_forced(problem)
    ev = Evaluator(problem, policy)
    ps = PhaseSearch(ev, policy, groupers)
    opts = problem.options
    space = role_space(problem.cluster)
    if not space.classes and not (space.fixed_prefill and space.fixed_decode):
        raise InputError("the cluster needs GPUs for both prefill and decode")
    splits, how = _role_splits(ps, space, contained)
    problem.say(f"{policy.name}: {how}")
    bounded = sorted(
        ((split_bound(ps, sp), k, sp) for k, sp in enumerate(splits, start=1)),
        key=lambda x: (-x[0], x[1]),
    )
    feasible_anywhere = {
        "prefill": any(ps.bounds("prefill", sp.prefill) for sp in splits),
        "decode": any(ps.bounds("decode", sp.decode) for sp in splits),
    }
    # Two passes: the KV transfers' load on decode groups' links (``contend_decode``) is
    # costly to price and only lowers H, so the splits are searched without it first; the
    # split that won is then searched with it, and its H is the floor that prunes every
    # other split and pair from the search with it (most of them at one KV load).
    first = _search_splits(ps, bounded, quiet=True, kv_contention=False)
    best = None
    tried = 0
    if first is not None:
        order = [x for x in bounded if x[2] is first.split]
        order += [x for x in bounded if x[2] is not first.split]
        try:
            best = _search_splits(ps, order, quiet=False, first=first.pair, kv_contention=True)
        except TimeLimitReached:
            # stopped before the second pass settled one deployment: the first pass's, its H
            # without the KV load on decode groups' links (an upper bound), marked so
            label = first.split.label if first.split is not None else "fixed roles"
            problem.say(f"  split {label}: H {first.combination.rate:.3f} req/s, the KV "
                        "load on decode groups' links not priced (time limit)")  # fmt: skip
            best = first
        tried = first.candidates_tried
    if best is not None:
        tried += best.candidates_tried
    # DistServe's low-affinity layouts, priced by this planner, where the role splits were
    # all priced too (on a cluster of hundreds of servers they cost more than the rest of
    # the search and the rail network's own splits beat them)
    if policy.colocated_layouts and space.n_splits <= opts.max_splits and not problem.timed_out:
        co = colocated_search(ev)
        # compared as their plans will state them, after the engines' admission
        # (``checked_ttft``), as ``colocated_search`` ranks its layouts
        if co is not None and (
            best is None
            or checked_ttft(ev, co.prefill, co.combination).better_than(
                checked_ttft(ev, best.prefill, best.combination)
            )
        ):
            problem.say(f"  DistServe low-affinity layout: H {co.combination.rate:.3f} req/s")
            co.candidates_tried += tried
            return co
    if best is None:
        explain_infeasible(problem, policy, space, feasible_anywhere)
    best.candidates_tried = tried
    best.splits_priced = len(splits)
    return best


def _search_splits(
    ps: PhaseSearch,
    bounded: list[tuple[float, int, Split]],
    quiet: bool,
    first: tuple[int, int] | None = None,
    *,
    kv_contention: bool,
) -> SearchResult | None:
    """The best deployment over ``bounded``'s splits ((bound, number, split), visited in
    that order), each split's best pair (``_best_pair``) beating the best so far; the
    visit skips a split whose bound cannot beat it. The result holds its split and ``pair``
    its pair (``_best_pair``); ``candidates_tried`` counts the pairs priced. ``first``: the
    pair of the first split to price first. ``kv_contention``: whether deployments are
    settled with decode priced under the KV load (``settle_kv``)."""
    problem = ps.problem
    best: SearchResult | None = None
    tried = 0
    for bound, k, split in bounded:
        if bound <= 0:
            continue
        floor = best.combination.rate if best is not None else 0.0
        if bound <= floor * (1 + 1e-9):
            continue  # this split cannot beat the best plan
        if problem.out_of_time(best is not None):
            break
        try:
            found = _best_pair(
                ps, split, floor, first if k == bounded[0][1] else None, kv_contention=kv_contention
            )
        except TimeLimitReached:
            if best is None:
                raise  # ``search`` keeps the first pass's
            break
        if found is None:
            continue
        tried += found.tried
        s = found.settled
        comb = s.combination
        if best is None or comb.better_than(best.combination):
            best = SearchResult(
                ps.ev, found.prefill, s.decode, comb, s.t_f, s.kv_flows, tried, split, k,
                found.pair, kv_contention=kv_contention,
            )  # fmt: skip
            problem.plan_in_hand = True
            if not quiet:
                problem.say(
                    f"  split {k}/{len(bounded)} ({split.label}): H {comb.rate:.3f} req/s "
                    f"on {comb.gpus_used} GPUs"
                )
    if best is not None:
        best.candidates_tried = tried
    return best
