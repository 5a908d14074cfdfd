"""Hierarchical INA (plan scheme ``hier``, as NCCL's CollNet does with SHARP).

A group spans servers with ``m`` members each. Inside a server the members form a ring over
NVLink ordered by shard, so that :meth:`Ring.reduce_scatter` leaves the member of rail ``k``
with shard ``k`` of the server's sum; each rail (the members holding shard ``k``, one per
server) aggregates that shard on its own switch with :class:`InaSession`; an all-gather over
NVLink gives every member the whole sum. The controller installs each rail as its own INA
group (``Rail.switch``, ``Rail.slots``), so each member needs only its rail's group.

Exponent agreement (lanes.py) follows the same two levels: the one-hot exponent lanes are
summed over NVLink, then across servers on the rail, so every member ends with the group's
largest exponent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.ina.lanes import agreed_exponent, exponent_lanes
from agents.ina.ring import Ring
from agents.ina.transport import InaSession


@dataclass
class HierMember:
    """One member's two levels: its server's ring (rank = its shard) and its rail's INA."""

    local: Ring
    rail: InaSession

    def allreduce_lanes(self, lanes: np.ndarray) -> np.ndarray:
        """Sum over the whole group of every member's int32 lanes."""
        x = np.ascontiguousarray(lanes).ravel()
        shard = self.local.reduce_scatter(x)
        summed = self.rail.allreduce_lanes(shard)
        return self.local.all_gather(summed, x.size)

    def agree_exponent(self, exponent: int | None) -> int:
        counts = self.local.allreduce(exponent_lanes(exponent))
        return agreed_exponent(self.rail.allreduce_lanes(counts))
