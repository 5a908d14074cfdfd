"""The CollNet plugin against BMv2 running p4/heroserve_ina.p4 (compiled here by p4c): 4 ranks
(collnet_harness) in 4 network namespaces whose veths end in BMv2's namespace, the switch
programmed over P4Runtime as the switch agent does. Every sum exact, for every type the plugin
accepts (int32, int8, and float32 for a group that opts in), and the switch's own counters show
each contribution counted once: per aggregation round, 3 packets ``added``, 1 ``completed``.

Needs root and the P4 toolchain on PATH (tests/support/bmv2.py); skipped with the reason
otherwise.
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

pytestmark = [pytest.mark.needs_root]

BUILD = CSRC_BUILD
LIB = BUILD / "libnccl-net-heroserve.so"
HARNESS = BUILD / "collnet_harness"
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
GROUP, WINDOW, VECTOR_LEN = 9, 8, 32


@pytest.fixture
def testbed():
    reason = netns_unavailable() or bmv2_missing()
    if reason:
        pytest.skip(reason)
    if not (LIB.exists() and HARNESS.exists()):
        pytest.skip(f"{LIB.name} / collnet_harness not built in {BUILD}")
    with NetnsBed() as bed:
        yield bed


def test_collnet_exact_through_bmv2(testbed: NetnsBed, tmp_path: Path) -> None:
    bmv2_json, _ = compile_v1model(tmp_path / "p4c")
    ns = f"hsw{os.getpid() % 100000}bm"
    sw = start_on_ports(testbed.ports, ns)
    try:
        setup = p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP)
        assert p4rt.run_child("program", 9559, setup, ns=ns, bmv2_json=str(bmv2_json))["ok"]
        types = {"int32": 4, "int8": 1, "float32": 4}
        sizes = [4, 4096, 32768]
        d = tmp_path / "handles"
        d.mkdir()
        group = {"group_id": GROUP, "window": WINDOW, "switch_ip": SWITCH_IP, "session": 77,
                 "first_generation": 5, "give_up_s": 20, "initial_rto_s": 0.2,
                 "min_rto_s": 0.05, "max_rto_s": 2, "float_sums": True}  # fmt: skip
        args = ["--types", ",".join(types), "--sizes", ",".join(map(str, sizes))]
        procs = [
            start_collnet_rank(testbed, w, str(HARNESS), str(LIB), str(d), group, args, ENV)
            for w in range(N)
        ]
        outs = collect_ranks(procs, 600)
        counters = p4rt.run_child("counters", 9559, ns=ns)
    finally:
        sw.terminate()
        sw.wait(timeout=60)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    for rc, _events, err in outs:
        assert rc == 0, err[-3000:]
    results = [x for _, ev, _ in outs for x in ev if x.get("event") == "result"]
    assert len(results) == N * len(types) * len(sizes)
    assert all(x["exact"] for x in results), [x for x in results if not x["exact"]]
    print(f"\nCollNet v12 through BMv2 simple_switch_grpc, {N} ranks in namespaces")
    for t in types:
        for b in sizes:
            same = [x for x in results if (x["type"], x["bytes"]) == (t, b)]
            print(f"{t:>8} {b:>6} B  exact  {max(x['seconds'] for x in same):.3f} s")
    # Rounds: the join (one vector), then per (type, size) the data vectors, and for floats
    # the exponent agreement (96 lanes: 3 vectors) first.
    rounds = 1
    for t, esz in types.items():
        for b in sizes:
            rounds += -(-(b // esz) // VECTOR_LEN) + (3 if t == "float32" else 0)
    added, completed = counters["ina_events"][0], counters["ina_events"][1]
    assert completed == rounds
    assert added == (N - 1) * rounds  # every contribution counted exactly once, in BMv2
