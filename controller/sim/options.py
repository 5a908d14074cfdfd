"""Settings of one simulator run: :class:`SimOptions` (each field's comment says what it
changes; docs/simulator.md describes the behaviour behind them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SimOptions:
    """Settings of one run; the defaults are the ones docs/simulator.md reports with."""

    # most input tokens in one prefill batch; 0: the plan's engine's max_num_batched_tokens
    # (models.engines.prefill_admission, what the planner prices)
    prefill_token_budget: int = 0
    # how a prefill instance forms batches (docs/simulator.md "Prefill"): "engine", as vLLM's
    # engine core under the export's --max-num-seqs (at most PP batches, and that many
    # requests, in flight), what the planner prices; "stage", when its first stage is free,
    # everything waiting (this project's rule before it modelled the engines')
    prefill_admission: Literal["stage", "engine"] = "engine"
    # "engine": requests in flight per prefill instance (--max-num-seqs); 0: the export's
    prefill_max_requests: int = 0
    online_scheduler: bool = False  # docs/design.md §8 on every group with several policies
    window_s: float = 0.05  # T_u: the scheduler's utilisation window
    gamma: float = 0.3  # Eq. 18 smoothing
    kv_samples: int = 400  # points of the KV-memory timeline
    route_choices: int = 2  # instances compared per routing decision when there are many
    seed: int = 0  # routing tie-breaks among many instances
    # relative drift of a link's stretch before the activities on it are re-rated
    # (network.py): 0 is the exact fluid model; 0.02 keeps large runs O(1) per event
    rerate_tolerance: float = 0.02
    # decode KV room is enforced as vLLM does: a step that would overflow the cache preempts
    # the micro-batch's most recently admitted requests, whose KV is swapped to host memory
    # over each GPU's host link at this rate (bytes/s; PCIe 3.0 x16 by default) and back
    swap_bytes_per_s: float = 16e9
    # exact shortcuts (docs/simulator.md "Speed"): whole-pass decode steps and lazy step
    # ends. False is the unabridged run (``--exact``): one event per stage iteration, what
    # the shortcuts are tested against
    shortcuts: bool = True
    # the fast path (fastpath.py, ``--fast``): the same rules compiled, every stage iteration
    # and KV transfer at its time alone (no link contention); for clusters the run's traffic
    # does not load, docs/simulator.md "The fast path" gives its agreement
    fast: bool = False
