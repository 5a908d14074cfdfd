"""Alg. 1 (scalability-oriented offline planner) as a search shared by every planner:
list (TP, PP) candidates, group the GPUs of each phase for each candidate (the planner's own
grouping), evaluate prefill and decode concurrently, then combine candidate pairs with their
KV-transfer time and keep the highest per-GPU rate that meets the SLA.

Pairs are visited best upper bound first (the rate with T_f = 0), and the search stops once no
remaining pair's bound beats the best plan found, so the KV transfer is priced for few pairs."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from controller.errors import InputError
from controller.planner.candidates import tp_pp_candidates
from controller.planner.evaluate import Combination, Evaluator, PhaseResult, combine, role_gpus
from controller.planner.grouping import PodGroups
from controller.planner.options import Policy, Problem

# A grouper turns a pool of GPUs into TP-sized groups for one phase.
Grouper = Callable[[Evaluator, str, list[str], int, int, float], list[PodGroups]]


@dataclass
class SearchResult:
    evaluator: Evaluator
    prefill: PhaseResult
    decode: PhaseResult
    combination: Combination
    t_f: float
    kv_flows: list
    candidates_tried: int


def _phase_groups(
    ev: Evaluator,
    role: str,
    cands: list[tuple[int, int]],
    grouper: Grouper,
    nbytes_of: Callable[[int, int], float],
) -> dict[tuple[int, int], list]:
    out = {}
    for k, (tp, pp) in enumerate(cands, start=1):
        pool = ev.pool(role, tp, pp)
        if len(pool) < tp * pp:  # Alg. 1 lines 7-8
            continue
        ev.problem.say(f"  {role}: candidate {k}/{len(cands)} TP={tp} PP={pp} ({len(pool)} GPUs)")
        out[(tp, pp)] = grouper(ev, role, pool, tp, pp, nbytes_of(tp, pp))
    return out


def decode_ref_bytes(ev: Evaluator, tp: int, pp: int) -> float:
    """Reference all-reduce size for grouping decode GPUs: the batch the KV memory allows,
    capped by ``max_batch`` (the batch search later re-prices the same routes)."""
    ctx = ev.problem.workload.mean_kv_tokens
    gp = ev.pool("decode", tp, pp)  # never empty: candidates come from pools that fit
    room = ev.kv_room_bytes(gp, tp, pp) if gp else 0.0
    b = max(
        1, min(ev.problem.options.max_batch, int(room * tp / (ctx * ev.model.kv_bytes_per_token())))
    )
    return ev.activation_bytes(b)


def search(problem: Problem, policy: Policy, grouper: Grouper) -> SearchResult:
    ev = Evaluator(problem, policy)
    model, opts = problem.model, problem.options
    g = problem.cluster
    pools = {r: role_gpus(problem, r) for r in ("prefill", "decode")}
    for role, pool in pools.items():
        if not pool:
            raise InputError(f"the cluster has no GPU that can serve {role}")
    cands = {}
    for role, pool in pools.items():
        mem = [g.nodes[x]["memory_gb"] for x in pool]
        max_tp = None
        if policy.prefer_intra_server:
            per_server = max(
                sum(1 for y in pool if g.nodes[y]["server"] == g.nodes[x]["server"]) for x in pool
            )
            max_tp = per_server
        forced = opts.prefill_par if role == "prefill" else opts.decode_par
        if forced is not None:
            c = [forced] if forced in tp_pp_candidates(model, mem, opts.r_frac, 10**6) else []
            if not c:
                raise InputError(
                    f"{role} TP={forced[0]} PP={forced[1]} is not feasible: TP must "
                    f"split the heads, PP the layers, and the shards must fit"
                )
        else:
            c = tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi, max_tp)
        if not c and max_tp is not None and forced is None:  # DistServe spans servers only
            c = tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi)  # when it must
        if not c:
            total = sum(mem)
            raise InputError(
                f"{model.name} ({model.param_bytes / 1e9:.0f} GB of weights) does not fit in the "
                f"{len(pool)} {role} GPUs ({total:.0f} GB, {opts.r_frac:.0%} usable)"
            )
        cands[role] = c
    problem.say(
        f"{policy.name}: {len(cands['prefill'])} prefill and {len(cands['decode'])} "
        f"decode (TP, PP) candidates"
    )
    with ThreadPoolExecutor(max_workers=2) as pool_ex:  # Alg. 1: the two phases concurrently
        fut_p = pool_ex.submit(
            _phase_groups,
            ev,
            "prefill",
            cands["prefill"],
            grouper,
            lambda tp, pp: ev.prefill_bytes(),
        )
        fut_d = pool_ex.submit(
            _phase_groups,
            ev,
            "decode",
            cands["decode"],
            grouper,
            lambda tp, pp: decode_ref_bytes(ev, tp, pp),
        )
        pre_groups, dec_groups = fut_p.result(), fut_d.result()
    pre = {c: ev.prefill_phase(c[0], c[1], grp) for c, grp in pre_groups.items()}
    dec0 = {c: ev.decode_phase(c[0], c[1], grp, 0.0) for c, grp in dec_groups.items()}
    bounds = []
    for cp, rp in pre.items():
        for cd, rd in dec0.items():
            comb = combine(rp, rd, problem.sla.ttft_s)
            if comb is not None:
                bounds.append((comb.rate_per_gpu, cp, cd))
    bounds.sort(key=lambda b: (-b[0], b[1], b[2]))
    best: SearchResult | None = None
    tried = 0
    for bound, cp, cd in bounds:
        if best is not None and bound <= best.combination.rate_per_gpu:
            break
        tried += 1
        t_f, flows = ev.kv_transfer(pre[cp], dec0[cd])
        rd = ev.decode_phase(cd[0], cd[1], dec_groups[cd], t_f)
        comb = combine(pre[cp], rd, problem.sla.ttft_s)
        if comb is None:
            continue
        # price the KV transfer again between the instances actually deployed
        t_f2, flows2 = ev.kv_transfer(pre[cp], rd, comb.n_prefill, comb.n_decode)
        rd2 = ev.decode_phase(cd[0], cd[1], dec_groups[cd], t_f2)
        comb2 = combine(pre[cp], rd2, problem.sla.ttft_s)
        if comb2 is not None and (comb2.n_prefill, comb2.n_decode) == (
            comb.n_prefill,
            comb.n_decode,
        ):
            t_f, flows, rd, comb = t_f2, flows2, rd2, comb2
        if best is None or comb.rate_per_gpu > best.combination.rate_per_gpu + 1e-15:
            best = SearchResult(ev, pre[cp], rd, comb, t_f, flows, tried)
    if best is None:
        raise InputError(
            f"no deployment of {model.name} meets the SLA (TTFT {problem.sla.ttft_s} s, "
            f"TPOT {problem.sla.tpot_s} s) on this cluster with {policy.name}"
        )
    best.candidates_tried = tried
    return best
