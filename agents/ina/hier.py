"""Hierarchical INA (plan scheme ``hier``, as NCCL's CollNet does with SHARP).

A group spans servers with ``m`` members each. Inside a server the members form a ring over
NVLink ordered by shard, so that :meth:`Ring.reduce_scatter` leaves the member of rail ``k``
with shard ``k`` of the server's sum; each rail (the members holding shard ``k``, one per
server) aggregates that shard on its own switch with :class:`InaSession`; an all-gather over
NVLink gives every member the whole sum. The controller installs each rail as its own INA
group (``Rail.switch``, ``Rail.slots``), so each member needs only its rail's group.

Holds :class:`HierMember` (one member's two levels, in either lane format),
:func:`ring_shard_sum` (the float32 sum the server's reduce-scatter forms, in the ring's
order) and :func:`hier_bfp16_reference` (what a bfp16 all-reduce must return, and its error
bound; docs/emulation.md, "Host INA library").

Lane formats. ``int32`` (:meth:`HierMember.allreduce_lanes`): the lanes are summed exactly
on both levels, and the exponent agreement (lanes.py) follows the same two levels: the
one-hot exponent lanes are summed over NVLink, then across servers on the rail, so every
member ends with the group's largest exponent. ``bfp16`` (:meth:`HierMember.allreduce_bfp16`):
as NCCL's CollNet, the float data is reduce-scattered in float32 over NVLink (NCCL's ring,
not the switch), each rail sums its members' float32 server sums through
:meth:`InaSession.allreduce_bfp16` (the rail's members propose and agree every block's
exponent: one member per server), and the float32 sums are all-gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.ina.lanes import LaneError, agreed_exponent, bfp16_reference, exponent_lanes
from agents.ina.ring import Ring, chunk_bounds
from agents.ina.transport import InaSession

# float32's unit roundoff (round to nearest, 24-bit significand): a float32 addition's
# result is within |result| * F32_UNIT of the exact sum of its operands.
F32_UNIT = 2.0**-24


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

    def allreduce_bfp16(self, x: np.ndarray) -> np.ndarray:
        """Sum over the whole group of every member's reals ``x`` (same length everywhere),
        as float32 (the type NCCL's buffers have): the float32 reduce-scatter, the shard's
        bfp16 all-reduce on the rail, the all-gather of the float32 sums. A bfp16 sum has at
        most 16 significant bits at a scale float32 holds (2^-141 at the finest), so its
        float32 is exact unless beyond float32's range (then infinity, as any float32 sum).

        LaneError at every member when any rail refused its shard (a block that cannot
        travel, a saturated lane): the refusing rail gathers NaN, which no bfp16 sum can be,
        so every member sees it and the rings and sessions stay in step."""
        data = np.ascontiguousarray(x, dtype=np.float32).ravel()
        shard = self.local.reduce_scatter(data)
        refused = ""
        try:
            summed = self.rail.allreduce_bfp16(shard).astype(np.float32)
        except LaneError as exc:
            refused = str(exc)
            summed = np.full(shard.size, np.nan, dtype=np.float32)
        out = self.local.all_gather(summed, data.size)
        if refused:
            raise LaneError(refused)
        if np.isnan(out).any():
            raise LaneError("another rail refused its shard of the bfp16 all-reduce")
        return out


def ring_shard_sum(server: list[np.ndarray], shard: int) -> np.ndarray:
    """Shard ``shard`` of the float32 sum a server's ring reduce-scatter forms from its
    members' data ``server`` (index = local rank): the ring's order of additions (ring.py:
    rank ``k + 1``'s chunk, then ``k + 2``'s added, ..., rank ``k``'s last), each addition
    in float32."""
    m = len(server)
    lo, hi = chunk_bounds(server[0].size, m)[shard]
    acc = np.asarray(server[(shard + 1) % m][lo:hi], dtype=np.float32).copy()
    for step in range(2, m + 1):
        acc = np.asarray(server[(shard + step) % m][lo:hi], dtype=np.float32) + acc
    return acc


def hier_bfp16_reference(servers: list[list[np.ndarray]]) -> tuple[np.ndarray, float]:
    """What :meth:`HierMember.allreduce_bfp16` must return for every member's data,
    ``servers[j][k]`` = the data of the member of server ``j`` with local rank (shard) ``k``,
    and the per-element bound on its error against the exact sum of that data: each rail's
    bfp16 sum of its ``S = len(servers)`` server sums (``lanes.bfp16_reference`` on the
    shard: its largest block bound ``S 2^(-s-1)``) plus float32's rounding in the
    reduce-scatter, ``(m - 1) F32_UNIT / (1 - (m - 1) F32_UNIT)`` times the largest sum of
    |x| over all members (recursive summation's bound, Higham, "Accuracy and Stability of
    Numerical Algorithms", Eq. 4.4: each server's m - 1 additions; the servers' errors add)."""
    m, n = len(servers[0]), servers[0][0].size
    out, bound = np.zeros(n, dtype=np.float32), 0.0
    for k, (lo, hi) in enumerate(chunk_bounds(n, m)):
        sums, b = bfp16_reference([ring_shard_sum(server, k) for server in servers])
        out[lo:hi] = sums.astype(np.float32)
        bound = max(bound, b)
    gamma = (m - 1) * F32_UNIT / (1 - (m - 1) * F32_UNIT)
    total_abs = sum(np.abs(np.asarray(x, dtype=np.float64)) for srv in servers for x in srv)
    return out, bound + gamma * float(np.max(total_abs, initial=0.0))
