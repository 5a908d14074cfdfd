"""The controller's gRPC service in-process on loopback (docs/design.md §9): policy streams
(full state, then incremental updates), acknowledgements and stale epochs, telemetry and the
table versions it drives, health."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.service import GPU, SW, Stream, code_of, register

from agents.client import PolicyState
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan
from controller.service.server import ThreadedServer


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
    core.store.note_seq("prefill/0/0", "p0", 500)
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
