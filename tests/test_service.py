"""The controller's gRPC service in-process on loopback (DESIGN.md §9)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller._gen.heroserve.v1 import control_pb2 as pb
from controller._gen.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.agent import PolicyState
from controller.service.sample import sample_plan
from controller.service.server import ControllerServer, ThreadedServer, main
from controller.store import Store

SW = pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH)
GPU = pb.NodeIdentity(node_id="p0-g1", kind=pb.NODE_KIND_GPU)


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    s = ThreadedServer(ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0"))
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
    assert reg.get_sample_value("heroserve_link_utilisation", {"link": "s1|p0-g1"}) == 0.25
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
    (tmp_path / "bad.json").write_text("{")
    assert main(["--db", db, "--plan", str(tmp_path / "bad.json")]) == 2
    assert "not a valid Plan" in capsys.readouterr().err


def test_link_capacities_from_topology(tmp_path: Path) -> None:
    import controller.topology as topo
    from controller.service.core import Controller
    from controller.service.server import topology_capacity

    cap = topology_capacity("fig2")
    # Fig. 2: two servers of two GPUs under access switch S2; every capacity is > 0.
    g = topo.fig2()
    a, b = next(iter(g.edges()))
    assert cap("|".join(sorted((a, b)))) == g.edges[a, b]["capacity"] > 0
    assert cap("nope|none") == 0.0
    c = Controller(Store(tmp_path / "c.db"), capacity=lambda link: 5.0)
    c.apply_plan(sample_plan().to_json())
    assert c.state is not None
    assert {lk.capacity for t in c.state.tables for lk in t.links} == {5.0}
