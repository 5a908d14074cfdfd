"""Alg. 1 line 2 (gen_tp_pp_candi): candidate (TP, PP) pairs from the memory bound.

Holds ``tp_pp_candidates``, ``valid_tp`` (TP must split the heads), ``min_gpus`` and
``forced_problem`` and ``check_forced`` (why a forced (TP, PP) cannot be planned)."""

from __future__ import annotations

import math

from controller.errors import InputError
from controller.models.engines import pair_problem, parallelism_problem
from controller.models.specs import ModelSpec
from controller.planner.options import Problem
from controller.units import GB


def min_gpus(model: ModelSpec, memory_gb: list[float], r_frac: float) -> int:
    """The fewest GPUs whose usable memory holds the weights: R / (M_g * R_frac) with the
    largest GPUs first (Alg. 1, step 1)."""
    need = model.param_bytes
    total = 0.0
    for i, m in enumerate(sorted(memory_gb, reverse=True), start=1):
        total += m * GB * r_frac
        if total >= need:
            return i
    return math.inf  # type: ignore[return-value]


def valid_tp(model: ModelSpec, tp: int) -> bool:
    """TP must split the attention heads and the KV heads evenly (or replicate KV heads)."""
    if model.heads % tp:
        return False
    return model.kv_heads % tp == 0 or tp % model.kv_heads == 0


def tp_pp_candidates(
    model: ModelSpec,
    memory_gb: list[float],
    r_frac: float,
    max_candi: int,
    max_tp: int | None = None,
) -> list[tuple[int, int]]:
    """Pairs (TP, PP), TP a power of two splitting the heads, PP dividing the layers, whose
    TP*PP GPUs can hold the weights (the largest GPUs at most ``r_frac`` full; Alg. 1 line 6
    then drops the GPUs too small for a pair) and fit in
    the pool; the smallest instances first, at most ``max_candi``."""
    n = len(memory_gb)
    if n == 0:
        return []
    largest = max(memory_gb) * GB * r_frac
    out = []
    tp = 1
    while tp <= n:
        if valid_tp(model, tp) and (max_tp is None or tp <= max_tp):
            for pp in range(1, n // tp + 1):
                if model.layers % pp:
                    continue
                if model.param_bytes / (tp * pp) <= largest:
                    out.append((tp, pp))
        tp *= 2
    out.sort(key=lambda c: (c[0] * c[1], c[1]))
    return out[:max_candi]


def forced_problem(
    model: ModelSpec, memory_gb: list[float], r_frac: float, role: str, tp: int, pp: int
) -> str | None:
    """Why a forced (TP, PP) of ``role`` cannot be planned on GPUs of ``memory_gb`` (those
    that may take the role), as one line; None when ``tp_pp_candidates`` would list it."""
    what = f"{role} TP={tp} PP={pp}"
    if tp & (tp - 1) or not valid_tp(model, tp):
        return (
            f"{what}: TP must be a power of two splitting {model.name}'s {model.heads} "
            f"attention heads ({model.kv_heads} KV heads)"
        )
    if model.layers % pp:
        return f"{what}: PP must divide {model.name}'s {model.layers} layers"
    if tp * pp > len(memory_gb):
        return f"{what} needs {tp * pp} GPUs; the cluster has {len(memory_gb)} that may {role}"
    shard = model.param_bytes / (tp * pp)
    holders = sum(1 for m in memory_gb if m * GB * r_frac >= shard)
    if holders < tp * pp:
        return (
            f"{what}: a 1/{tp * pp} weight shard of {model.name} is {shard / GB:.1f} GB; "
            f"{holders} of the GPUs that may {role} hold it at r_frac {r_frac:g}, "
            f"{tp * pp} needed"
        )
    return None


def check_forced(problem: Problem) -> None:
    """Raise :class:`InputError` naming why ``--prefill-par``/``--decode-par`` cannot be
    honoured (the model, the cluster, or the engine the plan is for), rather than planning
    something else."""
    g, model, opts, engine = problem.cluster, problem.model, problem.options, problem.engine
    forced = {"prefill": opts.prefill_par, "decode": opts.decode_par}
    for role, par in forced.items():
        if par is None:
            continue
        mem = [
            d["memory_gb"]
            for _, d in g.nodes(data=True)
            if d.get("kind") == "gpu" and d.get("role", "any") in (role, "any")
        ]
        bad = forced_problem(model, mem, opts.r_frac, role, *par)
        if bad is None and engine is not None:
            bad = parallelism_problem(engine, role, *par)
        if bad is not None:
            raise InputError(f"--{role}-par {par[0]}x{par[1]} cannot be honoured: {bad}")
    pre, dec = forced["prefill"], forced["decode"]
    if engine is not None and pre is not None and dec is not None:
        bad = pair_problem(engine, pre[0], dec[0])
        if bad is not None:
            raise InputError(f"--prefill-par/--decode-par cannot be honoured: {bad}")
