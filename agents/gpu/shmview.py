"""What a GPU agent published in shared memory, read as the NCCL tuner plugin reads it, for
``heroserve demo`` to show (docs/emulation.md, "heroserve demo output").

The layout is csrc/include/heroserve/shm.h's (layout version 1): a 64-byte header (magic
``HSRVPOL1``, layout, capacity, seqlock counter, payload length, FNV-1a 64 checksum, newest
table version, writer pid), 32 per-process counter slots, then the JSON payload
``{"tables": [...]}`` at the header's size rounded up to 64 bytes. The segment is treated as
the plugin treats it: hostile. Every length is checked against the file, a write in progress
(odd seqlock) or a changed counter is read again, and a payload that fails its checksum or
does not parse is reported, never trusted.

Holds the layout (``MAGIC``, ``LAYOUT_VERSION``, ``MAX_PROCS``, ``MAX_POLICIES``,
``DATA_OFFSET``, ``MAX_CAPACITY``, ``MAX_PAYLOAD``), the header's fields (:class:`SegmentHeader`,
:func:`read_header`), the checked read of a segment (:func:`read_segment`, giving
:class:`Published`) and the demo's one-line description of it (:func:`describe`).
tests/agents/gpu/test_gpu_shmview.py reads what the C++ writer wrote, so the two layouts cannot
drift.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"HSRVPOL1"
LAYOUT_VERSION = 1
MAX_PROCS = 32  # shm.h kMaxProcs: counter slots, one per serving process
MAX_POLICIES = 256  # shm.h kMaxPolicies: {selections, bytes} counters per slot
_HEADER = struct.Struct("<8sII6Q")  # magic, layout, reserved, capacity .. writer_pid
_PROC_SLOT_BYTES = 4 * 8 + MAX_POLICIES * 16  # pid, version, last_seq, reserved, counters
DATA_OFFSET = (_HEADER.size + MAX_PROCS * _PROC_SLOT_BYTES + 63) // 64 * 64
MAX_CAPACITY = 1 << 30  # shm.h kMaxCapacity: a bigger segment is not one of ours
MAX_PAYLOAD = 4 << 20  # shm.h kMaxPayloadBytes: a longer declared payload is refused unread
_TRIES = 5  # reads of a segment being rewritten before giving up on it
_RETRY_S = 0.001  # a publish copies a few KB: far less than this


def fnv1a64(data: bytes) -> int:
    """shm.h's ``Checksum``: FNV-1a 64 of ``data``."""
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True)
class SegmentHeader:
    """The fields of shm.h's ``Header`` before its counter slots (``reserved`` left out)."""

    magic: bytes
    layout: int
    capacity: int  # payload bytes the writer made room for
    seq: int  # seqlock counter: odd while a write is in progress
    length: int  # payload bytes
    checksum: int  # FNV-1a 64 of the payload
    version: int  # newest table version in the payload
    writer_pid: int


def read_header(raw: bytes) -> SegmentHeader:
    """The header at the start of ``raw`` (at least 64 bytes), as it is: nothing checked."""
    magic, layout, _, capacity, seq, length, checksum, version, pid = _HEADER.unpack_from(raw)
    return SegmentHeader(magic, layout, capacity, seq, length, checksum, version, pid)


@dataclass(frozen=True)
class Published:
    """One segment: the newest table version and the tables, or why it could not be read."""

    version: int
    tables: list[dict[str, Any]]
    error: str = ""


def read_segment(path: Path) -> Published:
    """The tables in ``path`` (an error string instead when the segment is not a good one)."""
    try:
        raw = path.read_bytes()[: DATA_OFFSET + MAX_CAPACITY]
    except OSError as exc:
        return Published(0, [], f"unreadable ({exc.strerror})")
    for _ in range(_TRIES):
        got = _parse(raw)
        if got is not None:
            return got
        time.sleep(_RETRY_S)
        raw = path.read_bytes()[: DATA_OFFSET + MAX_CAPACITY]
    return Published(0, [], "being rewritten (odd seqlock) on every read")


def _parse(raw: bytes) -> Published | None:
    """None while a write is in progress (odd seqlock)."""
    if len(raw) < DATA_OFFSET:
        return Published(0, [], f"{len(raw)} bytes, shorter than its header")
    h = read_header(raw)
    if h.magic != MAGIC or h.layout != LAYOUT_VERSION:
        return Published(0, [], f"not a policy segment (magic {h.magic!r}, layout {h.layout})")
    if h.seq % 2:
        return None
    if h.length > MAX_PAYLOAD:
        return Published(0, [], f"payload length {h.length} above the limit of {MAX_PAYLOAD}")
    if h.length > min(h.capacity, len(raw) - DATA_OFFSET):
        return Published(0, [], f"payload length {h.length} outside the segment")
    payload = raw[DATA_OFFSET : DATA_OFFSET + h.length]
    if fnv1a64(payload) != h.checksum:
        return Published(0, [], "payload fails its checksum")
    try:
        doc = json.loads(payload)
        tables = doc["tables"]
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise TypeError("tables is not a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        return Published(0, [], f"payload is not a table list ({exc})")
    return Published(h.version, tables)


def describe_policy(p: dict[str, Any]) -> str:
    """``ina s1``, ``hier s2:0,s2:1`` (rail switch:shard), ``ring``."""
    scheme = str(p.get("scheme", "?"))
    if scheme == "ina":
        return f"ina {p.get('switch', '?')}"
    if scheme == "hier":
        rails = p.get("rails") if isinstance(p.get("rails"), list) else []
        return "hier " + ",".join(
            f"{r.get('switch', '?')}:{r.get('shard', '?')}" for r in rails if isinstance(r, dict)
        )
    return scheme


def describe(published: Published) -> str:
    """One line for the demo: the newest table's group, version and policies."""
    if published.error:
        return published.error
    if not published.tables:
        return f"version {published.version}, no table"
    t = published.tables[-1]
    policies = t.get("policies") if isinstance(t.get("policies"), list) else []
    names = "; ".join(describe_policy(p) for p in policies if isinstance(p, dict))
    return f"group {t.get('group_id', '?')} version {t.get('version', '?')}: {names}"
