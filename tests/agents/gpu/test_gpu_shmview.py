"""The Python reader of the GPU agent's shared memory (agents/gpu/shmview.py) against the C++
writer (csrc/include/heroserve/shm.h, csrc/src/shm.cc): the segment is written by the same
``Segment::Create`` and ``Segment::Publish`` the daemon runs (through the policy core's C API,
agents/gpu/policy_core.py) and read back field by field, so a change to either layout fails
here. The reader's answers on hostile segments are tests/controller/emulate/test_emulate_spec.py's.

The first test needs the C++ build (``make cxx``) and is skipped without it; the second only
reads shm.h, so the reader's constants are checked on every machine.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT

from agents.gpu.policy_core import library_path, publish_to_shm
from agents.gpu.shmview import (
    DATA_OFFSET,
    LAYOUT_VERSION,
    MAGIC,
    MAX_CAPACITY,
    MAX_PAYLOAD,
    MAX_POLICIES,
    MAX_PROCS,
    Published,
    SegmentHeader,
    fnv1a64,
    read_header,
    read_segment,
)

SHM_H = ROOT / "csrc" / "include" / "heroserve" / "shm.h"
GROUP = "prefill/2/1"
DEFAULT_CAPACITY = 1 << 20  # shm.h kDefaultCapacity: what hs_shm_publish_json creates
HEADER_BYTES = 64  # shm.h Header up to its counter slots: magic[8], 2 x uint32, 6 x uint64


def table(version: int, apply_from_seq: int, ring_cost: float) -> dict[str, Any]:
    return {
        "group_id": GROUP,
        "version": version,
        "apply_from_seq": apply_from_seq,
        "window_s": 0.001,
        "gamma": 0.5,
        "links": [{"id": "a|s", "capacity": 5e10}, {"id": "a|b", "capacity": 2.5e10}],
        "policies": [
            {"id": 0, "scheme": "hier", "links": ["a|s"], "cost": 0.0,
             "rails": [{"shard": 0, "switch": "s1"}, {"shard": 1, "switch": "s2"}]},
            {"id": 1, "scheme": "ina", "switch": "s1", "links": ["a|s"], "cost": 0.25},
            {"id": 2, "scheme": "ring", "links": ["a|b"], "cost": ring_cost},
        ],
    }  # fmt: skip


@pytest.fixture
def segment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the C++ writer puts ``GROUP``'s segment, under a prefix of this test's own."""
    if not library_path().exists():
        pytest.skip(f"C++ build absent: {library_path()} (make cxx)")
    prefix = f"shmview{os.getpid()}x{time.monotonic_ns() % 1000000}."
    monkeypatch.setenv("HEROSERVE_SHM_PREFIX", prefix)
    path = Path("/dev/shm") / f"heroserve-{prefix}{GROUP.replace('/', '.')}"
    yield path
    path.unlink(missing_ok=True)


def check_segment(path: Path, tables: list[dict[str, Any]], seq: int) -> None:
    """``path`` is a segment the C++ writer published ``tables`` into (the ``seq // 2``-th
    publish into a fresh segment): shmview reads it exactly."""
    raw = path.read_bytes()
    h = read_header(raw)
    payload = raw[DATA_OFFSET : DATA_OFFSET + h.length]
    assert h == SegmentHeader(
        magic=MAGIC,
        layout=LAYOUT_VERSION,
        capacity=DEFAULT_CAPACITY,
        seq=seq,  # even: no write in progress; +2 per publish
        length=h.length,
        checksum=fnv1a64(payload),
        version=max(t["version"] for t in tables),
        writer_pid=os.getpid(),  # the writer ran in this process (ctypes)
    )
    # The payload starts at the reader's DATA_OFFSET and ends at its length: the writer's
    # capacity fills the file after it, and the bytes before it are the header and the
    # counter slots, which no plugin touched.
    assert len(raw) == DATA_OFFSET + h.capacity
    assert 0 < h.length < h.capacity and payload.endswith(b"}")
    assert not any(raw[DATA_OFFSET + h.length :])
    assert not any(raw[HEADER_BYTES:DATA_OFFSET])
    assert json.loads(payload) == {"tables": tables}
    assert read_segment(path) == Published(h.version, tables)


def test_reader_reads_exactly_what_the_cpp_writer_wrote(segment: Path) -> None:
    first = [table(3, 0, 0.5)]
    publish_to_shm(GROUP, first)
    check_segment(segment, first, seq=2)

    # The daemon's next publish reuses the segment: both tables, newest last.
    both = [table(3, 0, 0.5), table(5, 1200, 0.125)]
    publish_to_shm(GROUP, both)
    check_segment(segment, both, seq=4)


def test_reader_constants_are_shm_h_constants() -> None:
    """The layout constants the reader states, as shm.h states them."""
    text = SHM_H.read_text()

    def const(name: str) -> str:
        m = re.search(rf"constexpr \w+ {name} = ([^;]+);", text)
        assert m, f"{name} not in {SHM_H}"
        return m.group(1)

    assert int(const("kLayoutVersion")) == LAYOUT_VERSION
    assert int(const("kMaxProcs")) == MAX_PROCS
    assert int(const("kMaxPolicies")) == MAX_POLICIES
    assert const("kMaxCapacity") == "size_t{1} << 30" and MAX_CAPACITY == 1 << 30
    assert const("kDefaultCapacity") == "1 << 20" and DEFAULT_CAPACITY == 1 << 20
    assert const("kMaxPayloadBytes") == "size_t{4} << 20" and MAX_PAYLOAD == 4 << 20


def test_reader_refuses_a_declared_length_above_the_payload_limit(tmp_path: Path) -> None:
    """A header declaring more than shm.h's kMaxPayloadBytes is refused on the header alone
    (the file holds the bytes, so only the limit can refuse it)."""
    length = MAX_PAYLOAD + 8
    header = struct.pack("<8sII6Q", MAGIC, LAYOUT_VERSION, 0, length, 2, length, 0, 1, 1)
    path = tmp_path / "seg"
    path.write_bytes(header.ljust(DATA_OFFSET, b"\0") + b" " * length)
    got = read_segment(path)
    assert got == Published(0, [], f"payload length {length} above the limit of {MAX_PAYLOAD}")
