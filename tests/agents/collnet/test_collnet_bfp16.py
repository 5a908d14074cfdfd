"""The CollNet plugin with ``"lane_format": "bfp16"`` (docs/dataplane.md "Lane formats")
through both switches: 4 ranks (collnet_harness) in 4 network namespaces, the switch the
executable model (``python -m agents.softswitch``) or BMv2 running p4c's build of
p4/heroserve_ina.p4, programmed over P4Runtime. For float32 and float16, every rank's sum
equals bit for bit the harness's own bfp16 reference (the exact sum of the quantized
values at each block's agreed exponent, collnet_harness.cc ``Bfp16Reference``), every
element is within the format's documented bound, and the switch's counters show each
contribution counted once: one round per proposal row and per block, none saturated.

Needs root and, for BMv2, the P4 toolchain on PATH (tests/support/bmv2.py); skipped with
the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from support import CSRC_BUILD, p4rt  # noqa: E402
from support.bmv2 import bmv2_missing, compile_v1model, start_on_ports  # noqa: E402
from support.netns import (  # noqa: E402
    SWITCH_IP,
    N,
    NetnsBed,
    collect_ranks,
    netns_unavailable,
    start_collnet_rank,
)

from agents.ina.packet import BFP16_LANES  # noqa: E402

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

BUILD = CSRC_BUILD
LIB = BUILD / "libnccl-net-heroserve.so"
HARNESS = BUILD / "collnet_harness"
GROUP, WINDOW = 9, 8
TYPES = {"float32": 4, "float16": 2}
# 1 element (one block, one proposal row), 2 KiB of float32 (8 blocks: a window of
# proposals) and 8 KiB (32 blocks: proposals for the next blocks ride on the data).
SIZES = [4, 2048, 8192]


def rounds() -> int:
    """Aggregation rounds of the run: the join (32 one-hot floats in the group's bfp16
    lanes: a proposal row and one block), then per (type, size) min(window, B) proposal
    rows and B blocks of BFP16_LANES elements (one iallreduce each: every size is below the
    harness's 128 KiB slice)."""
    total = 2
    for esz in TYPES.values():
        for b in SIZES:
            blocks = -(-(b // esz) // BFP16_LANES)
            total += min(WINDOW, blocks) + blocks
    return total


@pytest.fixture
def testbed():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    if not (LIB.exists() and HARNESS.exists()):
        pytest.skip(f"{LIB.name} / collnet_harness not built in {BUILD}")
    with NetnsBed() as bed:
        yield bed


def run_ranks(bed: NetnsBed, tmp_path: Path, bound_s: float) -> list[tuple[int, list[dict], str]]:
    d = tmp_path / "handles"
    d.mkdir()
    group = {"group_id": GROUP, "window": WINDOW, "switch_ip": SWITCH_IP, "session": 78,
             "first_generation": 3, "give_up_s": 20, "initial_rto_s": 0.2, "min_rto_s": 0.05,
             "max_rto_s": 2, "float_sums": True, "lane_format": "bfp16"}  # fmt: skip
    args = ["--types", ",".join(TYPES), "--sizes", ",".join(map(str, SIZES)), "--lanes", "bfp16"]
    procs = [
        start_collnet_rank(bed, w, str(HARNESS), str(LIB), str(d), group, args, p4rt.CHILD_ENV)
        for w in range(N)
    ]
    return collect_ranks(procs, bound_s)


def check(outs: list[tuple[int, list[dict], str]], counters: dict, switch: str) -> None:
    for rc, _events, err in outs:
        assert rc == 0, err[-3000:]
    results = [x for _, ev, _ in outs for x in ev if x.get("event") == "result"]
    assert len(results) == N * len(TYPES) * len(SIZES)
    assert all(x["lanes"] == "bfp16" for x in results)
    assert all(x["exact"] for x in results), [x for x in results if not x["exact"]]
    assert all(x["bound_ok"] for x in results), [x for x in results if not x["bound_ok"]]
    print(f"\nCollNet bfp16 through {switch}, {N} ranks in namespaces")
    print(f"{'type':>8} {'bytes':>6}  {'max err':>9} {'bound':>9} {'rms err':>9} {'fp rms':>9}")
    for t in TYPES:
        for b in SIZES:
            r = next(x for x in results if (x["type"], x["bytes"]) == (t, b))
            print(f"{t:>8} {b:>6}  {r['max_err']:9.3g} {r['bound']:9.3g} {r['rms_err']:9.3g} "
                  f"{r['best_rms_err']:9.3g}")  # fmt: skip
    added, completed = counters["ina_events"][0], counters["ina_events"][1]
    assert completed == rounds()
    assert added == (N - 1) * rounds()  # every contribution counted exactly once
    assert counters["lane_overflows"] == [0]  # honest members never saturate a lane
    assert counters["ina_drops"][10] == 0  # no packet of another format on an open round


def test_collnet_bfp16_through_the_softswitch(testbed: NetnsBed, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
    for i, p in enumerate(testbed.ports):
        cmd += ["-i", f"{i + 1}@{p}"]
    sw = subprocess.Popen(
        cmd, env=p4rt.CHILD_ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert sw.stdout is not None
        line = sw.stdout.readline()
        assert line.startswith("P4RUNTIME_PORT="), sw.stderr.read() if sw.stderr else ""
        port = int(line.split("=")[1])
        setup = p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP)
        assert p4rt.run_child("program", port, setup)["ok"]
        outs = run_ranks(testbed, tmp_path, 300)
        counters = p4rt.run_child("counters", port)
    finally:
        sw.terminate()
        sw.wait(timeout=60)
    check(outs, counters, "the softswitch")


def test_collnet_bfp16_through_bmv2(testbed: NetnsBed, tmp_path: Path) -> None:
    reason = bmv2_missing()
    if reason:
        pytest.skip(reason)
    bmv2_json, _ = compile_v1model(tmp_path / "p4c")
    ns = f"hsw{os.getpid() % 100000}bf"
    sw = start_on_ports(testbed.ports, ns)
    try:
        setup = p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP)
        assert p4rt.run_child("program", 9559, setup, ns=ns, bmv2_json=str(bmv2_json))["ok"]
        outs = run_ranks(testbed, tmp_path, 600)
        counters = p4rt.run_child("counters", 9559, ns=ns)
    finally:
        sw.terminate()
        sw.wait(timeout=60)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    check(outs, counters, "BMv2 simple_switch_grpc")
