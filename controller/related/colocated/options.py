"""Settings of one colocated simulator run: :class:`ColocatedOptions`."""

from __future__ import annotations

from dataclasses import dataclass

from controller.models.engines import InFlight


@dataclass(frozen=True)
class ColocatedOptions:
    """Settings of one run (vLLM's defaults where it has one)."""

    prefill_token_budget: int = InFlight.prefill_batch_tokens  # vLLM's max_num_batched_tokens
    seed: int = 0  # ties in the Swarm and mapper policies, output-length predictions
    vllm_watermark: float = 0.01  # vLLM admits a prompt only if this share of KV stays free
    window_after_s: float = 0.0  # throughput window starts after this (warm-up), s
    # stop at this simulated time (offline throughput: the window ends here); None: run until
    # every request has finished
    horizon_s: float | None = None
    # stop once this many requests are sure to miss the SLA (TTFT at their first token, TPOT
    # at their last): the attainment is then known to be below 1 - stop_misses / requests,
    # which is all a search for the SLA-meeting rate asks of an overloaded point. None: run on
    stop_misses: int | None = None
