"""Float vectors to the switch's lane formats and back (docs/dataplane.md, "Lane formats";
docs/emulation.md, "Lane format"): ``int32`` fixed point with one exponent per vector, and
``bfp16`` block floating point with one exponent per packet.

The P4 program adds int32 lanes with two's-complement wrap-around (docs/dataplane.md), so a
real vector travels as fixed point: ``q = round(x * scale)``. The scale is a power of two
chosen from the group size ``w`` and a bound on the data, so that no partial sum can
overflow:

    M < 2**E  (E from ``math.frexp`` of the largest |x| of any member)
    scale = 2**(30 - ceil(log2 w) - E)

then ``|sum_w q| <= w * (M * scale + 1/2) < 2**30 + w / 2 < 2**31``: every partial sum the
switch forms fits in int32, whatever the order of arrival.

Error bound: each member's rounding error is at most ``1 / (2 * scale)`` per element, so an
element of the aggregated result differs from the exact real sum by at most
``w / (2 * scale) = w * 2**(E + ceil(log2 w) - 31)`` (:func:`error_bound`): with 4 members
and data below 1.0, 2**-27 (7.5e-9). The integer sum itself is exact.

Every member must use the same scale. :func:`exponent_lanes` and :func:`agreed_exponent`
agree on E with one aggregation of ``AGREEMENT_LANES`` lanes: each member puts a 1 in the
lane of its own exponent, the switch sums the one-hot vectors, and the highest non-zero lane
of the sum is the group's largest exponent (a maximum computed by an adder). A member whose
data cannot travel (NaN, infinity, beyond 2**E_MAX) puts its 1 in ``BAD_DATA_LANE`` instead,
so that every member refuses the all-reduce, not only the one that saw the bad data (the C++
plugin's protocol, csrc/ina/lanes.h, is the same vector).

``bfp16`` (:func:`block_exponent`, :func:`to_bfp16`, :func:`from_bfp16`): a block of
``BFP16_LANES`` elements with exponent E travels as ``round(x * 2**s)`` in int16 lanes,
``s = BFP16_SUM_BITS - ceil(log2 w) - E``, E agreed per packet by the switch's maximum of the
members' proposals in the header's exp byte (agents/ina/packet.py). Error bound per
element: ``w * 2**(-s-1)`` (:func:`bfp16_error_bound`). :func:`bfp16_reference` is the sum
a group of honest members must get, worked without a switch (the emulation and
benchmarks/lane_error.py check against it).
"""

from __future__ import annotations

import math

import numpy as np

from agents.ina.packet import (
    BFP16_LANES,
    BFP16_SUM_BITS,
    EXP_BAD,
    EXP_BIAS,
    EXP_MAX,
    EXP_MIN,
    INT32_SUM_BITS,
    VECTOR_LEN,
)

LANE_DTYPE = np.dtype(np.int32)
# Exponent range the agreement round can express: |x| from 2**(E_MIN-1) up to 2**E_MAX.
# Two INA vectors of 32 lanes: E in [-32, 31], so magnitudes up to 2**31.
EXPONENT_LANES = 2 * VECTOR_LEN
E_MIN = -32
E_MAX = E_MIN + EXPONENT_LANES - 1
# The agreement vector: the one-hot exponent lanes, then one lane counting members whose
# data cannot travel, padded to whole packets (csrc/ina/lanes.h kAgreementLanes).
BAD_DATA_LANE = EXPONENT_LANES
AGREEMENT_LANES = EXPONENT_LANES + VECTOR_LEN
SUM_BITS = INT32_SUM_BITS  # partial sums stay below 2**30 (+ w/2 of rounding): never wraps
BFP16_DTYPE = np.dtype(np.int16)


class LaneError(ValueError):
    """Data that cannot travel as int32 lanes (NaN, infinity, too large)."""


def ceil_log2(n: int) -> int:
    """Smallest k with 2**k >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"need a positive count, got {n}")
    return (n - 1).bit_length()


def exponent_of(max_abs: float) -> int:
    """E with max_abs < 2**E, clamped below at ``E_MIN`` (0 and tiny data share it).

    Raises LaneError when the data is not finite or exceeds 2**E_MAX."""
    if not math.isfinite(max_abs):
        raise LaneError(f"data is not finite (max |x| = {max_abs})")
    if max_abs < 0:
        raise ValueError("max_abs is a magnitude")
    e = math.frexp(max_abs)[1] if max_abs > 0 else E_MIN  # max_abs = m * 2**e, 0.5 <= m < 1
    if e > E_MAX:
        raise LaneError(f"|x| = {max_abs:g} is beyond the lane format's range 2**{E_MAX}")
    return max(e, E_MIN)


def scale_exponent(workers: int, exponent: int) -> int:
    """s such that scale = 2**s keeps the sum of ``workers`` members below 2**30."""
    return SUM_BITS - ceil_log2(workers) - exponent


def error_bound(workers: int, exponent: int) -> float:
    """Largest |aggregated - exact real sum| per element: w / (2 * scale)."""
    return workers * 2.0 ** (-scale_exponent(workers, exponent) - 1)


def max_abs(x: np.ndarray) -> float:
    """Largest magnitude of ``x`` (0 for an empty vector); LaneError if not finite."""
    if x.size == 0:
        return 0.0
    m = float(np.max(np.abs(x)))
    if not math.isfinite(m):
        raise LaneError("data contains NaN or infinity")
    return m


def to_lanes(x: np.ndarray, workers: int, exponent: int) -> np.ndarray:
    """``round(x * 2**s)`` as int32 lanes; ``exponent`` is the group's agreed E.

    Raises LaneError if this member's data exceeds the agreed bound (its lanes could
    overflow the sum)."""
    mine = exponent_of(max_abs(x))
    if mine > exponent:
        raise LaneError(f"data exponent {mine} exceeds the group's agreed exponent {exponent}")
    scale = math.ldexp(1.0, scale_exponent(workers, exponent))
    q = np.rint(np.asarray(x, dtype=np.float64) * scale)
    return q.astype(LANE_DTYPE)


def from_lanes(q: np.ndarray, workers: int, exponent: int) -> np.ndarray:
    """Aggregated lanes back to reals (float64): ``q / 2**s``."""
    return np.ldexp(np.asarray(q, dtype=np.float64), -scale_exponent(workers, exponent))


def exponent_lanes(exponent: int | None) -> np.ndarray:
    """This member's agreement vector (``AGREEMENT_LANES`` int32 lanes): one-hot at
    ``exponent``, or at ``BAD_DATA_LANE`` when ``exponent`` is None (data that cannot
    travel)."""
    v = np.zeros(AGREEMENT_LANES, dtype=LANE_DTYPE)
    if exponent is None:
        v[BAD_DATA_LANE] = 1
        return v
    if not E_MIN <= exponent <= E_MAX:
        raise LaneError(f"exponent {exponent} outside [{E_MIN}, {E_MAX}]")
    v[exponent - E_MIN] = 1
    return v


def member_exponent(x: np.ndarray) -> int | None:
    """What this member proposes in the agreement: its data's exponent, or None when the
    data cannot travel (the bad-data lane)."""
    try:
        return exponent_of(max_abs(x))
    except LaneError:
        return None


def agreed_exponent(summed: np.ndarray) -> int:
    """The group's largest exponent from the sum of every member's :func:`exponent_lanes`;
    LaneError when a member marked bad data (every member refuses alike)."""
    summed = np.asarray(summed)
    if summed.size > BAD_DATA_LANE and summed[BAD_DATA_LANE] != 0:
        raise LaneError(
            f"{int(summed[BAD_DATA_LANE])} member(s) hold data that cannot travel "
            "(NaN, infinity or too large)"
        )
    hits = np.flatnonzero(summed[:EXPONENT_LANES])
    if hits.size == 0:
        raise LaneError("exponent agreement returned no member's exponent")
    return int(hits[-1]) + E_MIN


# -- bfp16 --------------------------------------------------------------------------------
def block_exponent(x: np.ndarray) -> int:
    """The exp byte this member proposes for block ``x``: ``EXP_BIAS + E`` with every
    ``|x| < 2**E`` (E clamped below at EXP_MIN), or ``EXP_BAD`` when the block holds NaN,
    infinity or magnitudes of 2**EXP_MAX and beyond."""
    if x.size == 0:
        return EXP_BIAS + EXP_MIN
    m = float(np.max(np.abs(x)))
    if not math.isfinite(m):
        return EXP_BAD
    e = math.frexp(m)[1] if m > 0 else EXP_MIN
    if e > EXP_MAX:
        return EXP_BAD
    return EXP_BIAS + max(e, EXP_MIN)


def bfp16_scale_exponent(workers: int, exp_byte: int) -> int:
    """s of ``q = round(x * 2**s)`` for a block whose agreed exp byte is ``exp_byte``."""
    if not 0 <= exp_byte < EXP_BAD:
        raise LaneError(f"exp byte {exp_byte} is not an agreed block exponent")
    return BFP16_SUM_BITS - ceil_log2(workers) - (exp_byte - EXP_BIAS)


def to_bfp16(x: np.ndarray, workers: int, exp_byte: int) -> np.ndarray:
    """A block of at most ``BFP16_LANES`` reals as int16 lanes (padded with zeros) at the
    group's agreed ``exp_byte``. LaneError when a member marked the block bad (EXP_BAD) or
    this block exceeds the agreed exponent (its lanes could overflow the sum; the agreement
    being a maximum over the members' proposals, only a wrong proposal round does that)."""
    if exp_byte == EXP_BAD:
        raise LaneError("a member's block cannot travel (NaN, infinity or too large)")
    if x.size > BFP16_LANES:
        raise ValueError(f"a bfp16 block holds {BFP16_LANES} elements, got {x.size}")
    mine = block_exponent(x)
    if mine > exp_byte:
        raise LaneError(
            f"this member's exponent byte {mine} exceeds the agreed {exp_byte} the switch "
            "returned, which is no maximum over the members: a wrong proposal round (a faulty "
            "switch or foreign traffic on the slot)"
        )
    q = np.zeros(BFP16_LANES, dtype=BFP16_DTYPE)
    scaled = np.ldexp(np.asarray(x, dtype=np.float64), bfp16_scale_exponent(workers, exp_byte))
    q[: x.size] = np.rint(scaled).astype(BFP16_DTYPE)
    return q


def from_bfp16(q: np.ndarray, workers: int, exp_byte: int) -> np.ndarray:
    """Summed int16 lanes back to reals (float64): ``q / 2**s``."""
    return np.ldexp(np.asarray(q, dtype=np.float64), -bfp16_scale_exponent(workers, exp_byte))


def bfp16_error_bound(workers: int, exp_byte: int) -> float:
    """Largest |aggregated - exact real sum| per element of a block: w / (2 * 2**s)."""
    return workers * 2.0 ** (-bfp16_scale_exponent(workers, exp_byte) - 1)


def saturating_add16(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, bool]:
    """int16 lanes added with saturation, the switch's bfp16 semantics; and whether any lane
    saturated (the switch's overflow flag)."""
    wide = a.astype(np.int32) + b.astype(np.int32)
    lo, hi = np.iinfo(np.int16).min, np.iinfo(np.int16).max
    return np.clip(wide, lo, hi).astype(np.int16), bool(((wide < lo) | (wide > hi)).any())


def wrap_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int32 addition with wrap-around, the switch's semantics (no overflow warning)."""
    return (a.astype(np.int64) + b.astype(np.int64)).astype(np.uint32).view(np.int32)


def bfp16_reference(data: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """What a bfp16 all-reduce of every member's reals ``data`` (same length) must return,
    as float64, worked block by block from the start as the switch runs it (the largest
    proposal, each member's lanes at that exponent, saturating int16 adds), and the largest
    per-element error bound over the blocks. LaneError when a block cannot travel or a lane
    saturates (members that honour the exponent never saturate one)."""
    w, n = len(data), data[0].size
    out, bound = np.zeros(n), 0.0
    for b in range(0, n, BFP16_LANES):
        blocks = [np.asarray(d[b : b + BFP16_LANES], dtype=np.float64) for d in data]
        byte = max(block_exponent(x) for x in blocks)
        total = np.zeros(BFP16_LANES, dtype=BFP16_DTYPE)
        for x in blocks:
            total, saturated = saturating_add16(total, to_bfp16(x, w, byte))
            if saturated:
                raise LaneError(f"block {b // BFP16_LANES}: a lane saturated")
        out[b : b + BFP16_LANES] = from_bfp16(total, w, byte)[: blocks[0].size]
        bound = max(bound, bfp16_error_bound(w, byte))
    return out, bound
