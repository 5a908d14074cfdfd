"""P4Runtime server of the executable model over real gRPC channels on loopback.

The p4runtime stubs need the pure-Python protobuf runtime, chosen before protobuf is
imported, so each scenario runs in a child process: this file executed as a script with
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python. A scenario prints one JSON object of what
it observed; the tests here check it against hand-worked expectations.

- ``raw``: raw p4.v1 stubs against an in-process server whose pipeline gets frames
  injected directly (so counter reads have something to count, without root).
- ``shell``: p4runtime-shell, as the switch agent drives the switch.
- ``cli``: the ``python -m agents.softswitch`` process, through its printed port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Three folders below the root; not `from support import ROOT`: this file also runs as a script
ROOT = Path(__file__).resolve().parents[3]
P4INFO = ROOT / "p4" / "heroserve_ina.p4info.txtpb"
ENV = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python", PYTHONPATH=str(ROOT))
HANG_S = 60  # how long a wait for a process or a stream message may take before it is a hang


def run_scenario(name: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, name],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=5 * HANG_S,  # a scenario waits on several conditions, each bounded by HANG_S
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def raw() -> dict:
    return run_scenario("raw")


def test_capabilities_and_preconditions(raw: dict) -> None:
    assert raw["api_version"] == "1.4.1"
    assert raw["read_before_config"] == "FAILED_PRECONDITION"
    assert raw["write_without_arbitration"] == "PERMISSION_DENIED"
    assert raw["bad_p4info"] == "INVALID_ARGUMENT"
    assert raw["get_config_same_p4info"] is True


def test_arbitration_elects_highest_election_id(raw: dict) -> None:
    # First client alone: primary. Second with a higher id: it is primary and the first
    # is told so; when the second leaves, the first is primary again.
    assert raw["arb"] == [
        ["c1", "OK", [0, 1]],
        ["c2", "OK", [0, 2]],
        ["c1", "ALREADY_EXISTS", [0, 2]],
        ["c1", "OK", [0, 1]],
    ]
    assert raw["write_as_backup"] == "PERMISSION_DENIED"
    assert raw["duplicate_election_id"] == "INVALID_ARGUMENT"
    assert raw["wrong_device_stream"] == "NOT_FOUND"


def test_write_errors_carry_canonical_codes(raw: dict) -> None:
    assert raw["insert"] == "OK"
    assert raw["insert_again"] == ["UNKNOWN", ["ALREADY_EXISTS"]]
    assert raw["unknown_table"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["unknown_action"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["key_too_wide"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["param_too_wide"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["missing_key"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["modify_missing"] == ["UNKNOWN", ["NOT_FOUND"]]
    assert raw["delete_missing"] == ["UNKNOWN", ["NOT_FOUND"]]
    assert raw["const_default"] == ["UNKNOWN", ["INVALID_ARGUMENT"]]
    assert raw["batch"] == ["UNKNOWN", ["OK", "ALREADY_EXISTS", "OK"]]
    assert raw["wrong_device_write"] == "NOT_FOUND"
    assert raw["read_register"] == "UNIMPLEMENTED"


def test_table_and_multicast_round_trip(raw: dict) -> None:
    # Entries come back exactly as written (canonical bytestrings, sorted here).
    assert raw["agg_entries"] == [
        [[7, 0], "InaIngress.set_slot", {"mcast_grp": 100, "num_workers": 4, "slot": 5}],
        [[7, 1], "InaIngress.set_slot", {"mcast_grp": 100, "num_workers": 4, "slot": 6}],
        [[9, 0], "InaIngress.set_slot", {"mcast_grp": 100, "num_workers": 2, "slot": 1}],
    ]
    assert raw["agg_entry_after_modify"] == {"mcast_grp": 100, "num_workers": 4, "slot": 9}
    assert raw["agg_entries_after_delete"] == 2
    assert raw["l2_default"] == ["InaIngress.forward", {"port": 3}]
    assert raw["worker_entries"] == 4
    assert raw["mcast"] == [[100, [[1, 0], [2, 0], [3, 0], [4, 0]]]]
    assert raw["mcast_forms"] == [
        [100, [["port", "01"], ["port", "0002"], ["egress_port", ""], ["egress_port", ""]]]
    ]
    assert raw["mcast_after_modify"] == [[100, [[1, 0], [2, 1]]]]


def test_counters_see_the_injected_packets(raw: dict) -> None:
    # 4 contributions complete one round; then one of each malformed kind.
    assert raw["result_sum"] == [10 * i for i in range(32)]
    drops = {str(i): 0 for i in range(16)}
    drops.update({"0": 1, "1": 1, "2": 1, "3": 1, "6": 1})  # ... and wrong port
    assert raw["ina_drops"] == drops
    assert raw["ina_events"]["0"] == 3 and raw["ina_events"]["1"] == 1
    # port 1: one contribution (14+20+8+144 = 186 bytes) + 5 malformed frames.
    assert raw["port_rx_1"] == [6, 186 + 185 + 186 + 186 + 186 + 186]
    assert raw["port_tx_2"] == [1, 186]
    assert raw["counter_bad_index"] == "OUT_OF_RANGE"
    assert raw["counter_unknown"] == "INVALID_ARGUMENT"
    assert raw["counter_reset"] == [0, 0]


def test_p4runtime_shell_client() -> None:
    out = run_scenario("shell")
    assert out["entries"] == [[[7, 0], {"slot": 5}]]
    assert out["duplicate"] == ["ALREADY_EXISTS"]
    assert out["mcast"] == [100, [1, 2]]
    assert out["drops_len"] == 16


def test_cli_process_serves_p4runtime() -> None:
    out = run_scenario("cli")
    assert out == {"api_version": "1.4.1", "config": "OK", "entries": 1, "exit": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--p4runtime", "nohost"], "is not HOST:PORT"),
        (["--p4runtime", "127.0.0.1:99999"], "port 99999 is not in 0..65535"),
        (["--p4runtime", "127.0.0.1:0", "--p4info", "/usr/bin/env"], "not UTF-8 text (byte"),
        (["--p4runtime", "127.0.0.1:0", "--p4info", "/dev/zero"], "is not a regular file"),
        (["--p4runtime", "127.0.0.1:0", "-i", "hsnosuch0"], "cannot open interface hsnosuch0"),
        (["--p4runtime", "127.0.0.1:0", "-i", "600@x"], "bad port number"),
        (["--p4runtime", "127.0.0.1:0", "--p4info", "/nonexistent.txtpb"], "--p4info"),
        (["--device-id", "seven"], "invalid int value"),
    ],
)
def test_cli_bad_arguments_exit_2(args: list[str], message: str) -> None:
    # Started without the protobuf variable: main() re-executes itself with it.
    env = {k: v for k, v in ENV.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agents.softswitch import main; sys.exit(main(sys.argv[1:]))",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------
# Scenarios (child processes).


def _code(err) -> str:
    return err.code().name


def _write_result(stub, req):
    import grpc
    from google.rpc import status_pb2
    from p4.v1 import p4runtime_pb2

    try:
        stub.Write(req)
        return "OK"
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNKNOWN:
            return _code(e)
        for key, value in e.trailing_metadata():
            if key == "grpc-status-details-bin":
                st = status_pb2.Status.FromString(value)
                codes = []
                for d in st.details:
                    err = p4runtime_pb2.Error()
                    d.Unpack(err)
                    from google.rpc import code_pb2

                    codes.append(code_pb2.Code.Name(err.canonical_code))
                return ["UNKNOWN", codes]
        return ["UNKNOWN", []]


class _Client:
    """A raw-stub client with its own StreamChannel."""

    def __init__(self, addr: str, election: tuple[int, int], device_id: int = 1) -> None:
        import queue

        import grpc
        from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

        self.pb = p4runtime_pb2
        self.channel = grpc.insecure_channel(addr)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.election = election
        self.device_id = device_id
        self.out: queue.Queue = queue.Queue()
        self.inbox: queue.Queue = queue.Queue()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = election
        self.out.put(req)

        def gen():
            while True:
                m = self.out.get()
                if m is None:
                    return
                yield m

        self.stream = self.stub.StreamChannel(gen())
        import threading

        def recv():
            try:
                for m in self.stream:
                    self.inbox.put(m)
            except grpc.RpcError as e:
                self.inbox.put(_code(e))

        threading.Thread(target=recv, daemon=True).start()

    def arbitration(self):
        m = self.inbox.get(timeout=HANG_S)  # the answer is the condition; the bound, a hang
        if isinstance(m, str):
            return m
        from google.rpc import code_pb2

        a = m.arbitration
        return [code_pb2.Code.Name(a.status.code), [a.election_id.high, a.election_id.low]]

    def write(self, *updates, device_id: int | None = None):
        req = self.pb.WriteRequest(device_id=self.device_id if device_id is None else device_id)
        req.election_id.high, req.election_id.low = self.election
        req.updates.extend(updates)
        return _write_result(self.stub, req)

    def read(self, *entities):
        req = self.pb.ReadRequest(device_id=self.device_id)
        req.entities.extend(entities)
        out = []
        for resp in self.stub.Read(req):
            out.extend(resp.entities)
        return out

    def close(self) -> None:
        self.out.put(None)
        self.channel.close()


def _scenario_raw() -> dict:
    import time

    import grpc
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    from p4.v1 import p4runtime_pb2 as pb

    from agents.ina.packet import VECTOR_LEN, InaHeader, build_frame, unpack
    from agents.softswitch.pipeline import InaPipeline
    from agents.softswitch.server import SoftSwitchP4Runtime, serve

    info = p4info_pb2.P4Info()
    text_format.Parse(P4INFO.read_text(), info)
    ids = {e.preamble.name: e.preamble.id for e in [*info.tables, *info.actions, *info.counters]}
    ids.update({r.preamble.name: r.preamble.id for r in info.registers})
    pipeline = InaPipeline()
    service = SoftSwitchP4Runtime(pipeline, device_id=1)
    server, port = serve(service, "127.0.0.1:0")
    addr = f"127.0.0.1:{port}"
    res: dict = {}

    def b(v: int) -> bytes:
        return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")

    def agg_entry(group, agg, slot=5, workers=4, mcast=100, action="InaIngress.set_slot"):
        te = pb.TableEntry(table_id=ids["InaIngress.aggregation_table"])
        te.match.add(field_id=1).exact.value = b(group)
        te.match.add(field_id=2).exact.value = b(agg)
        a = te.action.action
        a.action_id = ids[action]
        for pid, v in ((1, slot), (2, workers), (3, mcast)):
            a.params.add(param_id=pid, value=b(v))
        return te

    def upd(kind, **entity):
        return pb.Update(type=kind, entity=pb.Entity(**entity))

    INS, M, D = pb.Update.INSERT, pb.Update.MODIFY, pb.Update.DELETE

    with grpc.insecure_channel(addr) as ch:
        from p4.v1 import p4runtime_pb2_grpc

        stub = p4runtime_pb2_grpc.P4RuntimeStub(ch)
        res["api_version"] = stub.Capabilities(pb.CapabilitiesRequest()).p4runtime_api_version
        try:
            list(stub.Read(pb.ReadRequest(device_id=1, entities=[pb.Entity(table_entry={})])))
        except grpc.RpcError as e:
            res["read_before_config"] = _code(e)
        req = pb.WriteRequest(device_id=1)
        req.election_id.low = 1
        res["write_without_arbitration"] = _write_result(stub, req)

    c1 = _Client(addr, (0, 1))
    arb = [["c1", *c1.arbitration()]]
    # SetForwardingPipelineConfig: a P4Info whose widths differ is refused.
    bad = p4info_pb2.P4Info()
    bad.CopyFrom(info)
    bad.tables[0].match_fields[0].bitwidth = 8
    for p4i, key in ((bad, "bad_p4info"), (info, "good_p4info")):
        req = pb.SetForwardingPipelineConfigRequest(
            device_id=1, action=pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
        )
        req.election_id.low = 1
        req.config.p4info.CopyFrom(p4i)
        try:
            c1.stub.SetForwardingPipelineConfig(req)
            res[key] = "OK"
        except grpc.RpcError as e:
            res[key] = _code(e)
    got = c1.stub.GetForwardingPipelineConfig(
        pb.GetForwardingPipelineConfigRequest(
            device_id=1, response_type=pb.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE
        )
    )
    res["get_config_same_p4info"] = got.config.p4info == info

    c2 = _Client(addr, (0, 2))
    arb.append(["c2", *c2.arbitration()])
    arb.append(["c1", *c1.arbitration()])
    res["write_as_backup"] = c1.write(upd(INS, table_entry=agg_entry(1, 1)))
    c3 = _Client(addr, (0, 2))
    res["duplicate_election_id"] = c3.arbitration()
    c4 = _Client(addr, (0, 9), device_id=5)
    res["wrong_device_stream"] = c4.arbitration()
    c2.close()
    arb.append(["c1", *c1.arbitration()])
    res["arb"] = arb
    for c in (c3, c4):
        c.close()

    # Table writes and their errors.
    res["insert"] = c1.write(upd(INS, table_entry=agg_entry(7, 0)))
    res["insert_again"] = c1.write(upd(INS, table_entry=agg_entry(7, 0)))
    te = agg_entry(7, 3)
    te.table_id = 0x02FFFFFF
    res["unknown_table"] = c1.write(upd(INS, table_entry=te))
    te = agg_entry(7, 3)
    te.action.action.action_id = ids["InaIngress.forward"]
    res["unknown_action"] = c1.write(upd(INS, table_entry=te))
    te = agg_entry(7, 3)
    te.match[1].exact.value = b"\x01\x00\x00"
    res["key_too_wide"] = c1.write(upd(INS, table_entry=te))
    res["param_too_wide"] = c1.write(upd(INS, table_entry=agg_entry(7, 3, workers=256)))
    te = agg_entry(7, 3)
    del te.match[1]
    res["missing_key"] = c1.write(upd(INS, table_entry=te))
    res["modify_missing"] = c1.write(upd(M, table_entry=agg_entry(8, 8)))
    res["delete_missing"] = c1.write(upd(D, table_entry=agg_entry(8, 8)))
    te = pb.TableEntry(table_id=ids["InaIngress.aggregation_table"], is_default_action=True)
    te.action.action.action_id = ids["InaIngress.set_slot"]
    res["const_default"] = c1.write(upd(M, table_entry=te))
    res["batch"] = c1.write(
        upd(INS, table_entry=agg_entry(7, 1, slot=6)),
        upd(INS, table_entry=agg_entry(7, 0)),
        upd(INS, table_entry=agg_entry(9, 0, slot=1, workers=2)),
    )
    res["wrong_device_write"] = c1.write(upd(INS, table_entry=agg_entry(1, 2)), device_id=3)

    def decode(entities):
        out = []
        for e in entities:
            t = e.table_entry
            names = {a.preamble.id: a for a in info.actions}
            a = names[t.action.action.action_id]
            pnames = {p.id: p.name for p in a.params}
            out.append(
                [
                    [int.from_bytes(m.exact.value, "big") for m in t.match],
                    a.preamble.name,
                    {
                        pnames[p.param_id]: int.from_bytes(p.value, "big")
                        for p in t.action.action.params
                    },
                ]
            )
        return sorted(out)

    tid = ids["InaIngress.aggregation_table"]
    res["agg_entries"] = decode(c1.read(pb.Entity(table_entry=pb.TableEntry(table_id=tid))))
    c1.write(upd(M, table_entry=agg_entry(7, 1, slot=9)))
    one = pb.TableEntry(table_id=tid)
    one.match.add(field_id=1).exact.value = b(7)
    one.match.add(field_id=2).exact.value = b(1)
    res["agg_entry_after_modify"] = decode(c1.read(pb.Entity(table_entry=one)))[0][2]
    c1.write(upd(D, table_entry=agg_entry(7, 1)))
    res["agg_entries_after_delete"] = len(
        c1.read(pb.Entity(table_entry=pb.TableEntry(table_id=tid)))
    )
    te = pb.TableEntry(table_id=ids["InaIngress.l2_forward"], is_default_action=True)
    te.action.action.action_id = ids["InaIngress.forward"]
    te.action.action.params.add(param_id=1, value=b(3))
    c1.write(upd(M, table_entry=te))
    got = c1.read(
        pb.Entity(
            table_entry=pb.TableEntry(table_id=ids["InaIngress.l2_forward"], is_default_action=True)
        )
    )
    res["l2_default"] = decode(got)[0][1:]
    # Put the default back to drop so the malformed frames below are not forwarded.
    te = pb.TableEntry(table_id=ids["InaIngress.l2_forward"], is_default_action=True)
    c1.write(upd(M, table_entry=te))

    # Worker bindings of group 7: worker w on port w + 1.
    for w in range(4):
        te = pb.TableEntry(table_id=ids["InaIngress.worker_port"])
        te.match.add(field_id=1).exact.value = b(7)
        te.match.add(field_id=2).exact.value = b(w)
        te.action.action.action_id = ids["InaIngress.set_worker_port"]
        te.action.action.params.add(param_id=1, value=b(w + 1))
        c1.write(upd(INS, table_entry=te))
    res["worker_entries"] = len(
        c1.read(pb.Entity(table_entry=pb.TableEntry(table_id=ids["InaIngress.worker_port"])))
    )

    # Multicast groups: replicas 1, 2 through P4Runtime 1.4's ``port`` bytes (one of them
    # padded to 2 bytes), 3, 4 through the deprecated ``egress_port``; each reads back in
    # the form it was written, as BMv2 does.
    mg = pb.PacketReplicationEngineEntry()
    mg.multicast_group_entry.multicast_group_id = 100
    mg.multicast_group_entry.replicas.add(port=b"\x01", instance=0)
    mg.multicast_group_entry.replicas.add(port=b"\x00\x02", instance=0)
    for port in (3, 4):
        mg.multicast_group_entry.replicas.add(egress_port=port, instance=0)
    c1.write(upd(INS, packet_replication_engine_entry=mg))

    def read_mcast(raw_form: bool = False):
        q = pb.PacketReplicationEngineEntry()
        q.multicast_group_entry.multicast_group_id = 0
        out = []
        for e in c1.read(pb.Entity(packet_replication_engine_entry=q)):
            g = e.packet_replication_engine_entry.multicast_group_entry
            replicas = []
            for r in g.replicas:
                kind = r.WhichOneof("port_kind")
                port = int.from_bytes(r.port, "big") if kind == "port" else r.egress_port
                replicas.append([kind, r.port.hex()] if raw_form else [port, r.instance])
            out.append([g.multicast_group_id, replicas])
        return out

    res["mcast"] = read_mcast()
    res["mcast_forms"] = read_mcast(raw_form=True)

    # Frames straight into the pipeline: one complete round on group 7, then malformed.
    out = []
    for w in range(4):
        frame = build_frame(InaHeader(7, 0, w, 4), [w * i + i for i in range(VECTOR_LEN)])
        out = pipeline.process(w + 1, frame)
    res["result_sum"] = list(unpack(out[1][1][42:]).values) if len(out) > 1 else None
    good = build_frame(InaHeader(7, 0, 0, 4), [1] * VECTOR_LEN)
    for frame in (
        good[:-1],  # short
        build_frame(InaHeader(7, 0, 4, 4), [1] * VECTOR_LEN),  # worker id
        build_frame(InaHeader(7, 0, 0, 3), [1] * VECTOR_LEN),  # worker count
        build_frame(InaHeader(8, 0, 0, 4), [1] * VECTOR_LEN),  # no entry
        build_frame(InaHeader(7, 0, 1, 4), [1] * VECTOR_LEN),  # worker 1 from port 1
    ):
        pipeline.process(1, frame)

    def counter(name, index=None):
        ce = pb.CounterEntry(counter_id=ids[name])
        if index is not None:
            ce.index.index = index
        return {
            str(e.counter_entry.index.index): e.counter_entry.data
            for e in c1.read(pb.Entity(counter_entry=ce))
        }

    drops = counter("InaIngress.ina_drops")
    res["ina_drops"] = {k: drops[k].packet_count for k in map(str, range(16))}
    res["ina_events"] = {k: v.packet_count for k, v in counter("InaIngress.ina_events").items()}
    d = counter("InaIngress.port_rx", 1)["1"]
    res["port_rx_1"] = [d.packet_count, d.byte_count]
    d = counter("InaEgress.port_tx", 2)["2"]
    res["port_tx_2"] = [d.packet_count, d.byte_count]
    try:
        counter("InaIngress.port_rx", 512)
    except grpc.RpcError as e:
        res["counter_bad_index"] = _code(e)
    try:
        c1.read(pb.Entity(counter_entry=pb.CounterEntry(counter_id=0x12ABCDEF)))
    except grpc.RpcError as e:
        res["counter_unknown"] = _code(e)
    ce = pb.CounterEntry(counter_id=ids["InaEgress.port_tx"])
    ce.index.index = 2
    c1.write(upd(M, counter_entry=ce))
    d = counter("InaEgress.port_tx", 2)["2"]
    res["counter_reset"] = [d.packet_count, d.byte_count]
    try:
        c1.read(pb.Entity(register_entry=pb.RegisterEntry(register_id=ids["InaIngress.pool"])))
    except grpc.RpcError as e:
        res["read_register"] = _code(e)

    mg.multicast_group_entry.ClearField("replicas")
    mg.multicast_group_entry.replicas.add(egress_port=1, instance=0)
    mg.multicast_group_entry.replicas.add(egress_port=2, instance=1)
    c1.write(upd(M, packet_replication_engine_entry=mg))
    res["mcast_after_modify"] = read_mcast()

    c1.close()
    server.stop(grace=0.5).wait()
    time.sleep(0.1)
    return res


def _scenario_shell() -> dict:
    import tempfile

    import p4runtime_sh.shell as sh
    from p4runtime_sh.p4runtime import P4RuntimeWriteException

    from agents.softswitch.pipeline import InaPipeline
    from agents.softswitch.server import SoftSwitchP4Runtime, serve

    server, port = serve(SoftSwitchP4Runtime(InaPipeline(), device_id=1), "127.0.0.1:0")
    res: dict = {}
    with tempfile.NamedTemporaryFile(suffix=".json") as dev:
        sh.setup(
            device_id=1,
            grpc_addr=f"127.0.0.1:{port}",
            election_id=(0, 1),
            config=sh.FwdPipeConfig(str(P4INFO), dev.name),
            verbose=False,
        )
    te = sh.TableEntry("InaIngress.aggregation_table")(action="InaIngress.set_slot")
    te.match["group_id"] = "7"
    te.match["agg_index"] = "0"
    te.action["slot"] = "5"
    te.action["num_workers"] = "4"
    te.action["mcast_grp"] = "100"
    te.insert()
    try:
        te.insert()
    except P4RuntimeWriteException as e:
        from google.rpc import code_pb2

        res["duplicate"] = [code_pb2.Code.Name(err.canonical_code) for _, err in e.errors]
    entries = []
    for e in sh.TableEntry("InaIngress.aggregation_table").read():
        key = [int.from_bytes(e.match[f].exact.value, "big") for f in ("group_id", "agg_index")]
        params = {p.param_id: int.from_bytes(p.value, "big") for p in e.msg().action.action.params}
        entries.append([key, {"slot": params[1]}])
    res["entries"] = entries
    sh.MulticastGroupEntry(100).add(1).add(2).insert()
    groups = list(sh.MulticastGroupEntry(0).read())
    res["mcast"] = [groups[0].group_id, [r.egress_port for r in groups[0].replicas]]
    res["drops_len"] = len(list(sh.CounterEntry("InaIngress.ina_drops").read()))
    sh.teardown()
    server.stop(grace=0.5).wait()
    return res


def _scenario_cli() -> dict:
    import grpc
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2
    from p4.v1 import p4runtime_pb2 as pb

    proc = subprocess.Popen(
        [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    res: dict = {}
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.strip().split("=")[1])
        c = _Client(f"127.0.0.1:{port}", (0, 1))
        c.arbitration()
        res["api_version"] = c.stub.Capabilities(pb.CapabilitiesRequest()).p4runtime_api_version
        info = p4info_pb2.P4Info()
        text_format.Parse(P4INFO.read_text(), info)
        req = pb.SetForwardingPipelineConfigRequest(
            device_id=1, action=pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
        )
        req.election_id.low = 1
        req.config.p4info.CopyFrom(info)
        try:
            c.stub.SetForwardingPipelineConfig(req)
            res["config"] = "OK"
        except grpc.RpcError as e:
            res["config"] = _code(e)
        tid = next(t.preamble.id for t in info.tables if t.preamble.alias == "l2_forward")
        fwd = next(a.preamble.id for a in info.actions if a.preamble.alias == "forward")
        te = pb.TableEntry(table_id=tid)
        te.match.add(field_id=1).exact.value = bytes.fromhex("020000000001")
        te.action.action.action_id = fwd
        te.action.action.params.add(param_id=1, value=b"\x02")
        c.write(pb.Update(type=pb.Update.INSERT, entity=pb.Entity(table_entry=te)))
        res["entries"] = len(c.read(pb.Entity(table_entry=pb.TableEntry(table_id=tid))))
        c.close()
    finally:
        proc.terminate()
        # the exit is the condition; the bound only stops a hang (a loaded CI machine took
        # more than 10 s to stop the process cleanly)
        res["exit"] = proc.wait(timeout=HANG_S)
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    scenario = {"raw": _scenario_raw, "shell": _scenario_shell, "cli": _scenario_cli}[sys.argv[1]]
    print(json.dumps(scenario()))
