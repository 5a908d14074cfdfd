"""The tuner plugin in a serving process whose shared memory goes bad.

agents/gpu/tuner_driver.py loads libnccl-tuner-heroserve.so as NCCL would, in its own
process, with two ranks. The segment is then left as an agent killed mid-publish leaves it
(seqlock odd), truncated under the mapping, and overwritten with garbage. The process never
dies, every collective is decided well inside a generous bound (the plugin's real figure,
microseconds, is printed by benchmarks/bench_policy_core.py), both ranks always agree, and
the stall is counted and logged once in the shared log format. Skipped without `make cxx`.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.gpu_agent import Proc

PLUGIN = ROOT / "build" / "csrc" / "libnccl-tuner-heroserve.so"
CORE = ROOT / "build" / "csrc" / "libheroserve_policy.so"
GROUP = "decode/3/0"
GENEROUS_US = 100_000  # 100 ms: cannot flake on a busy machine, catches any spin
SEQ_OFFSET = 24  # csrc/include/heroserve/shm.h: magic[8], layout, reserved, capacity, seq

pytestmark = pytest.mark.skipif(
    not (PLUGIN.exists() and CORE.exists()), reason="C++ build absent (make cxx)"
)


def table(version: int, apply_from_seq: int) -> dict:
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
            {"id": 1, "scheme": "ring", "links": ["a|b"], "cost": 0.0},
        ],
    }  # fmt: skip


@pytest.fixture
def prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    p = f"pyshm{os.getpid()}x{time.monotonic_ns() % 1000000}."
    monkeypatch.setenv("HEROSERVE_SHM_PREFIX", p)
    monkeypatch.setenv("HEROSERVE_GROUP", GROUP)
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


def segment(prefix: str) -> Path:
    return Path("/dev/shm") / f"heroserve-{prefix}{GROUP.replace('/', '.')}"


def bump_seq(path: Path, by: int) -> None:
    with open(path, "r+b") as f:
        f.seek(SEQ_OFFSET)
        (seq,) = struct.unpack("<Q", f.read(8))
        f.seek(SEQ_OFFSET)
        f.write(struct.pack("<Q", seq + by))


def test_stalled_truncated_and_garbage_segments(prefix: str, tmp_path: Path) -> None:
    from agents.gpu.policy_core import publish_to_shm

    publish_to_shm(GROUP, [table(1, 0)])
    driver = Proc(
        [sys.executable, "-X", "faulthandler", "-m", "agents.gpu.tuner_driver", str(PLUGIN)],
        {**os.environ, "PYTHONPATH": str(ROOT)},
        tmp_path / "driver.log",
        stdin=True,
    )
    try:
        out = driver.ask("run 4 1048576")
        assert out["agree"] and {c[1] for c in out["choices"]} == {1}
        assert {c[3] for c in out["choices"]} <= {2, 1}  # CollNet Direct (hier) or Ring

        bump_seq(segment(prefix), 1)  # the agent died between "seq = odd" and the copy
        out = driver.ask("run 200 1048576")
        assert out["agree"], out
        assert out["max_call_us"] < GENEROUS_US, out
        assert {c[1] for c in out["choices"]} == {1}  # the table in force keeps deciding
        stats = driver.ask("stats")
        assert stats["stalled"] == 200 and stats["selections"] == 204 and stats["fallbacks"] == 0

        # The restarted agent publishes version 2 from collective 210: the stall ends.
        publish_to_shm(GROUP, [table(1, 0), table(2, 210)])
        out = driver.ask("run 10 1048576")
        assert [(c[0], c[1]) for c in out["choices"]] == [
            (s, 1 if s < 210 else 2) for s in range(204, 214)
        ]
        assert driver.ask("stats")["stalled"] == 200

        # Cut under the mapping (payload pages gone), then the writer's counter moves.
        os.truncate(segment(prefix), os.sysconf("SC_PAGESIZE") * 40)
        bump_seq(segment(prefix), 2)
        out = driver.ask("run 5 4096")
        assert out["agree"] and out["max_call_us"] < GENEROUS_US
        stats = driver.ask("stats")
        assert stats["refused"] >= 1 and stats["version"] == 2

        segment(prefix).write_bytes(os.urandom(200_000))
        out = driver.ask("run 5 4096")
        assert out["agree"] and out["max_call_us"] < GENEROUS_US
    finally:
        assert driver.stop() == 0, driver.text()
    log = driver.text()
    stalled = [line for line in log.splitlines() if "held the seqlock" in line]
    assert len(stalled) == 1, log  # logged once, not per collective
    # The plugin's own lines (no NCCL logger here) use the shared log format.
    assert re.match(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING heroserve\.tuner policy segment ",
        stalled[0],
    ), stalled[0]
