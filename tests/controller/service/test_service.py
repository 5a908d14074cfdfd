"""The controller's gRPC service in-process on loopback (docs/design.md §9)."""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agents.client import PolicyState
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.inputs.plan_checks import validate_plan_dict
from controller.plan import SLA
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, main
from controller.service.store import Store

SW = pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH)
GPU = pb.NodeIdentity(node_id="p0-g1", kind=pb.NODE_KIND_GPU)


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    # The sample plans name topology "sample", no built-in: the controller is given it.
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(ina_groups=2)
        )
    )
    yield s
    s.stop()


@pytest.fixture
def chan(srv: ThreadedServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        yield ch


def switch_inventory(slots: int = 1024) -> pb.SwitchInventory:
    inv = pb.SwitchInventory(device_id=1, aggregator_slots=slots, slot_bytes=128)
    for k in range(4):
        inv.ports.add(
            port=k + 1,
            peer=f"p0-g{k}",
            capacity=12.5e9,
            peer_mac=f"02:00:00:00:00:0{k + 1}",
            peer_ipv4=f"10.0.0.{k + 1}",
        )
    return inv


def register(stub: pb_grpc.ControlStub, ident: pb.NodeIdentity, slots: int = 1024) -> str:
    req = pb.RegisterRequest(identity=ident)
    if ident.kind == pb.NODE_KIND_SWITCH:
        req.switch_inventory.CopyFrom(switch_inventory(slots))
    else:
        req.gpu.gpus.add(gpu_id=ident.node_id, gpu_type="A100-40GB")
    return stub.Register(req, timeout=5).session_id


class Stream:
    """A policy stream read on a thread, so tests can wait with a timeout."""

    def __init__(self, stub: pb_grpc.ControlStub, ident: pb.NodeIdentity, session: str) -> None:
        self.call = stub.Subscribe(pb.SubscribeRequest(identity=ident, session_id=session))
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for upd in self.call:
                self.q.put(upd)
        except grpc.RpcError as exc:
            self.q.put(exc)

    def next(self, timeout: float = 10) -> pb.PolicyUpdate:
        item = self.q.get(timeout=timeout)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.call.cancel()


def code_of(fn, *args, **kw) -> grpc.StatusCode:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, **kw)
    return ei.value.code()


def test_switch_gets_full_state_then_incremental_updates(
    srv: ThreadedServer, chan: grpc.Channel
) -> None:
    epoch, _ = srv.call(lambda: srv.server.core.apply_plan(sample_plan(ina_groups=1).to_json()))
    assert epoch == 1
    stub = pb_grpc.ControlStub(chan)
    session = register(stub, SW)
    st = Stream(stub, SW, session)
    first = st.next()
    assert first.full and first.epoch == 1
    (a,) = first.switch_policy.assignments
    assert (a.group_id, a.group_name, a.switch) == (1, "prefill/0/0", "s1")
    assert (a.slots.start, a.slots.count, a.worker_count, a.multicast_group_id) == (0, 8, 4, 1)
    assert [(m.worker_id, m.gpu, m.port, m.port_known) for m in a.members] == [
        (k, f"p0-g{k}", k + 1, True) for k in range(4)
    ]
    assert a.members[2].mac == "02:00:00:00:00:03" and a.members[2].ipv4 == "10.0.0.3"

    # A plan with a second INA group on s1: an incremental update with only that group.
    epoch2, _ = srv.call(lambda: srv.server.core.apply_plan(sample_plan(ina_groups=2).to_json()))
    assert epoch2 == 2
    second = st.next()
    assert not second.full and second.epoch == 2
    assert [x.group_name for x in second.switch_policy.assignments] == ["prefill/1/0"]
    assert second.switch_policy.assignments[0].slots.start == 8
    assert not second.switch_policy.removed_group_ids

    # The same plan again is no new epoch; dropping group 1 removes it (and frees slots).
    assert srv.call(lambda: srv.server.core.apply_plan(sample_plan(ina_groups=2).to_json()))[0] == 2
    srv.call(lambda: srv.server.core.apply_plan(sample_plan(ina_groups=1).to_json()))
    third = st.next()
    assert third.epoch == 3 and list(third.switch_policy.removed_group_ids) == [2]
    assert [a.owner for a in srv.server.core.pool.allocations("s1")] == ["prefill/0/0"]

    state = PolicyState()
    for u in (first, second, third):
        assert state.apply(u)
    assert sorted(state.switch_groups) == [1]
    st.close()


def test_gpu_agent_gets_policy_tables(srv: ThreadedServer, chan: grpc.Channel) -> None:
    srv.call(lambda: srv.server.core.apply_plan(sample_plan(ina_groups=1).to_json()))
    stub = pb_grpc.ControlStub(chan)
    st = Stream(stub, GPU, register(stub, GPU))
    upd = st.next()
    assert upd.full and upd.WhichOneof("body") == "gpu_policy"
    (t,) = upd.gpu_policy.tables
    assert (t.group_id, t.version, t.apply_from_seq) == ("prefill/0/0", 1, 0)
    assert [(p.id, p.scheme, p.switch) for p in t.policies] == [
        (0, pb.SCHEME_INA, "s1"),
        (1, pb.SCHEME_RING, ""),
    ]
    assert list(t.policies[0].paths["p0-g1"].nodes) == ["p0-g1", "s1"]
    # Ring through the switch: member 1 -> s1 -> member 2.
    assert list(t.policies[1].paths["p0-g1"].nodes) == ["p0-g1", "s1", "p0-g2"]
    assert [lk.id for lk in t.links] == [f"p0-g{k}|s1" for k in range(4)]
    assert [a.group_id for a in upd.gpu_policy.ina] == [1]
    st.close()


def test_ack_and_stale_epochs(srv: ThreadedServer, chan: grpc.Channel) -> None:
    core = srv.server.core
    srv.call(lambda: core.apply_plan(sample_plan(tag="a").to_json()))
    srv.call(lambda: core.apply_plan(sample_plan(tag="b").to_json()))
    stub = pb_grpc.ControlStub(chan)
    session = register(stub, SW)

    def ack(epoch: int, sess: str = session) -> pb.AckResponse:
        return stub.Ack(pb.AckRequest(identity=SW, session_id=sess, epoch=epoch, ok=True))

    assert ack(2).current_epoch == 2
    ack(1)  # stale: recorded epoch stays 2
    state = pb_grpc.AdminStub(chan).GetState(pb.GetStateRequest())
    assert state.epoch == 2
    assert [(a.identity.node_id, a.acked_epoch) for a in state.agents] == [("s1", 2)]
    assert code_of(ack, 3) == grpc.StatusCode.INVALID_ARGUMENT  # not issued yet
    assert code_of(ack, 0) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(ack, 2, "bogus") == grpc.StatusCode.FAILED_PRECONDITION

    # The agent side ignores a stale or repeated incremental update.
    ps = PolicyState()
    assert ps.apply(pb.PolicyUpdate(epoch=5, full=True))
    assert not ps.apply(pb.PolicyUpdate(epoch=5))
    stale = pb.PolicyUpdate(epoch=4)
    stale.switch_policy.assignments.add(group_id=9)
    assert not ps.apply(stale) and ps.switch_groups == {} and ps.epoch == 5
    newer = pb.PolicyUpdate(epoch=6)
    newer.switch_policy.assignments.add(group_id=9)
    assert ps.apply(newer) and sorted(ps.switch_groups) == [9]


def test_telemetry(srv: ThreadedServer, chan: grpc.Channel) -> None:
    core = srv.server.core
    srv.call(lambda: core.apply_plan(sample_plan().to_json()))
    stub = pb_grpc.ControlStub(chan)
    session = register(stub, GPU)
    rep = pb.TelemetryReport(identity=GPU, session_id=session, window_s=0.1)
    rep.links.add(link_id="s1|p0-g1", utilisation=0.25, bytes_per_s=3e9)
    rep.selections.add(
        group_id="prefill/0/0", version=1, policy_id=0, selections=10, bytes=4096, last_seq=100
    )
    rep.ports.add(port=1, rx_bytes=10)
    assert stub.ReportTelemetry(rep).accepted == 3
    assert core.utilisation == {"p0-g1|s1": 0.25}
    assert core.store.last_seq("prefill/0/0") == 100
    reg = core.metrics.registry
    assert (
        reg.get_sample_value(
            "heroserve_policy_selections_total", {"group": "prefill/0/0", "policy": "0"}
        )
        == 10
    )
    # The label is the canonical (sorted) link id of the cluster, whatever order was sent.
    assert reg.get_sample_value("heroserve_link_utilisation_ratio", {"link": "p0-g1|s1"}) == 0.25
    # The utilisation reaches the tables sent afterwards.
    st = Stream(stub, GPU, session)
    (t,) = st.next().gpu_policy.tables
    assert dict(t.utilisation) == {"p0-g1|s1": 0.25}
    st.close()
    bad = pb.TelemetryReport(identity=GPU, session_id=session)
    bad.links.add(link_id="s1|p0-g1", utilisation=1.5)
    assert code_of(stub.ReportTelemetry, bad) == grpc.StatusCode.INVALID_ARGUMENT
    bad2 = pb.TelemetryReport(identity=GPU, session_id=session)
    bad2.links.add(link_id="nolink", utilisation=0.5)
    assert code_of(stub.ReportTelemetry, bad2) == grpc.StatusCode.INVALID_ARGUMENT


def test_table_version_and_apply_from_seq_follow_reports(
    srv: ThreadedServer, chan: grpc.Channel
) -> None:
    core = srv.server.core
    srv.call(lambda: core.apply_plan(sample_plan(ina_groups=1, workers=4).to_json()))
    core.store.note_seq("prefill/0/0", 500)
    # Same group, different members' paths: the table content changes.
    p = sample_plan(ina_groups=1, workers=4)
    p.prefill.groups[0].gpus.reverse()
    srv.call(lambda: core.apply_plan(p.to_json()))
    stub = pb_grpc.ControlStub(chan)
    st = Stream(stub, GPU, register(stub, GPU))
    (t,) = st.next().gpu_policy.tables
    assert t.version == 2 and t.apply_from_seq == 500 + 1 + core.opts.apply_margin
    st.close()


def test_health(chan: grpc.Channel) -> None:
    h = health_pb2_grpc.HealthStub(chan)
    for svc in ("", "heroserve.v1.Control", "heroserve.v1.Admin"):
        resp = h.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    assert code_of(h.Check, health_pb2.HealthCheckRequest(service="nope")) == (
        grpc.StatusCode.NOT_FOUND
    )


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
    assert err.startswith("heroserve controller: cannot resolve the plan's topology 'sample'")
    assert err.count("\n") == 1 and "--topology" in err
    (tmp_path / "bad.json").write_text("{")
    assert main(["--db", db, "--plan", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"heroserve controller: {tmp_path / 'bad.json'}: not valid JSON (")
    assert err.count("\n") == 1


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


@pytest.fixture(scope="module")
def testbed_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``heroserve plan --json PATH`` on the testbed with the paper's roles (prefill on the
    A100 servers, decode on the V100 servers), the plan only, with the parallelism the tests
    below rely on (prefill TP1xPP4, decode TP4xPP2, TP inside a server) forced: the planner's
    own choice follows the cost model."""
    from controller.cli import main as cli

    path = tmp_path_factory.mktemp("plan") / "plan.json"
    args = ["--prefill-par", "1x4", "--decode-par", "4x2", "--quiet", "--json", str(path)]
    args += ["--topology", "testbed-paper"]
    assert cli(["plan", "--planner", "heroserve", *args]) == 0
    return path.read_text()


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
    from controller.models.gpus import gpu_spec
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
        nvlink = gpu_spec(plan.decode.gpu_type).nvlink_bw / 2  # per direction
        for t in state.tables:
            parsed = parse_table(table_json(t))  # what every GPU agent runs
            assert parsed.group_id == t.group_id and parsed.version == 1
            for lk in t.links:
                a, b = lk.id.split("|")
                assert lk.capacity == g.edges[a, b]["capacity"] > 0
            # The decode groups are NVLink rings inside one V100 server: 150 GB/s per GPU and
            # direction (300 GB/s over both).
            assert {lk.capacity for lk in t.links} == {nvlink} == {150e9}
            assert len(t.links) == 4
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


@pytest.mark.parametrize(
    ("topology", "why"),
    [
        ("nosuch", "unknown topology 'nosuch'"),
        ("/nonexistent/cluster.yaml", "topology file '/nonexistent/cluster.yaml' does not exist"),
    ],
)
def test_plan_with_unresolvable_topology_is_refused(
    tmp_path: Path, testbed_plan: str, topology: str, why: str
) -> None:
    from controller.topology import testbed

    d = json.loads(testbed_plan)
    d["topology"] = topology
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
            assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            msg = ei.value.details()
            assert msg.startswith(f"cannot resolve the plan's topology {topology!r} ({why}")
            assert "start the controller with --topology" in msg
            # Nothing applied, nothing pushed: no epoch, no plan, no update on the stream.
            state = pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5)
            assert (state.epoch, state.plan_id, state.topology) == (0, "", "")
            assert s.server.core.state is None and s.server.core.store.current_plan() is None
            with pytest.raises(queue.Empty):
                st.next(timeout=0.5)
            st.close()
            # Served once the controller is given the cluster (the same plan, --topology).
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
    assert err.startswith("heroserve controller: cannot resolve the plan's topology 'sample'")
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


# --- hierarchical INA: rails on their switches, three kinds of policy -------------


def hier_plan(model: str = "none"):  # noqa: ANN201
    """A hand-made testbed plan: prefill instance 0 is one hierarchical group over two A100
    servers x two GPUs (rail 0 = the GPU 0s on s1, rail 1 = the GPU 1s on s2); decode is
    TP=1 (no table)."""
    from controller.plan import Group, Instance, Rail

    p = sample_plan(ina_groups=0, ring_groups=0)
    p.topology, p.model = "testbed", model
    gpus = ["srv0-gpu0", "srv0-gpu1", "srv1-gpu0", "srv1-gpu1"]
    rails = [
        Rail(sw, k, 2, [f"srv0-gpu{k}", f"srv1-gpu{k}"], None, {
            f"srv{s}-gpu{k}": [f"srv{s}-gpu{k}", sw] for s in (0, 1)
        })
        for k, sw in enumerate(("s1", "s2"))
    ]  # fmt: skip
    g = Group(0, 0, gpus, "hier", None, None, {}, 1e-4, 2e-4, 3e-4, "hand-made", rails, 1e-4)
    p.prefill.tp, p.prefill.instances, p.prefill.groups = 4, [Instance([gpus])], [g]
    p.decode.tp, p.decode.instances = 1, [Instance([["srv2-gpu0"]])]
    p.decode.groups = [Group(0, 0, ["srv2-gpu0"], "ring", None, None, {}, 0.0, None, 0.0, "TP=1")]
    return p


def test_hier_group_gets_rails_and_three_policies(tmp_path: Path) -> None:
    from controller.scheduler.online import parse_table
    from controller.service.core import Controller
    from controller.service.tables import table_json

    c = Controller(Store(tmp_path / "c.db"))
    c.apply_plan(hier_plan().to_json())
    aggs = {a.group_name: a for a in c.state.assignments}
    assert sorted(aggs) == ["prefill/0/0/flat", "prefill/0/0/rail0", "prefill/0/0/rail1"]
    got = {
        n: (a.switch, a.group_id, a.multicast_group_id, a.slots.start, a.slots.count,
            [(m.worker_id, m.gpu) for m in a.members])
        for n, a in aggs.items()
    }  # fmt: skip
    # Rails first (ids and slots in name order), the optional flat alternative last; every
    # member of a rail reaches its switch over its own NIC, and every GPU reaches s1 (own NIC
    # or an NVLink relay to a peer's), so the flat alternative sits on s1.
    assert got == {
        "prefill/0/0/rail0": ("s1", 1, 1, 0, 16, [(0, "srv0-gpu0"), (1, "srv1-gpu0")]),
        "prefill/0/0/rail1": ("s2", 2, 2, 0, 16, [(0, "srv0-gpu1"), (1, "srv1-gpu1")]),
        "prefill/0/0/flat": (
            "s1", 3, 3, 16, 16,
            [(0, "srv0-gpu0"), (1, "srv0-gpu1"), (2, "srv1-gpu0"), (3, "srv1-gpu1")],
        ),
    }  # fmt: skip
    (t,) = c.state.tables
    assert t.group_id == "prefill/0/0"
    hier, flat, ring = t.policies
    assert (hier.id, hier.scheme, hier.switch) == (0, pb.SCHEME_HIER, "")
    assert [(r.shard, r.switch) for r in hier.rails] == [(0, "s1"), (1, "s2")]
    assert {g: list(r.nodes) for g, r in hier.paths.items()} == {
        "srv0-gpu0": ["srv0-gpu0", "s1"],
        "srv1-gpu0": ["srv1-gpu0", "s1"],
        "srv0-gpu1": ["srv0-gpu1", "s2"],
        "srv1-gpu1": ["srv1-gpu1", "s2"],
    }
    # The reduce-scatter and all-gather inside each server run over its NVSwitch.
    assert list(hier.links) == sorted(
        [f"s{k + 1}|srv{s}-gpu{k}" for s in (0, 1) for k in (0, 1)]
        + [f"srv{s}-gpu{k}|srv{s}-nvsw" for s in (0, 1) for k in (0, 1)]
    )
    assert (flat.id, flat.scheme, flat.switch, list(flat.rails)) == (1, pb.SCHEME_INA, "s1", [])
    assert all(list(r.nodes)[-1] == "s1" for r in flat.paths.values())
    assert (ring.id, ring.scheme, ring.switch) == (2, pb.SCHEME_RING, "")
    parsed = parse_table(table_json(t))  # what the GPU agents run
    assert [p.scheme for p in parsed.policies] == ["hier", "ina", "ring"]
    # The agents: server srv0 gets the table and its GPUs' three aggregation groups; each
    # switch its own groups.
    srv0 = c.node_state(pb.NodeIdentity(node_id="srv0", kind=pb.NODE_KIND_GPU))
    assert list(srv0.tables) == ["prefill/0/0"] and sorted(srv0.gpu_ina) == [1, 2, 3]
    s2 = c.node_state(pb.NodeIdentity(node_id="s2", kind=pb.NODE_KIND_SWITCH))
    assert [a.group_name for a in s2.switch_groups.values()] == ["prefill/0/0/rail1"]
    srv2 = c.node_state(pb.NodeIdentity(node_id="srv2", kind=pb.NODE_KIND_GPU))
    assert not srv2.tables and not srv2.gpu_ina  # TP=1 decode


def test_hier_alternative_left_out_when_its_slots_do_not_fit(tmp_path: Path) -> None:
    from controller.service.core import Controller, Options

    # 16 slots per switch: each rail fits, the flat alternative on s1 does not.
    c = Controller(Store(tmp_path / "c.db"), Options(default_slots=16))
    c.apply_plan(hier_plan().to_json())
    assert sorted(a.group_name for a in c.state.assignments) == [
        "prefill/0/0/rail0",
        "prefill/0/0/rail1",
    ]
    (t,) = c.state.tables
    assert [(p.id, p.scheme) for p in t.policies] == [(0, pb.SCHEME_HIER), (1, pb.SCHEME_RING)]
    c.pool.check_all()


def test_hier_table_is_priced_by_the_cost_model(tmp_path: Path) -> None:
    """Every policy of a hierarchical group's table carries Eq. 16's time model: hier priced
    on the plan's own rails as the planner prices them (costmodel.hier.hier_on_rails), flat
    INA and the ring as for any group; so at D_ref t_c = latency_s + D_ref / bandwidth."""
    from controller.costmodel.hier import hier_on_rails
    from controller.service.core import Controller
    from controller.service.pricing import PolicyTimer
    from controller.topology import testbed

    p = hier_plan(model="OPT-66B")
    p.workload, p.sla = "chatbot", SLA(2.5, 0.15)
    c = Controller(Store(tmp_path / "c.db"))
    c.apply_plan(p.to_json())
    (t,) = c.state.tables
    assert [q.scheme for q in t.policies] == [pb.SCHEME_HIER, pb.SCHEME_INA, pb.SCHEME_RING]
    assert all(q.latency_s > 0 and q.bandwidth > 0 for q in t.policies)
    timer = PolicyTimer.for_plan(p, testbed())
    assert timer is not None
    ref = timer.ref["prefill"]
    g = p.prefill.groups[0]
    rails = [(r.switch, r.shard, r.members, r.paths) for r in g.rails]
    want = hier_on_rails(timer.ev.ina_fabric, g.gpus, rails, timer.ev.net)
    assert want is not None
    hier = t.policies[0]
    assert hier.latency_s == pytest.approx(want.time(timer.ev.ina_fabric, 0.0), rel=1e-12)
    assert hier.latency_s + ref / hier.bandwidth == pytest.approx(
        want.time(timer.ev.ina_fabric, ref), rel=1e-9
    )


def test_hier_table_is_priced_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A policy the cost model cannot price (here: rails it refuses) leaves the time model
    out of every policy of its table, not only its own: an unpriced policy has no latency
    term and would win every small message against priced ones."""
    import controller.costmodel.hier as hier
    from controller.service.core import Controller

    monkeypatch.setattr(hier, "hier_on_rails", lambda *a, **k: None)
    p = hier_plan(model="OPT-66B")
    p.workload, p.sla = "chatbot", SLA(2.5, 0.15)
    c = Controller(Store(tmp_path / "c.db"))
    c.apply_plan(p.to_json())
    (t,) = c.state.tables
    assert len(t.policies) == 3
    assert all((q.latency_s, q.bandwidth) == (0.0, 0.0) for q in t.policies)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda g: g.rails.pop(), "rails must hold shards 0..0 once each"),
        (
            lambda g: (setattr(g.rails[0], "members", ["srv0-gpu0"]), g.rails[0].paths.popitem()),
            "group prefill/0/0: rail 0 has 1 member(s)",
        ),
        (
            lambda g: (
                g.rails[1].members.append("srv0-gpu0"),
                g.rails[1].paths.update({"srv0-gpu0": ["srv0-gpu0", "s2"]}),
            ),
            "group prefill/0/0: srv0-gpu0 is in rails 0 and 1",
        ),
        (
            lambda g: (
                setattr(g.rails[0], "switch", "s9"),
                g.rails[0].paths.update({m: [m, "s9"] for m in g.rails[0].members}),
            ),
            "prefill.groups[0].rails[0].switch: 's9' is not a switch of topology 'testbed'",
        ),
        (
            lambda g: g.rails[0].paths.update({"srv0-gpu0": ["srv0-gpu0", "s2"]}),
            "rails[0].paths.srv0-gpu0: never reaches the aggregation switch 's1'",
        ),
        (lambda g: setattr(g, "rails", []), "plan: prefill.groups[0].rails: a hier group needs"),
    ],
)
def test_bad_hier_groups_are_refused(tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    from controller.errors import InputError
    from controller.service.core import Controller

    p = hier_plan()
    edit(p.prefill.groups[0])
    c = Controller(Store(tmp_path / "c.db"))
    with pytest.raises(InputError, match=re.escape(message)):
        c.apply_plan(p.to_json())
    assert c.epoch == 0 and c.pool.switches() == []


# --- an agent speaks only for what the plan gives it ---------------


@pytest.fixture
def two_groups(tmp_path: Path) -> Iterator[ThreadedServer]:
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(ina_groups=2)
        )
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan(ina_groups=2).to_json()))
    yield s
    s.stop()


def _gpu_agent(stub: pb_grpc.ControlStub, node: str, *gpus: str) -> tuple[pb.NodeIdentity, str]:
    ident = pb.NodeIdentity(node_id=node, kind=pb.NODE_KIND_GPU)
    req = pb.RegisterRequest(
        identity=ident, gpu=pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id=g) for g in gpus])
    )
    return ident, stub.Register(req, timeout=5).session_id


def _report(ident: pb.NodeIdentity, session: str, **kw) -> pb.TelemetryReport:  # noqa: ANN003
    return pb.TelemetryReport(identity=ident, session_id=session, window_s=0.1, **kw)


def test_last_seq_only_for_the_senders_groups_and_bounded(two_groups: ThreadedServer) -> None:
    """2^62 for another agent's group froze it; 2^63 - 1 broke ApplyPlan
    with OverflowError (and survived restarts)."""
    core = two_groups.server.core
    with grpc.insecure_channel(f"127.0.0.1:{two_groups.port}") as ch:
        stub = pb_grpc.ControlStub(ch)
        ident, session = _gpu_agent(stub, "p0", "p0-g0", "p0-g1")
        other = pb.PolicySelection(
            group_id="prefill/1/0", policy_id=0, selections=1, last_seq=2**62
        )
        rep = _report(ident, session, selections=[other])
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.PERMISSION_DENIED
        huge = pb.PolicySelection(
            group_id="prefill/0/0", policy_id=0, selections=1, last_seq=2**63 - 1
        )
        rep = _report(ident, session, selections=[huge])
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.INVALID_ARGUMENT
        bad_policy = pb.PolicySelection(group_id="prefill/0/0", policy_id=7, selections=1)
        rep = _report(ident, session, selections=[bad_policy])
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.INVALID_ARGUMENT
        assert core.store.last_seq("prefill/1/0") is None
        assert core.store.last_seq("prefill/0/0") is None
        # A member's real report is taken; a new plan then applies from it, never from a lie.
        ok = pb.PolicySelection(group_id="prefill/0/0", policy_id=1, selections=3, last_seq=41)
        assert stub.ReportTelemetry(_report(ident, session, selections=[ok])).accepted == 1
        p = sample_plan(ina_groups=2)
        for g in p.prefill.groups:
            g.gpus.reverse()  # every table changes
        epoch, _ = two_groups.call(lambda: core.apply_plan(p.to_json()))
        assert epoch == 2
        froms = {t.group_id: t.apply_from_seq for t in core.state.tables}
        assert froms == {"prefill/0/0": 41 + 1 + 1024, "prefill/1/0": 0, "decode/0/0": 0}
        reg = core.metrics.registry
        assert (
            reg.get_sample_value("heroserve_denied_requests_total", {"rpc": "ReportTelemetry"}) == 1
        )
        assert (
            reg.get_sample_value("heroserve_invalid_requests_total", {"rpc": "ReportTelemetry"})
            == 2
        )


def test_bogus_groups_leave_no_rows_and_floods_are_refused(two_groups: ThreadedServer) -> None:
    """20,000 bogus group ids became 20,000 permanent rows; 50,000 link ids
    became 50,000 Prometheus series."""
    core = two_groups.server.core
    reg = core.metrics.registry
    series = len(list(reg.collect()))
    with grpc.insecure_channel(f"127.0.0.1:{two_groups.port}") as ch:
        stub = pb_grpc.ControlStub(ch)
        ident, session = _gpu_agent(stub, "p0", "p0-g0")
        flood = [
            pb.PolicySelection(group_id=f"x/{i}/0", selections=1, last_seq=5) for i in range(20_000)
        ]
        rep = _report(ident, session, selections=flood)
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.INVALID_ARGUMENT
        links = [pb.LinkUtilisation(link_id=f"p0-g0|n{i}", utilisation=0.1) for i in range(50_000)]
        rep = _report(ident, session, links=links)
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.INVALID_ARGUMENT
        # Under the limits, groups the plan does not have are dropped and counted...
        some = flood[:4000]
        assert stub.ReportTelemetry(_report(ident, session, selections=some)).accepted == 0
        dropped = {"reason": "unknown_group"}
        assert reg.get_sample_value("heroserve_telemetry_records_dropped_total", dropped) == 4000
        # ...and links must be the cluster's and the sender's own.
        for lid, code in (
            ("p0-g0|n1", grpc.StatusCode.INVALID_ARGUMENT),  # not in the topology
            ("p1-g0|s1", grpc.StatusCode.PERMISSION_DENIED),  # p1's link
        ):
            rep = _report(ident, session, links=[pb.LinkUtilisation(link_id=lid, utilisation=0.5)])
            assert code_of(stub.ReportTelemetry, rep) == code, lid
    with core.store.transaction() as db:
        assert db.execute("SELECT COUNT(*) FROM group_seq").fetchone()[0] == 0
    assert len(list(reg.collect())) == series
    assert core.utilisation == {}
    assert reg.get_sample_value("heroserve_link_utilisation_ratio", {"link": "p1-g0|s1"}) is None


def test_gpus_and_identity_are_bound_to_the_topology(two_groups: ThreadedServer) -> None:
    """registering node B's GPUs returned B's tables and INA groups."""
    with grpc.insecure_channel(f"127.0.0.1:{two_groups.port}") as ch:
        stub = pb_grpc.ControlStub(ch)
        for node, gpus, why in (
            ("p0", ("p1-g0",), "GPU 'p1-g0' belongs to 'p1', not to 'p0'"),
            ("p0", ("zz-g0",), "GPU 'zz-g0' is not in topology 'sample'"),
            (
                "intruder",
                ("p0-g0",),
                "node 'intruder' is neither a server nor a GPU of topology 'sample'",
            ),
            ("p0-g0", ("p0-g1",), "GPU 'p0-g1' belongs to 'p0', not to 'p0-g0'"),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                _gpu_agent(stub, node, *gpus)
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert ei.value.details() == why
        sw = pb.RegisterRequest(identity=pb.NodeIdentity(node_id="p0", kind=pb.NODE_KIND_SWITCH))
        sw.switch_inventory.device_id = 1
        assert code_of(stub.Register, sw) == grpc.StatusCode.PERMISSION_DENIED
        # A switch has no groups to report selections for.
        sess = register(stub, SW)
        sel = pb.PolicySelection(group_id="prefill/0/0", policy_id=0, selections=1)
        rep = _report(SW, sess, selections=[sel])
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.PERMISSION_DENIED
        # the slot index is 16 bits, whatever the switch says.
        big = pb.RegisterRequest(identity=SW, switch_inventory=switch_inventory(2**32 - 1))
        with pytest.raises(grpc.RpcError) as ei:
            stub.Register(big, timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "aggregator_slots 4294967295 above 65536" in ei.value.details()
        # The server p0 receives its own GPUs' tables, whatever it claims.
        ident, session = _gpu_agent(stub, "p0", "p0-g2")
        st = Stream(stub, ident, session)
        upd = st.next()
        st.close()
        assert [t.group_id for t in upd.gpu_policy.tables] == ["prefill/0/0"]
        assert [a.group_name for a in upd.gpu_policy.ina] == ["prefill/0/0"]


def test_claims_made_before_any_cluster_are_filtered_by_the_plan(tmp_path: Path) -> None:
    from controller.service.core import Controller

    c = Controller(Store(tmp_path / "c.db"))  # no --topology, no plan: nothing to check yet
    req = pb.RegisterRequest(identity=pb.NodeIdentity(node_id="srv2", kind=pb.NODE_KIND_GPU))
    req.gpu.gpus.add(gpu_id="srv0-gpu0")  # another server's GPU
    c.register(req)
    c.apply_plan(hier_plan().to_json())
    mine = c.node_state(pb.NodeIdentity(node_id="srv2", kind=pb.NODE_KIND_GPU))
    assert not mine.tables and not mine.gpu_ina
    theirs = c.node_state(pb.NodeIdentity(node_id="srv0", kind=pb.NODE_KIND_GPU))
    assert list(theirs.tables) == ["prefill/0/0"]


def test_metrics_follow_prometheus_conventions(two_groups: ThreadedServer) -> None:
    core = two_groups.server.core
    reg = core.metrics.registry
    names = {m.name for m in reg.collect()}
    # Counters are exposed with _total; units are suffixed; build_info is 1.
    assert {
        "heroserve_build_info",
        "heroserve_agent_acked_epoch",
        "heroserve_link_utilisation_ratio",
        "heroserve_policy_selected_bytes",
        "heroserve_plan_apply_seconds",
    } <= names
    (info,) = [s for m in reg.collect() if m.name == "heroserve_build_info" for s in m.samples]
    assert info.value == 1 and set(info.labels) == {"version", "python", "grpc"}
    with grpc.insecure_channel(f"127.0.0.1:{two_groups.port}") as ch:
        stub = pb_grpc.ControlStub(ch)
        ident, session = _gpu_agent(stub, "p0", "p0-g0")
        stub.Ack(pb.AckRequest(identity=ident, session_id=session, epoch=1, ok=True))
    assert reg.get_sample_value("heroserve_agent_acked_epoch", {"agent": "p0"}) == 1
    assert reg.get_sample_value("heroserve_plan_apply_seconds_count") == 1
    assert reg.get_sample_value("heroserve_aggregator_slots_allocated", {"switch": "s1"}) == 16


# --- bad input gets one line and exit 2, or the proper status ------


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
    assert "port is not in 0..65535" in refused("--listen", "[::1]:70000")
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
        (lambda d: d.update(extra=1), "plan: extra: unknown key"),
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
