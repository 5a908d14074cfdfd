"""Unit conversions. Inside the program everything is bytes, bytes/s and seconds; Gb/s and
GB appear only at the edges (topology files, CLI flags, printed tables)."""

from __future__ import annotations

GB = 1e9  # bytes (decimal, as GPU and link vendors count)
GiB = 2**30
MB = 1e6
US = 1e-6  # seconds


def gbps(x: float) -> float:
    """Gigabits per second -> bytes per second."""
    return x * 1e9 / 8


def gBps(x: float) -> float:
    """Gigabytes per second -> bytes per second."""
    return x * 1e9


def to_gbps(bytes_per_s: float) -> float:
    return bytes_per_s * 8 / 1e9
