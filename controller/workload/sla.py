"""Service-level agreement: TTFT and TPOT bounds and the attainment percentile."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from controller.errors import InputError


@dataclass(frozen=True)
class SLA:
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9  # fraction of requests that must meet both bounds

    def __post_init__(self) -> None:
        if not (0 < self.ttft_s < math.inf and 0 < self.tpot_s < math.inf):  # NaN fails too
            raise InputError(
                f"SLA bounds must be positive and finite (ttft={self.ttft_s}, tpot={self.tpot_s})"
            )
        if not 0 < self.attainment <= 1:  # NaN fails too
            raise InputError(f"SLA attainment must be in (0, 1], got {self.attainment}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# The paper's defaults (§V): testbed with OPT-66B, large scale with OPT-175B.
_DEFAULTS = {
    ("chatbot", "testbed"): (2.5, 0.15),
    ("summarization", "testbed"): (15.0, 0.15),
    ("chatbot", "large"): (4.0, 0.2),
    ("summarization", "large"): (25.0, 0.2),
}


def default_sla(workload: str, scale: str = "testbed") -> SLA:
    ttft, tpot = _DEFAULTS.get((workload, scale), _DEFAULTS[("chatbot", scale)])
    return SLA(ttft, tpot)
