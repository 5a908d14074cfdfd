"""End to end on loopback with real processes: controller (with a plan), the executable
switch model (agents.softswitch) and the switch agent. The plan's INA groups must end up
as entries in the switch, read back through P4Runtime; a restarted agent reconciles
(stale entries deleted, missing ones added) (docs/design.md §9, §10)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import ROOT
from support.waiting import HANG_GUARD_S, wait_for

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, save_sample_topology

PY = sys.executable
PORTS = [f"{k + 1}=p0-g{k},mac=02:00:00:00:00:0{k + 1},ip=10.0.0.{k + 1}" for k in range(4)]

# Inserts a stale aggregation entry and multicast group as another primary client.
_TAMPER = """
import os, sys
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
import contextlib
import p4runtime_sh.shell as sh
from p4runtime_sh.global_options import global_options
global_options["verbose"] = False
with contextlib.redirect_stdout(sys.stderr):
    sh.setup(device_id=1, grpc_addr=sys.argv[1], election_id=(0, 9), verbose=False)
te = sh.TableEntry("aggregation_table")(action="set_slot")
te.match["group_id"] = "99"; te.match["agg_index"] = "0"
te.action["slot"] = "500"; te.action["num_workers"] = "2"; te.action["mcast_grp"] = "99"
te.insert()
sh.MulticastGroupEntry(99).add(3, 0).insert()
# A wrong value on a live key: must be modified back.
te = sh.TableEntry("aggregation_table")(action="set_slot")
te.match["group_id"] = "1"; te.match["agg_index"] = "0"
te.action["slot"] = "777"; te.action["num_workers"] = "4"; te.action["mcast_grp"] = "1"
te.modify()
sh.teardown()
"""


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_port = 0

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            [PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, env=env or dict(os.environ)
        )
        self.procs[name] = p
        return p

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name)
        p.send_signal(sig)
        p.wait(10)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for name in list(self.procs):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            self.procs.pop(name)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    yield ps
    ps.stop_all()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float:
    """Value of an unlabelled sample on the controller's /metrics (0 if absent)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def start_controller(procs: Procs, tmp: Path, plan: Path, extra: tuple[str, ...] = ()) -> int:
    port_file = tmp / "cport"
    port_file.unlink(missing_ok=True)
    # The sample plans' topology "sample" is no built-in: the controller needs the file.
    topo = save_sample_topology(tmp / "sample-topology.json", ina_groups=2)
    procs.metrics_port = free_port()
    procs.start(
        "controller",
        [
            "-m",
            "controller.service",
            "--db",
            str(tmp / "c.db"),
            "--plan",
            str(plan),
            "--topology",
            str(topo),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
            "--metrics-port",
            str(procs.metrics_port),
            *extra,
        ],
    )
    wait_for("controller port", port_file.exists)
    return int(port_file.read_text())


def start_softswitch(procs: Procs, port: int = 0) -> int:
    p = procs.start(
        "softswitch",
        ["-m", "agents.softswitch", "--p4runtime", f"127.0.0.1:{port}", "--device-id", "1"],
    )
    assert p.stdout is not None
    line = p.stdout.readline().decode()
    assert line.startswith("P4RUNTIME_PORT="), line + procs.log("softswitch")
    return int(line.split("=")[1])


def start_agent(
    procs: Procs,
    sw_port: int,
    ctl_port: int,
    ports: list[str] = PORTS,
    extra: tuple[str, ...] = (),
) -> None:
    args = [
        "-m",
        "agents.switch",
        "--switch",
        f"127.0.0.1:{sw_port}",
        "--controller",
        f"127.0.0.1:{ctl_port}",
        "--device-id",
        "1",
        "--node-id",
        "s1",
        "--telemetry-interval",
        "0.2",
    ]
    args += list(extra)
    for spec in ports:
        args += ["--port", spec]
    procs.start("agent", args)


def dump(sw_port: int) -> dict:
    out = subprocess.run(
        [PY, "-m", "agents.switch.dump", "--switch", f"127.0.0.1:{sw_port}", "--device-id", "1"],
        cwd=ROOT,
        capture_output=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    return json.loads(out.stdout)


def table_or_none(sw_port: int) -> list | None:
    """The aggregation_table, or None while the switch has no pipeline (just restarted)."""
    try:
        return dump(sw_port)["aggregation_table"]
    except subprocess.CalledProcessError:
        return None


def expected_entries(groups: list[tuple[int, int, int]]) -> list:
    """(group id, slot start, count) with 4 workers, multicast group = group id."""
    return sorted(
        [[gid, i], "set_slot", [start + i, 4, gid]]
        for gid, start, count in groups
        for i in range(count)
    )


def acked(ctl_port: int) -> dict[str, int]:
    with grpc.insecure_channel(f"127.0.0.1:{ctl_port}") as ch:
        st = pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=60)
    return {a.identity.node_id: a.acked_epoch for a in st.agents}


@pytest.mark.slow
def test_plan_reaches_the_switch_and_agent_restart_reconciles(procs: Procs, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    sample_plan(ina_groups=2, workers=4).save(plan)
    ctl = start_controller(procs, tmp_path, plan)
    sw = start_softswitch(procs, free_port())
    start_agent(procs, sw, ctl)

    want = expected_entries([(1, 0, 8), (2, 8, 8)])
    wait_for("entries on the switch", lambda: table_or_none(sw) == want)
    d = dump(sw)
    # Only group 1's workers sit behind s1's ports: one multicast group, to ports 1-4.
    assert d["multicast_groups"] == {"1": [1, 2, 3, 4]}
    assert d["result_rewrite"] == [
        [[k + 1], "set_result_dst", [0x020000000000 + k + 1, 0x0A000000 + k + 1]] for k in range(4)
    ]
    assert sorted(d["l2_forward"]) == [
        [[0x020000000000 + k + 1], "forward", [k + 1]] for k in range(4)
    ]
    wait_for("ack of epoch 1", lambda: acked(ctl).get("s1") == 1)

    # A new plan (group 2 gone, group 1 with 4 slots at 16) while the agent runs.
    p2 = sample_plan(ina_groups=1, workers=4)
    p2.prefill.groups[0].slots.start, p2.prefill.groups[0].slots.count = 16, 4  # type: ignore[union-attr]
    with grpc.insecure_channel(f"127.0.0.1:{ctl}") as ch:
        r = pb_grpc.AdminStub(ch).ApplyPlan(pb.ApplyPlanRequest(plan_json=p2.to_json()))
    assert r.epoch == 2
    # Group 1 already holds 8 slots and now wants 4: re-allocated at the preferred 16.
    want2 = expected_entries([(1, 16, 4)])
    wait_for("the new plan on the switch", lambda: table_or_none(sw) == want2)
    wait_for("ack of epoch 2", lambda: acked(ctl).get("s1") == 2)

    # Kill the agent; tamper with the switch; restart the agent: it reconciles.
    procs.kill("agent")
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    subprocess.run(
        [PY, "-c", _TAMPER, f"127.0.0.1:{sw}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=HANG_GUARD_S,
    )
    d = dump(sw)
    assert [[99, 0], "set_slot", [500, 2, 99]] in d["aggregation_table"]
    assert d["multicast_groups"]["99"] == [3]
    start_agent(procs, sw, ctl)
    wait_for(
        "reconciled entries",
        lambda: (lambda x: x["aggregation_table"] == want2 and "99" not in x["multicast_groups"])(
            dump(sw)
        ),
    )
    assert "already runs our pipeline" in procs.log("agent")
    # Telemetry (port counters polled every 0.2 s) reaches the controller's metrics.
    wait_for(
        "telemetry", lambda: metric(procs.metrics_port, "heroserve_telemetry_reports_total") > 0
    )

    # The switch restarts empty (no pipeline): the agent notices on its next poll,
    # reinstalls the pipeline and the entries of the last plan.
    procs.kill("softswitch")
    assert start_softswitch(procs, sw) == sw
    wait_for("entries after a switch restart", lambda: table_or_none(sw) == want2)
    assert "switch resynchronised" in procs.log("agent")


@pytest.mark.slow
@pytest.mark.needs_root
def test_four_workers_aggregate_through_agent_installed_entries(
    procs: Procs, tmp_path: Path
) -> None:
    """Real packets (network namespaces, as tests/agents/softswitch/test_softswitch_netns.py):
    4 workers send contributions for the group the controller planned; the entries come only
    from the switch agent; every worker's UDP socket receives the exact sum."""
    from support.netns import NetnsBed, netns_unavailable

    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    bed = NetnsBed()
    try:
        bed.up()
        plan = tmp_path / "plan.json"
        sample_plan(ina_groups=1, workers=4, ring_groups=0).save(plan)
        ctl = start_controller(procs, tmp_path, plan)
        args = ["-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0", "--device-id", "1"]
        for i, p in enumerate(bed.ports):
            args += ["-i", f"{i + 1}@{p}"]
        sw_proc = procs.start("softswitch", args)
        assert sw_proc.stdout is not None
        sw = int(sw_proc.stdout.readline().decode().split("=")[1])
        start_agent(procs, sw, ctl, _netns_ports())
        wait_for("ack of epoch 1", lambda: acked(ctl).get("s1") == 1)
        d = dump(sw)
        assert d["aggregation_table"] == expected_entries([(1, 0, 8)])
        env = dict(
            os.environ,
            PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),  # support.waiting
        )
        workers = [
            subprocess.Popen(
                ["ip", "netns", "exec", bed.ns[w], PY, __file__, "worker", str(w), "1", "5"],
                env=env,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in range(4)
        ]
        for p in workers:
            assert p.stdout is not None and p.stdout.readline().strip() == "READY"
        for p in workers:
            assert p.stdin is not None
            p.stdin.write("GO\n")
            p.stdin.flush()
        results = []
        for p in workers:
            out, err = p.communicate(timeout=HANG_GUARD_S)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        bed.down()
    expected = [sum(_values(w)[i] for w in range(4)) for i in range(32)]
    for w, r in enumerate(results):
        assert r["result"] == expected, f"worker {w}"
        assert r["header"] == [1, 5, True]


def _netns_ports() -> list[str]:
    from support.netns import worker_ip, worker_mac

    return [f"{w + 1}=p0-g{w},mac={worker_mac(w)},ip={worker_ip(w)}" for w in range(4)]


def _values(w: int) -> list[int]:
    return [(w + 1) * 7 - i * (w + 2) for i in range(32)]


def _worker(w: int, group: int, agg: int) -> dict:
    """Child in worker namespace ``w``: one contribution, then wait for the sum."""
    import socket as so

    from scapy.all import conf, sendp
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from support.netns import SWITCH_IP, SWITCH_MAC, worker_ip, worker_mac

    from agents.ina.packet import INA_UDP_PORT, unpack
    from agents.ina.scapy_layer import INA

    conf.verb = 0
    rx = so.socket(so.AF_INET, so.SOCK_DGRAM)
    rx.bind(("0.0.0.0", INA_UDP_PORT))
    rx.settimeout(20)
    print("READY", flush=True)
    sys.stdin.readline()
    frame = (
        Ether(src=worker_mac(w), dst=SWITCH_MAC)
        / IP(src=worker_ip(w), dst=SWITCH_IP)
        / UDP(sport=41000 + w, dport=INA_UDP_PORT)
        / INA(group_id=group, agg_index=agg, worker_id=w, num_workers=4, values=_values(w))
    )
    sendp(frame, iface="eth0")
    data, _ = rx.recvfrom(2048)
    msg = unpack(data)
    return {
        "result": list(msg.values),
        "header": [msg.header.group_id, msg.header.agg_index, bool(msg.header.is_result)],
    }


@pytest.mark.slow
def test_switch_agent_over_mutual_tls(procs: Procs, tmp_path: Path) -> None:
    """The agent process speaks mutual TLS to the controller: with a certificate naming
    s1 it is served; with one naming s2 it is refused and nothing reaches the switch."""
    from support.pki import CA

    ca = CA()
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    scert, skey = ca.issue("controller", ips=("127.0.0.1",), server=True).write(tmp_path, "srv")
    plan = tmp_path / "plan.json"
    sample_plan(ina_groups=1, workers=4).save(plan)
    ca_file = str(tmp_path / "ca.crt")
    ctl = start_controller(
        procs, tmp_path, plan, ("--tls-cert", scert, "--tls-key", skey, "--tls-ca", ca_file)
    )
    sw = start_softswitch(procs)
    wrong_c, wrong_k = ca.issue("s2").write(tmp_path, "s2")
    start_agent(
        procs, sw, ctl, extra=("--tls-cert", wrong_c, "--tls-key", wrong_k, "--tls-ca", ca_file)
    )
    wait_for("refusal", lambda: "PERMISSION_DENIED" in procs.log("agent"))
    assert table_or_none(sw) == []
    procs.kill("agent")
    good_c, good_k = ca.issue("s1").write(tmp_path, "s1")
    start_agent(
        procs, sw, ctl, extra=("--tls-cert", good_c, "--tls-key", good_k, "--tls-ca", ca_file)
    )
    wait_for("entries over TLS", lambda: table_or_none(sw) == expected_entries([(1, 0, 8)]))


_DESIRED = """
import json
from agents.switch.main import parse_port
from agents.switch.tables import AggregationTable, L2Forward, MulticastGroups, ResultRewrite
from agents.proto.heroserve.v1 import control_pb2 as pb

a = pb.InaAssignment(group_id=7, switch="s1", slots=pb.SlotRange(start=100, count=3),
                     worker_count=3, multicast_group_id=7)
a.members.add(worker_id=0, gpu="h0", port=5, port_known=True, mac="02:00:00:00:00:0a",
              ipv4="10.0.0.10")
a.members.add(worker_id=1, gpu="h1", port=6, port_known=True)   # address from the port map
a.members.add(worker_id=2, gpu="h2", port_known=False)           # behind no known port
ports = {6: parse_port("6=h1,mac=02:00:00:00:00:0b,ip=10.0.0.11,gbps=25")}
print(json.dumps({
    "agg": sorted([list(k), v[0], list(v[1])] for k, v in AggregationTable.desired([a]).items()),
    "rw": sorted([list(k), v[0], list(v[1])] for k, v in ResultRewrite.desired([a], ports).items()),
    "l2": sorted([list(k), v[0], list(v[1])] for k, v in L2Forward.desired(ports).items()),
    "mc": {str(k): list(v) for k, v in MulticastGroups.desired([a]).items()},
    "cap": ports[6].capacity,
}))
"""


def test_desired_entries_hand_worked() -> None:
    """What the agent's table classes derive from one assignment (run in a subprocess:
    they need the pure-Python protobuf runtime of the agent's process)."""
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    out = subprocess.run(
        [PY, "-c", _DESIRED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    d = json.loads(out.stdout)
    # One entry per aggregator index: slot = start + index; worker count; multicast group.
    assert d["agg"] == [[[7, i], "set_slot", [100 + i, 3, 7]] for i in range(3)]
    assert d["rw"] == [
        [[5], "set_result_dst", [0x02000000000A, 0x0A00000A]],
        [[6], "set_result_dst", [0x02000000000B, 0x0A00000B]],
    ]
    assert d["l2"] == [[[0x02000000000B], "forward", [6]]]
    assert d["mc"] == {"7": [5, 6]}
    assert d["cap"] == 25e9 / 8  # 25 Gb/s in bytes/s


def test_agent_rejects_bad_arguments(tmp_path: Path) -> None:
    env = dict(os.environ)
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)  # reading it would block for ever
    for extra in (
        ["--port", "x"],
        ["--port", "1=h,mac=zz"],
        ["--port", "999=h"],
        ["--device-id", "-1"],
        ["--tls-cert", "a"],
        ["--controller", "127.0.0.1:99999"],  # would dial 34463
        ["--device-config", str(fifo)],
    ):
        args = ["--switch", "127.0.0.1:1", "--controller", "127.0.0.1:2", "--device-id", "1"]
        if extra[0] == "--device-id":
            args = args[:-2]
        r = subprocess.run(
            [PY, "-m", "agents.switch", *args, *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=HANG_GUARD_S,
        )
        assert r.returncode == 2, (extra, r.stderr)
        assert b"Traceback" not in r.stderr


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    if sys.argv[1] == "worker":
        print(json.dumps(_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))), flush=True)
