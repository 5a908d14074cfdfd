"""What pricing a placement yields, shared by the evaluator, the search and the plan's assembly.

- ``InstanceEval``: one instance priced (Eqs. 2-6 and 12-13 for its stages).
- ``PhaseResult``: the instances of one role at one (TP, PP), with their total capacity.
- ``stage_key``: an instance's stages as a hashable key, independent of their order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.costmodel.queueing import PrefillTimes


@dataclass
class InstanceEval:
    """One instance priced: its stages, the communication and compute terms, and the rate it
    sustains within the SLA."""

    stages: list[list[str]]
    allreduce_s: list[float]  # one all-reduce per stage at the phase's message size
    hop_s: list[float]  # pipeline hop after each stage but the last (Eq. 6)
    compute_s: float  # one request (prefill) or one step (decode) over all layers
    comm_s: float
    serve_s: float  # prefill: request latency; decode: step latency without T_f
    bottleneck_s: float  # busiest pipeline stage per request (prefill) or per step (decode)
    rate: float  # requests/s within the SLA
    batch: int  # decode batch (micro-batch per pipeline stage); 1 for prefill
    tpot_s: float = 0.0
    ttft: PrefillTimes | None = None  # prefill: times per request length, for TTFT percentiles


@dataclass
class PhaseResult:
    """The instances of one role at one (TP, PP), each priced (``InstanceEval``)."""

    role: str
    tp: int
    pp: int
    groups: list[list[list[str]]]  # per instance, its stages
    instances: list[InstanceEval] = field(default_factory=list)
    gpu_type: str = ""

    @property
    def capacity(self) -> float:
        return sum(i.rate for i in self.instances)


def stage_key(stages: Sequence[Sequence[str]]) -> tuple:
    """A hashable key of an instance's stages, independent of their order."""
    return tuple(sorted(tuple(s) for s in stages))
