"""What a journal's row must hold to be believed: a simulation point's result
(``sweep.run_point``), checked when read back, since the journal file is hostile input
(``evaluation.journal``). A row that fails names its first problem; the runner then runs
that job again (one warning line), so a wrong type or an impossible value never reaches a
report and never ends in a traceback. An ablation job's document has its own check
(``ablation_sim.ablation_problem``).

Holds ``point_problem``.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from controller.sim.metrics import SimResult

# Keys ``run_point`` adds to ``SimResult.to_dict`` (whose per-request lists it drops).
_ADDED = {"planner": str, "rate": float, "rate_per_gpu": float, "halves": list}
_DROPPED = {"per_request", "link_util"}
# Latency summaries (seconds): NaN is what the simulator writes when no request got there
# (``metrics.percentiles`` of nothing); negative or infinite is impossible.
_LATENCIES = {"ttft_s", "tpot_s", "e2e_s", "kv_transfer_s"}
_FRACTIONS = {"attainment", "peak_kv_fraction"}
# kept only where the sweep asked for it (sweep.run_point's keep_timeline): absent is valid
_OPTIONAL = {"kv_timeline"}


def _number(v: Any, integral: bool) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) if integral else isinstance(v, (int, float))


def _bad_number(name: str, v: Any, integral: bool = False) -> str | None:
    if not _number(v, integral):
        return f"{name} is {type(v).__name__}, not {'an integer' if integral else 'a number'}"
    if not math.isfinite(v):
        return f"{name} is {v}"
    if v < 0:
        return f"{name} is negative ({v})"
    return None


def _bad_summary(name: str, d: Any) -> str | None:
    if not isinstance(d, dict):
        return f"{name} is {type(d).__name__}, not a mapping"
    for k, v in d.items():
        if not isinstance(k, str):
            return f"{name} has a key that is not text"
        if name in _LATENCIES and _number(v, False) and math.isnan(v):
            continue
        if (p := _bad_number(f"{name}.{k}", v)) is not None:
            return p
    return None


def _bad_halves(v: Any) -> str | None:
    """The problem of ``sweep.halves``' [met, requests, slack] of a run's two halves: met and
    requests integers, met at most requests, slack a non-negative number (infinite where a
    request never finished)."""
    if not isinstance(v, list) or len(v) != 2:
        return "halves is not the run's two halves"
    for i, h in enumerate(v):
        if not isinstance(h, list) or len(h) != 3:
            return f"halves[{i}] is not [met, requests, slack]"
        met, n, slack = h
        if (p := _bad_number(f"halves[{i}] met", met, integral=True)) is not None:
            return p
        if (p := _bad_number(f"halves[{i}] requests", n, integral=True)) is not None:
            return p
        if met > n:
            return f"halves[{i}]: {met} met of {n} requests"
        if not _number(slack, False) or math.isnan(slack) or slack < 0:
            return f"halves[{i}] slack is {slack!r}, not a non-negative number"
    return None


def point_problem(d: Any) -> str | None:
    """The first problem of ``d`` as a simulation point's result, or None: every field of
    ``SimResult`` (less the per-request lists) and the runner's own keys, of their types;
    numbers finite and non-negative (latency summaries may be NaN: nothing measured);
    attainment and KV fraction in [0, 1]; the KV timeline a list of (time, fraction); the
    halves as ``maxrate.judge`` reads them (``_bad_halves``)."""
    if not isinstance(d, dict):
        return f"the result is {type(d).__name__}, not a mapping"
    want: dict[str, Any] = {f.name: f.type for f in fields(SimResult) if f.name not in _DROPPED}
    want.update(_ADDED)
    for name, typ in want.items():
        if name not in d:
            if name in _OPTIONAL:
                continue
            return f"the result has no {name!r}"
        v, t = d[name], str(typ)
        if name == "planner":
            if not isinstance(v, str) or not v:
                return "planner is not a name"
        elif name == "halves":
            if (p := _bad_halves(v)) is not None:
                return p
        elif name == "kv_timeline":
            if not isinstance(v, list) or any(
                not isinstance(x, list) or len(x) != 2 or any(_bad_number("", y) for y in x)
                for x in v
            ):
                return "kv_timeline is not a list of (time, fraction) pairs"
        elif t.startswith("dict"):
            if (p := _bad_summary(name, v)) is not None:
                return p
        elif (p := _bad_number(name, v, integral=t == "int")) is not None:
            return p
        elif name in _FRACTIONS and v > 1:
            return f"{name} is {v}, not in [0, 1]"
    if d["finished"] > d["requests"]:
        return f"finished {d['finished']} is more than the {d['requests']} requests"
    return None
