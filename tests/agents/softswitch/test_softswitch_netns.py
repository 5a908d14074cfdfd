"""Real packets through the model: 4 worker network namespaces joined to the switch by
veth pairs send INA contributions with scapy, and every worker's own UDP socket receives
the exact sum. Also: a lost result recovered by retransmission, a malformed packet
dropped and counted, counters read over P4Runtime. Then, when ``p4c-bm2-ss`` and
``simple_switch_grpc`` are both on PATH (tests/support/bmv2.py), the same scenario against BMv2
running the compiled P4 program, in a namespace of its own.

Needs root (network namespaces, AF_PACKET); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import p4rt
from support.bmv2 import bmv2_missing, compile_v1model
from support.netns import (
    SWITCH_IP,
    SWITCH_MAC,
    N,
    NetnsBed,
    netns_unavailable,
    run_checked,
    worker_ip,
    worker_mac,
)

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

# Three folders below the root; not `from support import ROOT`: this file also runs as a script
ROOT = Path(__file__).resolve().parents[3]
# The children run this file as a script: its imports of support.* need tests/ on the path.
ENV = dict(
    os.environ,
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
    PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
)
GROUP, AGG, SLOT, MCAST = 3, 0, 11, 1


def worker_values(w: int) -> list[int]:
    return [(w + 1) * 1000 * (-1) ** i + i for i in range(32)]


@pytest.fixture
def testbed():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with NetnsBed() as bed:
        yield bed


def _child(*args: str, ns: str | None = None, stdin=None) -> subprocess.Popen:
    cmd = [sys.executable, __file__, *args]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(
        cmd,
        env=ENV,
        cwd=ROOT,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _json(proc: subprocess.Popen, timeout: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def run_scenario(bed: NetnsBed, p4rt_port: int, switch_ns: str | None = None) -> dict:
    """Program the switch, run the workers, read the counters; what was observed.
    ``switch_ns``: the namespace the switch's P4Runtime server listens in."""
    prog = _child("program", str(p4rt_port), ns=switch_ns)
    assert _json(prog)["ok"]
    workers = [_child("worker", str(w), ns=bed.ns[w], stdin=subprocess.PIPE) for w in range(N)]
    for p in workers:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY", p.stderr.read() if p.stderr else ""
    for p in workers:
        assert p.stdin is not None
        p.stdin.write("GO\n")
        p.stdin.flush()
    results = [_json(p) for p in workers]
    counters = _json(_child("counters", str(p4rt_port), ns=switch_ns))
    return {"workers": results, "counters": counters}


def check(observed: dict) -> None:
    expected = [sum(worker_values(w)[i] for w in range(N)) for i in range(32)]
    for w, r in enumerate(observed["workers"]):
        assert r["result"] == expected, f"worker {w}"
        assert r["from_switch_header"] == [GROUP, AGG, True]
    # Worker 0 asked again (retransmission after completion) and got the same sum.
    assert observed["workers"][0]["retx_result"] == expected
    c = observed["counters"]
    assert c["ina_drops"][1] == 1  # worker 0's malformed packet (worker id 9 of 4)
    assert sum(c["ina_drops"]) == 1
    assert c["ina_events"][:3] == [N - 1, 1, 1]  # added, completed, retx answered
    # port 1: contribution, malformed, retransmission (each a 186-byte frame)
    assert c["port_rx_1"] == [3, 3 * 186]
    # port 1 sent the multicast result and the unicast answer.
    assert c["port_tx_1"] == [2, 2 * 186]


def test_model_aggregates_real_packets(testbed: NetnsBed) -> None:
    cmd = [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
    for i, p in enumerate(testbed.ports):
        cmd += ["-i", f"{i + 1}@{p}"]
    sw = subprocess.Popen(
        cmd,
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sw.stdout is not None
        line = sw.stdout.readline()
        assert line.startswith("P4RUNTIME_PORT="), sw.stderr.read() if sw.stderr else ""
        observed = run_scenario(testbed, int(line.split("=")[1]))
    finally:
        sw.terminate()
        sw.wait(timeout=60)  # the exit is the condition; 60 s, a hang
    check(observed)


@pytest.mark.skipif(bmv2_missing() is not None, reason=str(bmv2_missing()))
def test_bmv2_aggregates_real_packets(testbed: NetnsBed, tmp_path: Path) -> None:
    out_json, _ = compile_v1model(tmp_path)
    # simple_switch_grpc opens a Thrift port on every address: it runs in a namespace of
    # its own, holding the switch ends of the workers' veth pairs.
    ns = f"hsw{os.getpid() % 100000}sw"
    run_checked("ip", "netns", "add", ns)
    sw = None
    try:
        run_checked("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        cmd = ["ip", "netns", "exec", ns, "simple_switch_grpc", "--device-id", "1", "--no-p4"]
        for i, p in enumerate(testbed.ports):
            run_checked("ip", "link", "set", p, "netns", ns)
            # A port moved into a namespace takes its IPv6 defaults: off again, or its
            # neighbour discovery frames reach BMv2 and the port counters.
            run_checked(
                "ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{p}.disable_ipv6=1"
            )
            run_checked("ip", "netns", "exec", ns, "ip", "link", "set", p, "up")
            cmd += ["-i", f"{i + 1}@{p}"]
        cmd += ["--", "--grpc-server-addr", "127.0.0.1:9559"]
        sw = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ENV["HEROSERVE_BMV2_JSON"] = str(out_json)
        observed = run_scenario(testbed, 9559, switch_ns=ns)
    finally:
        ENV.pop("HEROSERVE_BMV2_JSON", None)
        if sw is not None:
            sw.terminate()
            sw.wait(timeout=60)  # the exit is the condition; 60 s, a hang
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    check(observed)


# ---------------------------------------------------------------------------------------
# Child processes.


def _program(port: int) -> dict:
    sh = p4rt.connect(port, os.environ.get("HEROSERVE_BMV2_JSON") or "/dev/null")
    p4rt.program(sh, p4rt.ina_setup(GROUP, {AGG: SLOT}, MCAST))
    sh.teardown()
    return {"ok": True}


def _counters(port: int) -> dict:
    sh = p4rt.connect(port, None)

    def cells(name: str) -> dict[int, tuple[int, int]]:
        return {
            c.index: (c.data.packet_count, c.data.byte_count) for c in sh.CounterEntry(name).read()
        }

    drops = cells("InaIngress.ina_drops")
    events = cells("InaIngress.ina_events")
    res = {
        "ina_drops": [drops[i][0] for i in range(16)],
        "ina_events": [events[i][0] for i in range(8)],
        "port_rx_1": list(cells("InaIngress.port_rx")[1]),
        "port_tx_1": list(cells("InaEgress.port_tx")[1]),
    }
    sh.teardown()
    return res


def _worker(w: int) -> dict:
    import socket

    from scapy.all import conf, sendp
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from agents.ina.packet import INA_UDP_PORT, unpack
    from agents.ina.scapy_layer import INA

    conf.verb = 0
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("0.0.0.0", INA_UDP_PORT))
    rx.settimeout(10)
    print("READY", flush=True)
    sys.stdin.readline()

    def frame(worker_id: int, retx: bool = False):
        return (
            Ether(src=worker_mac(w), dst=SWITCH_MAC)
            / IP(src=worker_ip(w), dst=SWITCH_IP)
            / UDP(sport=40000 + w, dport=INA_UDP_PORT)
            / INA(
                group_id=GROUP,
                agg_index=AGG,
                worker_id=worker_id,
                num_workers=N,
                is_retx=int(retx),
                values=worker_values(w),
            )
        )

    if w == 0:
        sendp(frame(9), iface="eth0")  # malformed: worker id 9 of 4
    sendp(frame(w), iface="eth0")
    data, _ = rx.recvfrom(2048)
    msg = unpack(data)
    res: dict = {
        "result": list(msg.values),
        "from_switch_header": [msg.header.group_id, msg.header.agg_index, msg.header.is_result],
    }
    if w == 0:
        # Pretend the result was lost: the retransmission is answered, not added.
        time.sleep(1.0)  # let the other workers read their copies first
        sendp(frame(w, retx=True), iface="eth0")
        data, _ = rx.recvfrom(2048)
        res["retx_result"] = list(unpack(data).values)
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    kind, arg = sys.argv[1], int(sys.argv[2])
    fn = {"program": _program, "counters": _counters, "worker": _worker}[kind]
    print(json.dumps(fn(arg)), flush=True)
