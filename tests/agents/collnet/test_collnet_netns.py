"""The CollNet plugin through real interfaces: 4 ranks (collnet_harness) in 4 network
namespaces joined by veth pairs to the switch model running as its own process
(``python -m agents.softswitch`` on the veth ends, programmed over P4Runtime by
tests/support/p4rt.py), with netem loss (1%) and reordering
on every veth in both directions. Every sum must still be exact, and the switch's counters
must show each contribution counted once: per aggregation round, 3 packets ``added`` and 1
``completed``, however many retransmissions the loss caused.

Needs root (network namespaces, tc); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from support import CSRC_BUILD, p4rt  # noqa: E402
from support.netns import (  # noqa: E402
    SWITCH_IP,
    N,
    NetnsBed,
    collect_ranks,
    netns_unavailable,
    run_checked,
    start_collnet_rank,
)

pytestmark = [pytest.mark.needs_root]

BUILD = CSRC_BUILD
LIB = BUILD / "libnccl-net-heroserve.so"
HARNESS = BUILD / "collnet_harness"
ENV = p4rt.CHILD_ENV
GROUP, WINDOW = 9, 8
NETEM = ["loss", "1%", "delay", "1ms", "reorder", "25%", "50%"]
VECTOR_LEN = 32


def netem_unavailable() -> str | None:
    """Why `tc ... netem` cannot run here (a kernel without sch_netem), or None."""
    a, b = f"hsnq{os.getpid() % 100000}", f"hsnr{os.getpid() % 100000}"
    try:
        run_checked("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    except subprocess.CalledProcessError as e:
        return f"cannot create a veth pair: {e.stderr!r}"
    try:
        p = subprocess.run(
            ["tc", "qdisc", "add", "dev", a, "root", "netem", *NETEM],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if p.returncode != 0:
            return f"`tc qdisc add ... netem` fails here ({p.stderr.strip()}): no sch_netem"
        return None
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True, timeout=30)


@pytest.fixture
def testbed():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    if shutil.which("tc") is None:
        pytest.skip("`tc` not found (Debian package iproute2)")
    if not (LIB.exists() and HARNESS.exists()):
        pytest.skip(f"{LIB.name} / collnet_harness not built in {BUILD}")
    with NetnsBed() as bed:
        yield bed


def chunks(count: int) -> int:
    return (count + VECTOR_LEN - 1) // VECTOR_LEN


@pytest.mark.parametrize("netem", [True, False], ids=["netem", "clean"])
def test_collnet_exact_through_namespaces(testbed: NetnsBed, tmp_path: Path, netem: bool) -> None:
    """With netem (the issue's case) when the kernel has it; without, the same run over the
    bare veths (exact, counted once), so the namespace path is covered either way."""
    if netem and (why := netem_unavailable()):
        pytest.skip(why)
    cmd = [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
    for i, p in enumerate(testbed.ports):
        cmd += ["-i", f"{i + 1}@{p}"]
    sw = subprocess.Popen(
        cmd, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert sw.stdout is not None
        line = sw.stdout.readline()
        assert line.startswith("P4RUNTIME_PORT="), sw.stderr.read() if sw.stderr else ""
        port = line.split("=")[1].strip()
        setup = p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP)
        assert p4rt.run_child("program", int(port), setup)["ok"]
        for w in range(N) if netem else []:  # loss and reordering both ways
            run_checked("tc", "qdisc", "add", "dev", testbed.ports[w], "root", "netem", *NETEM)
            run_checked(
                "ip",
                "netns",
                "exec",
                testbed.ns[w],
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "netem",
                *NETEM,
            )
        types = {"int32": 4, "int8": 1, "float32": 4}
        sizes = [4, 4096, 32768]
        procs = []
        d = tmp_path / "handles"
        d.mkdir()
        group = {"group_id": GROUP, "window": WINDOW, "switch_ip": SWITCH_IP, "session": 77,
                 "first_generation": 5, "give_up_s": 10, "initial_rto_s": 0.05,
                 "min_rto_s": 0.02, "max_rto_s": 0.5, "float_sums": True}  # fmt: skip
        args = ["--types", ",".join(types), "--sizes", ",".join(map(str, sizes))]
        for w in range(N):
            procs.append(
                start_collnet_rank(testbed, w, str(HARNESS), str(LIB), str(d), group, args, ENV)
            )
        outs = collect_ranks(procs, 180)
        counters = p4rt.run_child("counters", int(port))
    finally:
        sw.terminate()
        sw.wait(timeout=60)
    how = f"netem {' '.join(NETEM)} on every veth, both ways" if netem else "no netem"
    print(f"\nCollNet v12 through {N} namespaces, {how}")
    print(f"{'type':>8} {'bytes':>6} {'exact':>6} {'seconds':>8}")
    for rc, _events, err in outs:
        assert rc == 0, err[-3000:]
    for e in [x for x in outs[0][1] if x.get("event") == "result"]:
        same = [
            x
            for _, ev, _ in outs
            for x in ev
            if x.get("event") == "result" and (x["type"], x["bytes"]) == (e["type"], e["bytes"])
        ]
        assert all(x["exact"] for x in same), same
        print(f"{e['type']:>8} {e['bytes']:>6} {True!s:>6} {max(x['seconds'] for x in same):>8.3f}")
    stats = [next(x for x in ev if x.get("event") == "stats") for _, ev, _ in outs]
    print("retransmissions per rank:", [s["retransmissions"] for s in stats])
    print("switch events:", counters["ina_events"][:4], "drops:", counters["ina_drops"])
    # Rounds: the join (32 lanes), then per (type, size) the data chunks, and for floats the
    # exponent agreement (96 lanes) first.
    rounds = 1
    for t, esz in types.items():
        for b in sizes:
            rounds += chunks(b // esz) + (3 if t == "float32" else 0)
    added, completed = counters["ina_events"][0], counters["ina_events"][1]
    assert completed == rounds
    assert added == (N - 1) * rounds  # every contribution counted exactly once
    if netem:
        assert sum(s["retransmissions"] for s in stats) > 0  # the loss did bite
