"""Loss, duplication and reordering of packets with Linux netem's semantics.

One description and one decision rule (:meth:`Impairments.fate`) for both places that impair
traffic in user space: the emulation's link emulator (mininet/linkemu.py; the kernels this
project runs on may lack ``sch_netem``) and the loopback switch of the tests
(agents/ina/loopback.py). As in netem: a duplicate is impaired on its own, and a reordered
packet skips the delay every other packet waits, so it overtakes those queued.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIN_REORDER_DELAY_S = 1e-3  # netem reorders only packets that would otherwise wait


@dataclass(frozen=True)
class Impairments:
    """Probabilities per packet and per direction (fractions, not percent)."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 <= v < 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1), got {v}")

    def __bool__(self) -> bool:
        return bool(self.loss or self.duplicate or self.reorder)

    def fate(self, rng: random.Random, delay_s: float) -> list[float]:
        """Delays (seconds from now) at which to deliver the copies of one packet that
        would otherwise wait ``delay_s``: [] when it is lost, two entries when duplicated."""
        if self.loss and rng.random() < self.loss:
            return []
        copies = 2 if self.duplicate and rng.random() < self.duplicate else 1
        wait = max(delay_s, MIN_REORDER_DELAY_S) if self.reorder else delay_s
        return [
            0.0 if self.reorder and rng.random() < self.reorder else wait for _ in range(copies)
        ]
