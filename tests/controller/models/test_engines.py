"""Engine profiles (controller/models/engines.py): each rule refuses what the engine refuses
at start, in one line naming the rule, and lets through what it runs."""

from __future__ import annotations

import pytest

from controller.errors import InputError
from controller.models.engines import (
    SGLANG,
    VLLM,
    engine_profile,
    in_flight,
    pair_problem,
    parallelism_problem,
    placement_problem,
)


def _on(*shares: tuple[str, int]) -> dict[str, str]:
    """GPU id -> server for GPUs ``server-gK`` numbered in order on each server."""
    return {f"{s}-g{k}": s for s, n in shares for k in range(n)}


def _stages(gpus: list[str], tp: int) -> list[list[str]]:
    return [gpus[i : i + tp] for i in range(0, len(gpus), tp)]


def test_vllm_decode_runs_pp_1_only_and_prefill_any_pp() -> None:
    bad = parallelism_problem(VLLM, "decode", 4, 2)
    assert bad is not None and "decode with PP <= 1" in bad and "TP=4 PP=2" in bad
    assert "\n" not in bad
    assert parallelism_problem(VLLM, "decode", 8, 1) is None
    assert parallelism_problem(VLLM, "prefill", 1, 8) is None
    # SGLang's decode pipelines
    assert parallelism_problem(SGLANG, "decode", 4, 2) is None


def test_vllm_decode_tp_is_a_multiple_of_prefill_tp() -> None:
    assert pair_problem(VLLM, 1, 8) is None and pair_problem(VLLM, 2, 4) is None
    bad = pair_problem(VLLM, 4, 2)
    assert bad is not None and "decode TP a multiple of prefill TP" in bad
    assert pair_problem(VLLM, 2, 6) is None and pair_problem(VLLM, 4, 6) is not None
    assert pair_problem(SGLANG, 4, 2) is None


def test_sglang_splits_pp_ranks_evenly_over_servers() -> None:
    # 1x12 on 8 + 4 GPUs: SGLang puts 6 stages on each node, the second sees 4 GPUs
    uneven = _on(("a", 8), ("b", 4))
    bad = placement_problem(SGLANG, "prefill/0", _stages(list(uneven), 1), uneven)
    assert bad is not None and "prefill/0" in bad and "8+4 GPUs on 2 servers" in bad
    even = _on(("a", 6), ("b", 6))
    assert placement_problem(SGLANG, "prefill/0", _stages(list(even), 1), even) is None
    # vLLM's Ray executor places ranks itself: no such rule
    assert placement_problem(VLLM, "prefill/0", _stages(list(uneven), 1), uneven) is None


def test_sglang_wants_whole_consecutive_stages_per_server() -> None:
    servers = _on(("a", 4), ("b", 4))
    a, b = [f"a-g{k}" for k in range(4)], [f"b-g{k}" for k in range(4)]
    # stages alternate between the servers: equal shares, but rank 1 is on the wrong node
    alternating = [[a[0]], [b[0]], [a[1]], [b[1]], [a[2]], [b[2]], [a[3]], [b[3]]]
    bad = placement_problem(SGLANG, "decode/1", alternating, servers)
    assert bad is not None and "rank 1 (b-g0)" in bad
    # TP=2 PP=3 on 3 + 3 GPUs: three stages do not split over two nodes
    six = _on(("a", 3), ("b", 3))
    bad = placement_problem(SGLANG, "decode/0", _stages(list(six), 2), six)
    assert bad is not None and "PP=3 does not split over 2 servers" in bad
    # TP=8 PP=1 over two servers: each node holds half of the stage's ranks
    assert placement_problem(SGLANG, "decode/0", [a + b], servers) is None
    # TP=4 PP=2, a stage per server
    assert placement_problem(SGLANG, "decode/0", [a, b], servers) is None


def test_a_prefill_keeps_enough_requests_in_flight_for_its_batches_to_fill() -> None:
    # at least a request per stage and the engine's own default (256), whichever is more
    assert in_flight(VLLM, "prefill", 8, 1) == 256
    assert in_flight(SGLANG, "prefill", 2, 5) == 256
    assert in_flight(VLLM, "prefill", 300, 1) == 300
    assert in_flight(VLLM, "prefill", 1, 1000) == 1000
    assert in_flight(VLLM, "decode", 2, 3) == 3  # a decode batch is already its limit


def test_unknown_engine_is_one_line() -> None:
    with pytest.raises(InputError, match="unknown engine 'trt'; known: vllm, sglang"):
        engine_profile("trt")
