"""Float vectors to the switch's lane format and back (docs/emulation.md, "Lane format").

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
agree on E with one aggregation of ``EXPONENT_LANES`` lanes: each member puts a 1 in the lane
of its own exponent, the switch sums the one-hot vectors, and the highest non-zero lane of
the sum is the group's largest exponent (a maximum computed by an adder).
"""

from __future__ import annotations

import math

import numpy as np

from agents.ina.packet import VECTOR_LEN

LANE_DTYPE = np.dtype(np.int32)
# Exponent range the agreement round can express: |x| from 2**(E_MIN-1) up to 2**E_MAX.
# Two INA vectors of 32 lanes: E in [-32, 31], so magnitudes up to 2**31.
EXPONENT_LANES = 2 * VECTOR_LEN
E_MIN = -32
E_MAX = E_MIN + EXPONENT_LANES - 1
SUM_BITS = 30  # partial sums stay below 2**30 (+ w/2 of rounding): int32 never wraps


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


def exponent_lanes(exponent: int) -> np.ndarray:
    """One-hot int32 vector of ``EXPONENT_LANES`` lanes marking ``exponent``."""
    if not E_MIN <= exponent <= E_MAX:
        raise LaneError(f"exponent {exponent} outside [{E_MIN}, {E_MAX}]")
    v = np.zeros(EXPONENT_LANES, dtype=LANE_DTYPE)
    v[exponent - E_MIN] = 1
    return v


def agreed_exponent(summed: np.ndarray) -> int:
    """The group's largest exponent from the sum of every member's :func:`exponent_lanes`."""
    hits = np.flatnonzero(np.asarray(summed)[:EXPONENT_LANES])
    if hits.size == 0:
        raise LaneError("exponent agreement returned no member's exponent")
    return int(hits[-1]) + E_MIN


def wrap_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int32 addition with wrap-around, the switch's semantics (no overflow warning)."""
    return (a.astype(np.int64) + b.astype(np.int64)).astype(np.uint32).view(np.int32)
