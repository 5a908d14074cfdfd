"""Alg. 1 line 2 (gen_tp_pp_candi): candidate (TP, PP) pairs from the memory bound.

Holds ``tp_pp_candidates``, ``valid_tp`` (TP must split the heads) and ``min_gpus``."""

from __future__ import annotations

import math

from controller.models.specs import ModelSpec
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
