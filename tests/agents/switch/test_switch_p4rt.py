"""The switch agent's P4Runtime side (agents/switch/p4rt.py, tables.py): pipelines compared
by what the data plane runs, so an agent holding the checked-in P4Info and a switch
holding p4c's own (annotations such as ``@noWarn("unused")``, a ``type_info``) keep the
switch's entries; multicast replicas read through P4Runtime 1.4's ``port``
and the older ``egress_port``.

The p4runtime stubs need the pure-Python protobuf runtime, chosen before protobuf is
imported, so the checks run in a child process (this file as a script) that prints one
JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Three folders below the root; not `from support import ROOT`: this file also runs as a script
ROOT = Path(__file__).resolve().parents[3]
P4INFO = ROOT / "p4" / "heroserve_ina.p4info.txtpb"
ENV = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python", PYTHONPATH=str(ROOT))


@pytest.fixture(scope="module")
def observed() -> dict:
    proc = subprocess.run(
        [sys.executable, __file__],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cosmetic_differences_are_the_same_pipeline(observed: dict) -> None:
    assert observed["p4c_style_copy"] is True  # annotations, type_info, docs, order
    assert observed["empty_our_config_matches_any"] is True
    assert observed["same_config"] is True


def test_what_the_data_plane_runs_is_compared(observed: dict) -> None:
    assert observed["table_size"] is False
    assert observed["param_width"] is False
    assert observed["counter_size"] is False
    assert observed["action_id"] is False
    assert observed["arch"] is False
    assert observed["other_config"] is False


def test_agent_keeps_a_switch_running_p4cs_p4info(observed: dict) -> None:
    """Connecting with the checked-in P4Info to a switch set up with a p4c-style copy
    installs nothing, and the switch's entries survive."""
    assert observed["connect_same"] == {"installed": False, "entries": 1}
    assert observed["connect_changed"] == {"installed": True, "entries": 0}


def test_replica_ports_through_both_fields(observed: dict) -> None:
    assert observed["replica_port"] == [3, 258, 7]


def test_worker_port_entries_bind_each_member_with_a_known_port(observed: dict) -> None:
    # Group 7: workers 0 and 2 behind ports 5 and 9; worker 1's port is unknown.
    assert observed["worker_port_desired"] == [
        [[7, 0], "set_worker_port", [5]],
        [[7, 2], "set_worker_port", [9]],
    ]


@pytest.mark.slow
@pytest.mark.needs_root
def test_reinstall_on_bmv2_leaves_one_replica_per_port(tmp_path: Path) -> None:
    """An agent that replaces BMv2's pipeline (another device config) and re-inserts its
    multicast group gets the group once: BMv2 keeps groups in its replication engine
    across a push unless they are deleted first (observed with its own CLI, mc_dump)."""
    from support.bmv2 import Bmv2Netns, bmv2_missing, compile_v1model

    reason = bmv2_missing()
    if reason:
        pytest.skip(reason)
    if shutil.which("simple_switch_CLI") is None:
        pytest.skip("simple_switch_CLI not on PATH (the P4 toolchain; see docs/dataplane.md)")
    out_json, _ = compile_v1model(tmp_path)
    with Bmv2Netns(3) as sw:
        proc = subprocess.run(
            ["ip", "netns", "exec", sw.ns, sys.executable, __file__, "bmv2", str(out_json)],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["installed"] == [True, True]
    assert res["groups"] == {"1": [1, 2]}
    assert res["copies"] == {"1": 1, "2": 1}  # twice each without the delete


# ---------------------------------------------------------------------------------------
# Child process.


def _bmv2_child(bmv2_json: str) -> dict:
    """Inside the switch's namespace: two agents install different device configs in
    turn, each inserting multicast group 1 on ports 1 and 2; then BMv2's own view."""
    import time

    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    from agents.switch.p4rt import SwitchConnection, SwitchError
    from agents.switch.tables import MulticastGroups

    info = p4info_pb2.P4Info()
    text_format.Parse(P4INFO.read_text(), info)
    config = Path(bmv2_json).read_bytes()
    installed = []
    groups: dict = {}
    for device_config in (config, config + b"\n"):  # a rebuilt program: another config
        conn = SwitchConnection("127.0.0.1:9559", 1, info, device_config, election_id=(0, 1))
        deadline = time.monotonic() + 30
        while True:  # the switch's gRPC server comes up a moment after the process
            try:
                conn.connect()
                break
            except SwitchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        installed.append(conn.installed_pipeline)
        MulticastGroups(conn).reconcile({1: (1, 2)}, "add")
        groups = {str(k): list(v) for k, v in MulticastGroups(conn).read().items()}
        conn.close()
    copies = _copies_of_a_result(info, config + b"\n")
    return {"installed": installed, "groups": groups, "copies": copies}


def _copies_of_a_result(info, device_config: bytes) -> dict[str, int]:  # noqa: ANN001
    """A one-worker group completes on its first packet (from port 1): how many copies of
    the result ports 1 and 2 receive (multicast group 1)."""
    import socket
    import time

    import p4runtime_sh.shell as sh

    from agents.ina.packet import InaHeader, build_frame
    from agents.switch.p4rt import SwitchConnection

    conn = SwitchConnection("127.0.0.1:9559", 1, info, device_config, election_id=(0, 1))
    conn.connect()
    te = sh.TableEntry("InaIngress.aggregation_table")(action="InaIngress.set_slot")
    te.match["group_id"], te.match["agg_index"] = "7", "0"
    te.action["slot"], te.action["num_workers"], te.action["mcast_grp"] = "0", "1", "1"
    te.insert()
    te = sh.TableEntry("InaIngress.worker_port")(action="InaIngress.set_worker_port")
    te.match["group_id"], te.match["worker_id"] = "7", "0"
    te.action["port"] = "1"
    te.insert()
    socks = {}
    for p in (1, 2):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        s.bind((f"h{p}", 0))
        s.settimeout(0.2)
        socks[p] = s
    socks[1].send(build_frame(InaHeader.at_round(7, 0, 0, 1, 0), list(range(32))))
    copies = {"1": 0, "2": 0}
    end = time.monotonic() + 2
    while time.monotonic() < end:
        for p, s in socks.items():
            try:
                data, addr = s.recvfrom(65536)
            except TimeoutError:
                continue
            if addr[2] != socket.PACKET_OUTGOING:
                copies[str(p)] += 1
    conn.close()
    return copies


def _variants(info):  # noqa: ANN001, ANN202 - p4info_pb2.P4Info, imported lazily
    """(name, modified copy) pairs of the checked-in P4Info."""
    from p4.config.v1 import p4info_pb2

    def copy():
        c = p4info_pb2.P4Info()
        c.CopyFrom(info)
        return c

    p4c = copy()  # what p4c adds or reorders without changing the program
    for a in p4c.actions:
        if a.preamble.name == "NoAction":
            a.preamble.annotations.append('@noWarn("unused")')
    p4c.type_info.SetInParent()
    p4c.tables[0].preamble.doc.brief = "a table"
    p4c.pkg_info.name = "heroserve_ina.p4"
    tables = list(p4c.tables)
    del p4c.tables[:]
    p4c.tables.extend(reversed(tables))
    out = [("p4c_style_copy", p4c)]

    c = copy()
    c.tables[0].size += 1
    out.append(("table_size", c))
    c = copy()
    next(a for a in c.actions if a.params).params[0].bitwidth += 1
    out.append(("param_width", c))
    c = copy()
    c.counters[0].size += 1
    out.append(("counter_size", c))
    c = copy()
    c.actions[-1].preamble.id += 1
    out.append(("action_id", c))
    c = copy()
    c.pkg_info.arch = "tna"
    out.append(("arch", c))
    return out


def _child() -> dict:
    import threading

    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    from p4.v1 import p4runtime_pb2

    from agents.softswitch.pipeline import InaPipeline
    from agents.softswitch.server import SoftSwitchP4Runtime, serve
    from agents.switch.p4rt import SwitchConnection, same_pipeline
    from agents.switch.tables import L2Forward, PortInfo, replica_port

    info = p4info_pb2.P4Info()
    text_format.Parse(P4INFO.read_text(), info)
    res: dict = {}
    variants = _variants(info)
    for name, variant in variants:
        res[name] = same_pipeline(info, b"", variant, b"")
    res["empty_our_config_matches_any"] = same_pipeline(info, b"", info, b"{json}")
    res["same_config"] = same_pipeline(info, b"{json}", info, b"{json}")
    res["other_config"] = same_pipeline(info, b"{json}", info, b"{other}")

    # A switch set up (by someone else) with the p4c-style copy, holding one entry.
    server, port = serve(SoftSwitchP4Runtime(InaPipeline(), device_id=1), "127.0.0.1:0")
    addr = f"127.0.0.1:{port}"
    lock = threading.Lock()

    def connect(p4info) -> dict:  # noqa: ANN001
        with lock:
            conn = SwitchConnection(addr, 1, p4info, b"", election_id=(0, 5))
            conn.connect()
            entries = len(L2Forward(conn).read())
            if conn.installed_pipeline or not entries:
                L2Forward(conn).reconcile(
                    L2Forward.desired({1: PortInfo(1, "h", mac="02:00:00:00:00:01")})
                )
            out = {"installed": conn.installed_pipeline, "entries": entries}
            conn.close()
            return out

    p4c_copy = dict(variants)["p4c_style_copy"]
    connect(p4c_copy)  # installs the p4c-style P4Info and one l2_forward entry
    res["connect_same"] = connect(info)
    changed = dict(variants)["table_size"]
    res["connect_changed"] = connect(changed)
    server.stop(grace=0.5).wait()

    replicas = [
        p4runtime_pb2.Replica(port=b"\x03"),
        p4runtime_pb2.Replica(port=b"\x01\x02"),
        p4runtime_pb2.Replica(egress_port=7),
    ]
    res["replica_port"] = [replica_port(r) for r in replicas]

    from agents.proto.heroserve.v1 import control_pb2 as pb
    from agents.switch.tables import WorkerPort

    a = pb.InaAssignment(group_id=7, worker_count=3)
    a.members.add(worker_id=0, port=5, port_known=True)
    a.members.add(worker_id=1, port=0, port_known=False)
    a.members.add(worker_id=2, port=9, port_known=True)
    res["worker_port_desired"] = sorted(
        [list(k), v[0], list(v[1])] for k, v in WorkerPort.desired([a]).items()
    )
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["bmv2"]:
        try:
            print(json.dumps(_bmv2_child(sys.argv[2])), flush=True)
        finally:
            sys.stdout.flush()
            os._exit(0 if sys.exc_info()[0] is None else 1)  # p4runtime-shell's threads
    print(json.dumps(_child()), flush=True)
