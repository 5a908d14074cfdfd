"""Trace files: real request lengths (and arrival times) to simulate or plan for.

Formats (docs/simulator.md):
- CSV with a header naming ``input_tokens``, ``output_tokens`` and optionally ``arrival_s``
  (no other column: a misspelt one is an error, not silently ignored);
- a JSON list of objects with those keys;
- a ShareGPT JSON file: a list of ``{"conversations": [{"from": ..., "value": ...}, ...]}``
  items (other keys such as ``id`` are ignored, as ShareGPT dumps carry them), where each
  ``human`` turn followed by a ``gpt`` turn is one request, with tokens approximated as
  ``ceil(characters / 4)`` (the usual ~4 characters per BPE token of English text).

Token counts are integers in [1, MAX_TOKENS]; arrivals finite seconds in [0, MAX_ARRIVAL_S],
given for every request or for none. Errors name the file and the row or item.

Holds :func:`load_trace` (a file), :func:`trace_rows` (a parsed JSON document),
:func:`workload_of` (checked rows to a :class:`~controller.workload.base.Workload`) and
:func:`tokens_of` (ShareGPT's token approximation).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from controller.errors import InputError
from controller.inputs.documents import parse_json, read_text
from controller.inputs.limits import (
    MAX_ARRIVAL_S,
    MAX_TOKENS,
    MAX_TRACE_BYTES,
    MAX_TRACE_REQUESTS,
)
from controller.inputs.schema import (
    Key,
    Number,
    Record,
    SchemaError,
    Str,
    shown,
    unknown_key,
)
from controller.workload.base import Workload

CHARS_PER_TOKEN = 4.0

TOKENS = Number(low=1, high=MAX_TOKENS, integer=True)
ARRIVAL = Number(low=0, high=MAX_ARRIVAL_S)
ROW = Record(
    {
        "input_tokens": Key(TOKENS, required=True),
        "output_tokens": Key(TOKENS, required=True),
        "arrival_s": Key(ARRIVAL),
    },
    what="a request: a mapping with input_tokens, output_tokens and optionally arrival_s",
)
TURN = Str(max_len=MAX_TOKENS * int(CHARS_PER_TOKEN))  # a longer turn exceeds MAX_TOKENS
SPEAKER = Str(max_len=64)
COLUMNS = tuple(ROW.keys)


def tokens_of(text: str) -> int:
    """ShareGPT's token approximation: ceil(characters / 4), at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def load_trace(path: str | Path) -> Workload:
    """Load a CSV, JSON or ShareGPT trace (see the module docstring)."""
    p = Path(path)
    text = read_text(p, "trace", MAX_TRACE_BYTES)
    if p.suffix.lower() == ".csv":
        rows = _csv_rows(text, str(p))
    else:
        rows = trace_rows(parse_json(text, str(p)), str(p))
    return workload_of(rows, p.stem, str(p))


def _csv_rows(text: str, source: str) -> list[dict[str, Any]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(f"{source}: empty CSV (needs a header: {','.join(COLUMNS[:2])})") from None
    except csv.Error as e:
        raise InputError(f"{source}: line 1: not valid CSV ({e})") from None
    for i, h in enumerate(header):
        if h not in COLUMNS:  # named by position: the header is the file's text
            raise InputError(f"{source}: line 1, column {i + 1}: {unknown_key(h, COLUMNS)}")
    if len(set(header)) != len(header):
        raise InputError(f"{source}: a column is named twice in the header")
    for need in ("input_tokens", "output_tokens"):
        if need not in header:
            raise InputError(f"{source}: CSV needs columns input_tokens,output_tokens")
    rows: list[tuple[dict[str, Any], str]] = []
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            if len(rows) >= MAX_TRACE_REQUESTS:
                raise InputError(f"{source}: more than {MAX_TRACE_REQUESTS} requests")
            if len(cells) != len(header):
                raise InputError(
                    f"{source}: line {line}: {len(cells)} cells, header has {len(header)}"
                )
            row: dict[str, Any] = {}
            for h, c in zip(header, cells, strict=True):
                c = c.strip()
                if h == "arrival_s" and not c:
                    continue
                row[h] = _csv_number(c, f"{source}: line {line}: {h}")
            rows.append((row, f"line {line}"))
    except csv.Error as e:
        raise InputError(f"{source}: line {reader.line_num}: not valid CSV ({e})") from None
    return _checked(rows, source)


def _csv_number(cell: str, where: str) -> float | int:
    if len(cell) > 40:
        raise InputError(f"{where}: not a number (over 40 characters)")
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        return float(cell)  # NaN and inf parse here; the schema refuses them
    except ValueError:
        raise InputError(f"{where}: not a number") from None


def trace_rows(doc: Any, source: str) -> list[dict[str, Any]]:
    """The requests of a parsed JSON trace (plain or ShareGPT), checked."""
    if not isinstance(doc, list) or not doc:
        raise InputError(f"{source}: expected a non-empty JSON list of requests")
    if len(doc) > MAX_TRACE_REQUESTS:
        raise InputError(f"{source}: {len(doc)} items, at most {MAX_TRACE_REQUESTS} allowed")
    rows: list[tuple[dict[str, Any], str]] = []
    for i, entry in enumerate(doc):
        if isinstance(entry, dict) and "conversations" in entry:
            rows.extend(_sharegpt_requests(entry["conversations"], source, f"[{i}].conversations"))
        else:
            for n, k in enumerate(entry if isinstance(entry, dict) else ()):
                if k not in ROW.keys:  # named by position: the key is the file's text
                    why = unknown_key(str(k), (*COLUMNS, "conversations"))
                    raise InputError(f"{source}: [{i}]: key {n + 1}: {why}")
            rows.append((entry, f"[{i}]"))
        if len(rows) > MAX_TRACE_REQUESTS:
            raise InputError(f"{source}: more than {MAX_TRACE_REQUESTS} requests")
    return _checked(rows, source)


def _sharegpt_requests(turns: Any, source: str, where: str) -> list[tuple[dict[str, Any], str]]:
    """Each human turn followed by a gpt turn: (input, output) tokens."""
    if not isinstance(turns, list):
        raise InputError(f"{source}: {where}: must be a list of turns, got {shown(turns)}")
    for k, t in enumerate(turns):
        w = f"{source}: {where}[{k}]"
        if not isinstance(t, dict):
            raise InputError(f"{w}: a turn must be a mapping with 'from' and 'value'")
        for key, spec in (("from", SPEAKER), ("value", TURN)):
            if key not in t:
                raise InputError(f"{w}: missing {key!r}")
            try:
                spec.check(t[key])
            except SchemaError as e:
                raise InputError(f"{w}.{key}: {e}") from None
    out = []
    for k, (a, b) in enumerate(zip(turns, turns[1:], strict=False)):
        if a["from"] == "human" and b["from"] == "gpt":
            req = {"input_tokens": tokens_of(a["value"]), "output_tokens": tokens_of(b["value"])}
            out.append((req, f"{where}[{k}]"))
    return out


def _checked(rows: list[tuple[dict[str, Any], str]], source: str) -> list[dict[str, Any]]:
    out = []
    for row, where in rows:
        try:
            out.append(ROW.check(row))
        except SchemaError as e:  # JSON items read [3].arrival_s, CSV rows line 4: arrival_s
            place = (
                f"{where}{'.' if where.startswith('[') else ': '}{e.where}" if e.where else where
            )
            raise InputError(f"{source}: {place}: {e.message}") from None
    timed = sum(1 for r in out if "arrival_s" in r)
    if 0 < timed < len(out):
        first = next(w for (r, w), c in zip(rows, out, strict=True) if "arrival_s" not in c)
        raise InputError(
            f"{source}: {first}: arrival_s missing (give it for every request or none)"
        )
    return out


def workload_of(rows: list[dict[str, Any]], name: str, source: str) -> Workload:
    """The workload of checked ``rows``; InputError (naming ``source``) when there are none."""
    if not rows:
        raise InputError(f"{source}: no requests found")
    inputs = np.array([r["input_tokens"] for r in rows], dtype=np.int64)
    outputs = np.array([r["output_tokens"] for r in rows], dtype=np.int64)
    arrivals = None
    if "arrival_s" in rows[0]:
        arrivals = np.array([r["arrival_s"] for r in rows], dtype=float)
    return Workload(name, inputs, outputs, arrivals)
