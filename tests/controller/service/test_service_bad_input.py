"""The controller with bad input (docs/design.md §9): one line and exit 2 from the command,
the proper status from gRPC. Malformed registrations, subscriptions and plans, bad
configuration, ports, files and databases, oversized messages; and the canonical plan JSON
the controller makes from checked input."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from support.service import GPU, SW, Stream, code_of, hier_plan

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ThreadedServer, main
from controller.service.store import Store


@pytest.mark.parametrize(
    "req",
    [
        pb.RegisterRequest(),
        pb.RegisterRequest(identity=pb.NodeIdentity(node_id="s1")),
        pb.RegisterRequest(identity=pb.NodeIdentity(node_id="has space", kind=1)),
        pb.RegisterRequest(identity=SW, gpu=pb.GpuInventory()),
        pb.RegisterRequest(identity=GPU, switch_inventory=pb.SwitchInventory()),
        pb.RegisterRequest(
            identity=SW,
            switch_inventory=pb.SwitchInventory(
                ports=[pb.SwitchPort(port=1), pb.SwitchPort(port=1)]
            ),
        ),
        pb.RegisterRequest(identity=GPU, gpu=pb.GpuInventory(gpus=[pb.GpuInfo()])),
    ],
)
def test_malformed_register(chan: grpc.Channel, req: pb.RegisterRequest) -> None:
    stub = pb_grpc.ControlStub(chan)
    assert code_of(stub.Register, req, timeout=5) == grpc.StatusCode.INVALID_ARGUMENT


def test_malformed_subscribe_and_plans(srv: ThreadedServer, chan: grpc.Channel) -> None:
    stub = pb_grpc.ControlStub(chan)
    st = Stream(stub, pb.NodeIdentity(node_id="", kind=1), "x")
    with pytest.raises(grpc.RpcError) as ei:
        st.next()
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    admin = pb_grpc.AdminStub(chan)
    for text in ("not json", "{}", '{"planner": 1}'):
        req = pb.ApplyPlanRequest(plan_json=text)
        assert code_of(admin.ApplyPlan, req) == grpc.StatusCode.INVALID_ARGUMENT
    p = sample_plan()
    p.prefill.groups[0].switch = None
    req = pb.ApplyPlanRequest(plan_json=p.to_json())
    assert code_of(admin.ApplyPlan, req) == grpc.StatusCode.INVALID_ARGUMENT
    assert srv.server.core.epoch == 0  # nothing was applied


def test_cli_refuses_bad_configuration(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan = tmp_path / "plan.json"
    sample_plan().save(plan)
    db = str(tmp_path / "c.db")
    assert main(["--db", db, "--listen", "10.1.2.3:5000", "--plan", str(plan)]) == 2
    assert "without TLS" in capsys.readouterr().err
    assert main(["--db", db]) == 2
    assert "no plan" in capsys.readouterr().err
    assert main(["--db", db, "--plan", str(tmp_path / "missing.json")]) == 2
    assert main(["--db", db, "--tls-cert", "x", "--plan", str(plan)]) == 2
    assert "all of --tls-cert" in capsys.readouterr().err
    assert main(["--db", db, "--plan", str(plan), "--topology", "nosuch"]) == 2
    assert "--topology" in capsys.readouterr().err
    # Without --topology the plan's own topology ("sample": no built-in) cannot be resolved.
    assert main(["--db", db, "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("heroserve controller: the plan's topology is not a built-in")
    assert err.count("\n") == 1 and "--topology" in err
    (tmp_path / "bad.json").write_text("{")
    assert main(["--db", db, "--plan", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"heroserve controller: {tmp_path / 'bad.json'}: not valid JSON (")
    assert err.count("\n") == 1


def test_a_plan_priced_for_lanes_the_switches_do_not_run_is_refused(
    srv: ThreadedServer, chan: grpc.Channel, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The P4 program adds int32 lanes: a plan priced for fp16 lanes would be served with
    prices and tables that its switches do not match. Refused over gRPC and at start-up, in
    one line naming both formats; a plan of the switches' own lanes is served."""
    from controller.service.sample import save_sample_topology

    fp16 = sample_plan(ina_groups=1)
    fp16.options["ina_lanes"] = "fp16"
    admin = pb_grpc.AdminStub(chan)
    req = pb.ApplyPlanRequest(plan_json=fp16.to_json())
    assert code_of(admin.ApplyPlan, req) == grpc.StatusCode.INVALID_ARGUMENT
    assert srv.server.core.epoch == 0
    path = tmp_path / "fp16.json"
    fp16.save(path)
    topo = save_sample_topology(tmp_path / "topology.json")
    db = str(tmp_path / "start.db")  # c.db is the running fixture's (one controller per db)
    assert main(["--db", db, "--plan", str(path), "--topology", str(topo)]) == 2
    err = _one_line(capsys)
    assert "plan priced for 'fp16' INA lanes" in err, err
    assert "aggregates int32 or bfp16 lanes" in err, err
    same = sample_plan(ina_groups=1)
    same.options["ina_lanes"] = "int32"
    req = pb.ApplyPlanRequest(plan_json=same.to_json())
    assert admin.ApplyPlan(req, timeout=30).epoch == 1


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("heroserve controller: "), err
    return err.strip()


def test_cli_bad_ports_files_and_databases(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from controller.service.core import Controller
    from controller.service.sample import save_sample_topology

    plan = tmp_path / "plan.json"
    sample_plan().save(plan)
    topo = save_sample_topology(tmp_path / "topology.json")
    db = str(tmp_path / "c.db")
    base = ["--db", db, "--plan", str(plan), "--topology", str(topo)]

    def refused(*args: str) -> str:
        assert main([*base, *args]) == 2
        return _one_line(capsys)

    assert "port 99999 is not in 0..65535" in refused("--listen", "127.0.0.1:99999")
    assert "port 70000 is not in 0..65535" in refused("--listen", "[::1]:70000")
    with pytest.raises(SystemExit) as ei:
        main([*base, "--metrics-port", "99999"])
    assert ei.value.code == 2
    assert "--metrics-port: 99999 is not in 1..65535" in _one_line(capsys)
    assert "--window-s nan is not in" in refused("--window-s", "nan")
    assert "--default-slots 4294967295 is not in 1..65536" in refused(
        "--default-slots", str(2**32 - 1)
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n")
    tls = ["--tls-cert", str(garbage), "--tls-key", str(garbage), "--tls-ca", str(garbage)]
    assert "--tls-cert: not a PEM certificate" in refused(*tls)
    binary = tmp_path / "plan.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    assert main(["--db", db, "--plan", str(binary)]) == 2
    assert _one_line(capsys).endswith(f"{binary}: not UTF-8 text (byte 128)")
    # Databases holding what a controller cannot serve.
    c = Controller(Store(db), topology=sample_topology())
    c.apply_plan(sample_plan(ina_groups=1).to_json())
    c.store.close()
    with Store(db).transaction() as conn:  # four groups on slot 0
        for owner in ("x", "y", "z"):
            conn.execute("INSERT INTO slot_allocs VALUES ('s1', ?, 0, 8)", (owner,))
    assert main(["--db", db, "--topology", str(topo)]) == 2
    err = _one_line(capsys)
    assert "slot pool: switch 's1': 'x' [0, 8) overlaps 'prefill/0/0' [0, 8)" in err
    with Store(db).transaction() as conn:
        conn.execute("DELETE FROM slot_allocs WHERE owner IN ('x', 'y', 'z')")
        conn.execute("UPDATE meta SET value = 'NaN' WHERE key = 'epoch'")
    assert main(["--db", db, "--topology", str(topo)]) == 2
    assert "meta.epoch = 'NaN' is not an integer" in _one_line(capsys)
    with Store(db).transaction() as conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'epoch'")
        conn.execute("UPDATE plans SET json = '[1, 2'")
    assert main(["--db", db, "--topology", str(topo)]) == 2
    assert "stored JSON does not parse" in _one_line(capsys)
    (tmp_path / "not.db").write_bytes(b"this is not sqlite" * 100)
    assert main(["--db", str(tmp_path / "not.db"), "--plan", str(plan)]) == 2
    assert "file is not a database" in _one_line(capsys)


def _g0(d: dict) -> dict:
    return d["prefill"]["groups"][0]


def _both(d: dict, role: str, k: int, gpu: str) -> None:
    """Replace GPU k of the role's first instance and group alike (the schema requires a
    group to hold its stage's GPUs)."""
    d[role]["instances"][0]["stages"][0][k] = gpu
    g = d[role]["groups"][0]
    old = g["gpus"][k]
    g["gpus"][k] = gpu
    g["paths"][gpu] = [gpu, *g["paths"].pop(old)[1:]]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: _g0(d).update(gpus="abc"), "plan: prefill.groups[0].gpus: must be a list"),
        (lambda d: _g0(d).update(paths=[1]), "groups[0].paths: must be a mapping, got a list"),
        (lambda d: _g0(d)["gpus"].append(7), "prefill.groups[0].gpus[4]: must be a node id, got 7"),
        (lambda d: _g0(d).update(slots={"start": 0}), "groups[0].slots: missing 'count'"),
        (lambda d: _g0(d).update(scheme="magic"), "scheme: must be one of ina, ring, hier"),
        (lambda d: _g0(d).update(rails=[{"switch": 1}]), "rails[0].switch: must be a node id"),
        (lambda d: d.update(extra=1), "plan: not a plan: key 16: unknown key"),
        (lambda d: d["sla"].update(ttft_s="fast"), "plan: sla.ttft_s: must be a number"),
        (lambda d: _g0(d).update(instance=2**70), "instance: must be at most 9007199254740992"),
        (lambda d: _g0(d).update(slots={"start": 0, "count": 2**20}), "must be at most 65536"),
        (lambda d: _both(d, "prefill", 1, "p0-g0"), "GPU 'p0-g0' is used twice"),
        (lambda d: _both(d, "decode", 0, "p0-g0"), "GPU 'p0-g0' is used twice"),
        (lambda d: _both(d, "decode", 1, "zz"), "GPU 'zz' is not in topology 'sample'"),
        (lambda d: _g0(d)["paths"].update({"p0-g0": ["p0-g0", "|", "s1"]}), "'|' is not a node"),
    ],
)
def test_malformed_apply_plan_bodies(
    srv: ThreadedServer, chan: grpc.Channel, edit, message: str
) -> None:  # noqa: ANN001
    d = json.loads(sample_plan().to_json())
    edit(d)
    admin = pb_grpc.AdminStub(chan)
    with pytest.raises(grpc.RpcError) as ei:
        admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=json.dumps(d)), timeout=10)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in ei.value.details()
    assert "Traceback" not in ei.value.details() and "Error(" not in ei.value.details()
    assert srv.server.core.epoch == 0


def test_oversized_messages_are_refused_before_parsing(chan: grpc.Channel) -> None:
    admin = pb_grpc.AdminStub(chan)
    from controller.service.planinput import MAX_PLAN_BYTES

    huge = pb.ApplyPlanRequest(plan_json="x" * (MAX_PLAN_BYTES + 8192))
    assert code_of(admin.ApplyPlan, huge, timeout=30) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_canonical_json_is_the_plans_own(testbed_plan: str) -> None:
    """The plan id hashes Plan.to_json(indent=None); the controller makes that text from the
    checked input instead of serialising the Plan again: both must be the same bytes, also
    for input that leaves optional fields out."""
    from controller.service.planinput import parse_plan_canonical

    sparse = json.loads(sample_plan().to_json())
    del sparse["notes"], sparse["options"], sparse["prefill"]["instances"][0]["batch"]
    del sparse["prefill"]["groups"][0]["rails"], sparse["prefill"]["groups"][0]["hier_s"]
    for text in (testbed_plan, hier_plan().to_json(), sample_plan(ina_groups=3).to_json()):
        plan, canonical = parse_plan_canonical(text)
        assert canonical == plan.to_json(indent=None)
    plan, canonical = parse_plan_canonical(json.dumps(sparse))
    assert canonical == plan.to_json(indent=None) == sample_plan().to_json(indent=None)


def test_cli_files_it_cannot_use_get_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A port file that is a folder or cannot be created, a unix socket path that cannot be
    made, a --plan that is a FIFO (read would block for ever): one line, exit 2, and the
    gRPC server is stopped before the loop closes (no traceback from its shutdown)."""
    import os

    from controller.service.sample import save_sample_topology

    plan = tmp_path / "plan.json"
    sample_plan().save(plan)
    topo = save_sample_topology(tmp_path / "topology.json")
    base = ["--db", str(tmp_path / "c.db"), "--plan", str(plan), "--topology", str(topo)]

    def refused(*args: str) -> str:
        assert main([*base, *args]) == 2
        return _one_line(capsys)

    assert refused("--port-file", str(tmp_path)).endswith(f"{tmp_path}: is a directory")
    assert "folder '/nonexistent' does not exist" in refused("--port-file", "/nonexistent/p")
    # /proc refuses new files: the write fails after the server started listening
    assert refused("--port-file", "/proc/version").endswith(
        "--port-file /proc/version: cannot write (No such file or directory)"
    )
    assert not Path("/proc/version.tmp").exists()
    assert refused("--listen", "unix:/proc/x/sock").endswith("cannot listen on unix:/proc/x/sock")
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    assert main(["--db", str(tmp_path / "d.db"), "--plan", str(fifo)]) == 2
    assert _one_line(capsys).endswith(f"--plan {str(fifo)!r} is not a regular file")
