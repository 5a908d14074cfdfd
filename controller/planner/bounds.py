"""An upper bound on a phase's capacity, shared by the search and the low-affinity layouts.

``capacity_bound``: the requests/s a (TP, PP) candidate could serve on a pool if it computed
on the pool's fastest GPUs with no communication. The search visits candidates in decreasing
order of it and stops at the first that cannot beat the best found (branch and bound).
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.costmodel.compute import decode_layer_time
from controller.models.gpus import gpu_spec
from controller.planner.evaluate import Evaluator
from controller.units import GB


def capacity_bound(ev: Evaluator, role: str, pool: Sequence[str], tp: int, pp: int) -> float:
    """An upper bound on the phase's capacity (requests/s) on ``pool`` with (TP, PP):
    as many instances as the GPUs allow, each computing on the fastest GPU type of the
    pool with no communication (an all-reduce, hop or KV transfer only adds time)."""
    problem = ev.problem
    model = problem.model
    need = model.param_bytes / (tp * pp * problem.options.r_frac)
    kinds = [(mem, t, k) for (mem, t), k in ev.pool_summary(pool).items() if mem * GB >= need]
    n = sum(k for _, _, k in kinds) // (tp * pp)
    if n == 0:
        return 0.0
    fastest = max({t for _, t, _ in kinds}, key=lambda t: gpu_spec(t).fp16_flops)
    if role == "prefill":
        return n * ev.ideal_prefill_rate(fastest, tp, pp)
    co = ev.coeffs(fastest)
    most = max(mem for mem, _, _ in kinds) * GB * problem.options.r_frac
    room = most - model.param_bytes / (tp * pp)
    ctx = problem.workload.mean_kv_tokens
    b_max = min(
        problem.options.max_batch,
        int(room * tp / (ctx * model.kv_bytes_per_token())) if room > 0 else 0,
    )

    def step(b: int) -> float:
        return model.layers * decode_layer_time(co, model, tp, b, b * ctx)

    if b_max < 1 or step(1) > problem.sla.tpot_s:
        return 0.0
    lo, hi = 1, b_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if step(mid) <= problem.sla.tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return n * lo / (step(lo) / pp * ev.decode_steps)
