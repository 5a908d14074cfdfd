"""The controller's gRPC service in-process on loopback (docs/design.md §9): plans and their
topology. Slots refused atomically, link capacities from the cluster, the default testbed
plan (TP=1 groups get no table), a plan's topology a built-in or refused (no file a plan
names is read), and tables the validator refuses."""

from __future__ import annotations

import json
import queue
from pathlib import Path

import grpc
import pytest
from support.service import SW, Stream, code_of, register

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.inputs.plan_checks import validate_plan_dict
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, main
from controller.service.store import Store


def test_slot_exhaustion_is_refused_atomically(srv: ThreadedServer, chan: grpc.Channel) -> None:
    stub = pb_grpc.ControlStub(chan)
    register(stub, SW, slots=12)
    admin = pb_grpc.AdminStub(chan)
    assert admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=sample_plan().to_json())).epoch == 1
    big = sample_plan(ina_groups=2)  # needs 16 of 12 slots
    req = pb.ApplyPlanRequest(plan_json=big.to_json())
    assert code_of(admin.ApplyPlan, req) == grpc.StatusCode.RESOURCE_EXHAUSTED
    core = srv.server.core
    assert core.epoch == 1 and core.store.epoch() == 1
    assert [a.owner for a in core.pool.allocations("s1")] == ["prefill/0/0"]


def test_link_capacities_from_topology(tmp_path: Path) -> None:
    import controller.topology as topo
    from agents.cliutil import UsageError
    from controller.service.core import Controller
    from controller.service.server import load_cluster

    g = load_cluster("fig2")
    assert g.name == "fig2" and sorted(g.edges) == sorted(topo.fig2().edges)
    with pytest.raises(UsageError, match="--topology: unknown topology 'nope'"):
        load_cluster("nope")
    cluster = sample_topology()
    cluster.edges["p0-g0", "s1"]["capacity"] = 5.0
    c = Controller(Store(tmp_path / "c.db"), topology=cluster)
    c.apply_plan(sample_plan().to_json())
    assert c.state is not None
    caps = {lk.id: lk.capacity for t in c.state.tables for lk in t.links}
    assert caps == {
        f"{g}|s1": 5.0 if g == "p0-g0" else 12.5e9 for g in sorted(cluster) if "-g" in g
    }


# --- the default testbed plan: TP=1 groups, capacities from the plan's topology ----------


def full_state(chan: grpc.Channel, gpu: str) -> pb.PolicyUpdate:
    stub = pb_grpc.ControlStub(chan)
    ident = pb.NodeIdentity(node_id=gpu, kind=pb.NODE_KIND_GPU)
    req = pb.RegisterRequest(identity=ident)
    req.gpu.gpus.add(gpu_id=gpu, gpu_type="A100-40GB")
    st = Stream(stub, ident, stub.Register(req, timeout=5).session_id)
    try:
        upd = st.next()
    finally:
        st.close()
    assert upd.full
    return upd


def test_tp1_groups_get_no_table_and_the_others_valid_ones(
    tmp_path: Path, testbed_plan: str
) -> None:
    from controller.models.boards import board_for
    from controller.scheduler.online import parse_table
    from controller.service.tables import table_json
    from controller.topology import testbed

    plan = validate_plan_dict(json.loads(testbed_plan))
    # The default plan: prefill TP1xPP4 (four groups of one GPU), decode TP4 groups.
    assert plan.topology == "testbed-paper" and (plan.prefill.tp, plan.prefill.pp) == (1, 4)
    assert [len(g.gpus) for g in plan.prefill.groups] == [1, 1, 1, 1]
    assert plan.decode.tp == 4 and plan.decode.groups
    g = testbed()
    # No --topology: the controller resolves "testbed" from the plan.
    s = ThreadedServer(ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0"))
    try:
        admin = pb_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{s.port}"))
        assert admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=testbed_plan), timeout=30).epoch == 1
        state = s.server.core.state
        assert state is not None
        want = {f"decode/{gr.instance}/{gr.stage}" for gr in plan.decode.groups}
        assert sorted(t.group_id for t in state.tables) == sorted(want)
        pair = board_for(plan.decode.gpu_type, 4).pair_bw()  # per direction
        for t in state.tables:
            parsed = parse_table(table_json(t))  # what every GPU agent runs
            assert parsed.group_id == t.group_id and parsed.version == 1
            for lk in t.links:
                a, b = lk.id.split("|")
                assert lk.capacity == g.edges[a, b]["capacity"] > 0
            # The decode groups are NVLink rings inside one 4-GPU V100 board, a mesh: the
            # ring is spread over all 6 pairs' direct links (as the cost model spreads it),
            # 2 x 25 = 50 GB/s each per direction.
            assert {lk.capacity for lk in t.links} == {pair} == {50e9}
            assert len(t.links) == 6
        with grpc.insecure_channel(f"127.0.0.1:{s.port}") as ch:
            # A prefill GPU (TP=1) gets no table at all; a decode GPU gets its group's.
            for gr in plan.prefill.groups:
                assert list(full_state(ch, gr.gpus[0]).gpu_policy.tables) == []
            first = plan.decode.groups[0]
            (t,) = full_state(ch, first.gpus[0]).gpu_policy.tables
            assert t.group_id == f"decode/{first.instance}/{first.stage}"
    finally:
        s.stop()


def test_plan_topology_resolved_like_the_cli(tmp_path: Path, testbed_plan: str) -> None:
    from controller.service.core import Controller
    from controller.service.server import load_cluster

    by_name = Controller(Store(tmp_path / "a.db"))  # no --topology
    given = Controller(Store(tmp_path / "b.db"), topology=load_cluster("testbed"))
    for c in (by_name, given):
        c.apply_plan(testbed_plan)
    assert by_name.state is not None and given.state is not None
    assert [t.SerializeToString(deterministic=True) for t in by_name.state.tables] == [
        t.SerializeToString(deterministic=True) for t in given.state.tables
    ]
    # ... priced as well (the one resolved cluster serves capacities and prices alike).
    assert all(
        p.latency_s > 0 and p.bandwidth > 0 for t in by_name.state.tables for p in t.policies
    )


# A stand-in for /etc/shadow: the old controller opened the path a plan named and returned the
# file's first line in the error (a YAML scalar, quoted by the schema's "got ...").
SECRET = "root:$6$SECRET-MARKER-4f2a$hash:19000:0:99999:7:::\npassword: SECRET-MARKER-4f2a\n"


@pytest.mark.parametrize(
    ("kind", "code", "why"),
    [
        ("name", grpc.StatusCode.FAILED_PRECONDITION, "the plan's topology is not a built-in"),
        ("file", grpc.StatusCode.INVALID_ARGUMENT, "the plan's topology names a file"),
        ("yaml", grpc.StatusCode.INVALID_ARGUMENT, "the plan's topology names a file"),
    ],
)
def test_plan_naming_no_builtin_is_refused_and_no_file_is_read(
    tmp_path: Path, testbed_plan: str, kind: str, code: grpc.StatusCode, why: str
) -> None:
    from controller.topology import testbed

    secret = tmp_path / ("shadow.yaml" if kind == "yaml" else "shadow")
    secret.write_text(SECRET)
    d = json.loads(testbed_plan)
    d["topology"] = "nosuch" if kind == "name" else str(secret)
    bad = json.dumps(d)
    s = ThreadedServer(ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{s.port}") as ch:
            stub = pb_grpc.ControlStub(ch)
            ident = pb.NodeIdentity(node_id="srv2-gpu0", kind=pb.NODE_KIND_GPU)
            req = pb.RegisterRequest(identity=ident)
            req.gpu.gpus.add(gpu_id="srv2-gpu0", gpu_type="V100-32GB")
            st = Stream(stub, ident, stub.Register(req, timeout=5).session_id)
            first = st.next()
            assert first.full and first.epoch == 0 and not first.gpu_policy.tables
            with pytest.raises(grpc.RpcError) as ei:
                pb_grpc.AdminStub(ch).ApplyPlan(pb.ApplyPlanRequest(plan_json=bad), timeout=30)
            assert ei.value.code() == code
            msg = ei.value.details()
            assert msg.startswith(why) and "--topology" in msg, msg
            # Neither the file's content nor the plan's field comes back.
            assert "SECRET" not in msg and "root" not in msg and str(secret) not in msg
            # Nothing applied, nothing pushed: no epoch, no plan, no update on the stream.
            state = pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5)
            assert (state.epoch, state.plan_id, state.topology) == (0, "", "")
            assert s.server.core.state is None and s.server.core.store.current_plan() is None
            with pytest.raises(queue.Empty):
                st.next(timeout=0.5)
            st.close()
            # Served once the operator gives the cluster (the same plan, --topology): the
            # plan's field is then only a label.
            s.server.core.topology = testbed()
            epoch = pb_grpc.AdminStub(ch).ApplyPlan(pb.ApplyPlanRequest(plan_json=bad)).epoch
            assert epoch == 1
    finally:
        s.stop()


def test_restart_refuses_a_stored_plan_it_cannot_resolve(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from controller.service.core import Controller

    db = tmp_path / "c.db"
    store = Store(db)
    Controller(store, topology=sample_topology()).apply_plan(sample_plan().to_json())
    store.close()
    # Restarted without --topology: the stored plan's "sample" cannot be resolved.
    assert main(["--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("heroserve controller: the plan's topology is not a built-in")
    assert err.count("\n") == 1


def test_a_table_the_validator_refuses_is_a_plan_error(srv: ThreadedServer, chan) -> None:  # noqa: ANN001
    admin = pb_grpc.AdminStub(chan)

    def refused(p) -> str:  # noqa: ANN001
        with pytest.raises(grpc.RpcError) as ei:
            admin.ApplyPlan(pb.ApplyPlanRequest(plan_json=p.to_json()), timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return ei.value.details()

    p = sample_plan()
    p.decode.groups[0].paths = {}  # a ring of 4 GPUs with no routes: a table with no links
    assert refused(p) == "group decode/0/0: invalid policy table: links must be a non-empty list"
    p = sample_plan()
    p.decode.groups[0].paths["d0-g0"] = ["d0-g0", "s9", "d0-g1"]  # a switch the cluster lacks
    assert refused(p) == (
        "decode.groups[0].paths: hop d0-g0 - s9 of d0-g0's path is not a link of 'sample'"
    )
    p = sample_plan(workers=1, ring_groups=0)
    assert refused(p) == "group prefill/0/0: INA with one GPU (TP=1 has no all-reduce)"
    core = srv.server.core
    assert core.epoch == 0 and core.state is None and core.pool.allocations("s1") == []
