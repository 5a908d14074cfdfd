"""Engine profiles: a serving engine's measured compute times for one model shape on one kind
of hardware (docs/engine-profile.md).

Holds ``ComputeProfile`` (the file's content, checked), ``read_profile`` (a file, bounded and
validated like every input: docs/inputs.md), ``profile_from_doc`` (the same checks on a parsed
document) and ``FORMAT`` (the version tag a file carries). ``heroserve profile`` writes the
files (``controller/cli/profile.py``); the cost model fits Eqs. 12-13 to them
(``controller/costmodel/profiled.py``).

A file is JSON; times are seconds of the whole model (every layer, the engine's own step
overheads included), lengths are tokens:

    {"format": "heroserve-profile/1", "model": "OPT-125M", "gpu_type": "H100",
     "hardware": "...", "engine": "vllm 0.11.0", "tp": 1, "dtype": "bfloat16",
     "prefill": {"batch_sizes": [1, 2], "prompt_lengths": [32, 64],
                 "time_s": [[t, t], [t, t]]},
     "decode": {"batch_sizes": [1, 4], "context_lengths": [64, 128],
                "time_s": [[t, t], [t, t]]}}

``prefill.time_s[i][j]``: one engine step that prefills ``batch_sizes[i]`` prompts of
``prompt_lengths[j]`` tokens each; ``decode.time_s[i][j]``: one decode step of
``batch_sizes[i]`` requests each holding ``context_lengths[j]`` tokens. No message quotes the
file's content: a problem is named by its field and position.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.errors import InputError
from controller.inputs.documents import parse_json, read_text
from controller.inputs.limits import MAX_BATCH, MAX_PARALLEL, MAX_STRING, MAX_TOKENS

FORMAT = "heroserve-profile/1"
MAX_PROFILE_BYTES = 1 << 20  # a 64 x 64 grid of two tables is ~100 kB of JSON
MAX_GRID = 64  # points on one axis of a table
MAX_TIME_S = 3600.0  # one engine step of an hour is no measurement of a serving engine

# table -> (its row axis, its column axis)
TABLES = {
    "prefill": ("batch_sizes", "prompt_lengths"),
    "decode": ("batch_sizes", "context_lengths"),
}
_TEXT = ("model", "gpu_type", "hardware", "engine", "dtype")


@dataclass(frozen=True)
class Table:
    """One measured grid: ``times[i][j]`` seconds at ``rows[i]`` x ``cols[j]``."""

    rows: tuple[int, ...]
    cols: tuple[int, ...]
    times: tuple[tuple[float, ...], ...]

    def points(self) -> list[tuple[int, int, float]]:
        """Every (row value, column value, seconds) of the grid."""
        return [
            (r, c, self.times[i][j])
            for i, r in enumerate(self.rows)
            for j, c in enumerate(self.cols)
        ]


@dataclass(frozen=True)
class ComputeProfile:
    model: str  # a name of controller/models/specs.py
    gpu_type: str  # the topology's GPU type the measurements stand for
    hardware: str  # what was measured, in words (CPU or GPU model, cores)
    engine: str  # engine and version
    tp: int
    dtype: str
    prefill: Table
    decode: Table
    digest: str  # sha256 of the file's bytes: a plan records which profile priced it

    def to_doc(self) -> dict[str, Any]:
        """The file's document (``digest`` is the file's, not part of it)."""
        doc: dict[str, Any] = {"format": FORMAT}
        doc.update({k: getattr(self, k) for k in _TEXT})
        doc["tp"] = self.tp
        for name, (rows, cols) in TABLES.items():
            t: Table = getattr(self, name)
            doc[name] = {
                rows: list(t.rows),
                cols: list(t.cols),
                "time_s": [list(r) for r in t.times],
            }
        return doc


def profile_json(doc: dict[str, Any]) -> str:
    """A profile document as its file's text."""
    return json.dumps(doc, indent=1) + "\n"


def read_profile(path: str | Path) -> ComputeProfile:
    """The profile in ``path``, checked (module docstring); InputError names what is wrong."""
    text = read_text(path, "profile", MAX_PROFILE_BYTES)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return profile_from_doc(parse_json(text, str(path)), str(path), digest)


def profile_from_doc(doc: Any, source: str, digest: str = "") -> ComputeProfile:
    """A ``ComputeProfile`` from a parsed document, every field checked."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a profile is a JSON object")
    known = {"format", "tp", *_TEXT, *TABLES}
    extra = sorted(set(doc) - known)
    if extra:
        raise InputError(f"{source}: {len(extra)} unknown field(s); a profile has {sorted(known)}")
    if doc.get("format") != FORMAT:
        raise InputError(f"{source}: field 'format' must be {FORMAT!r}")
    text = {}
    for k in _TEXT:
        v = doc.get(k)
        if not isinstance(v, str) or not v.strip() or len(v) > MAX_STRING:
            raise InputError(
                f"{source}: field {k!r} must be a non-empty string of at most {MAX_STRING} "
                "characters"
            )
        text[k] = v
    tp = doc.get("tp")
    if type(tp) is not int or not 1 <= tp <= MAX_PARALLEL:
        raise InputError(f"{source}: field 'tp' must be an integer in [1, {MAX_PARALLEL}]")
    tables = {
        name: _table(doc.get(name), f"{source}: {name}", axes) for name, axes in TABLES.items()
    }
    return ComputeProfile(**text, tp=tp, **tables, digest=digest)


def _table(t: Any, where: str, axes: tuple[str, str]) -> Table:
    if not isinstance(t, dict) or set(t) != {*axes, "time_s"}:
        raise InputError(f"{where} must be an object with exactly {sorted({*axes, 'time_s'})}")
    rows = _axis(t[axes[0]], f"{where}.{axes[0]}", MAX_BATCH)
    cols = _axis(t[axes[1]], f"{where}.{axes[1]}", MAX_TOKENS)
    times = t["time_s"]
    if not isinstance(times, list) or len(times) != len(rows):
        raise InputError(f"{where}.time_s must be a list of {len(rows)} rows (one per {axes[0]})")
    out = []
    for i, row in enumerate(times):
        if not isinstance(row, list) or len(row) != len(cols):
            raise InputError(f"{where}.time_s[{i}] must be a list of {len(cols)} times")
        for j, x in enumerate(row):
            if type(x) not in (int, float) or not math.isfinite(x) or not 0 < x <= MAX_TIME_S:
                raise InputError(f"{where}.time_s[{i}][{j}] must be seconds in (0, {MAX_TIME_S:g}]")
        out.append(tuple(float(x) for x in row))
    return Table(rows, cols, tuple(out))


def _axis(v: Any, where: str, high: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_GRID:
        raise InputError(f"{where} must be a list of 1 to {MAX_GRID} integers")
    for k, x in enumerate(v):
        if type(x) is not int or not 1 <= x <= high:
            raise InputError(f"{where}[{k}] must be an integer in [1, {high}]")
        if k and x <= v[k - 1]:
            raise InputError(f"{where} must increase strictly (position {k})")
    return tuple(v)
