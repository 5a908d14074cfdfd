"""The controller's gRPC service in-process on loopback (docs/design.md §9): an agent speaks
only for what the plan gives it. Telemetry only for the sender's groups and bounded, GPUs
and identities bound to the topology, and the metrics that follow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.service import SW, Stream, code_of, hier_plan, register, switch_inventory

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer
from controller.service.store import Store


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
        # ...a link the topology does not have is dropped and counted (the GPU
        # agent's NVSwitch link on a mesh board refused every report of that server), and
        # the rest of the report stands...
        rep = _report(
            ident,
            session,
            links=[
                pb.LinkUtilisation(link_id="p0-g0|n1", utilisation=0.5),
                pb.LinkUtilisation(link_id="p0-g0|p0-nvsw", utilisation=0.5),
                pb.LinkUtilisation(link_id="p0-g0|s1", utilisation=0.25),
            ],
        )
        stub.ReportTelemetry(rep)
        unknown = {"reason": "unknown_link"}
        assert reg.get_sample_value("heroserve_telemetry_records_dropped_total", unknown) == 2
        assert core.utilisation == {"p0-g0|s1": 0.25}
        # ...and a link of the cluster must be the sender's own.
        rep = _report(ident, session, links=[pb.LinkUtilisation(link_id="p1-g0|s1")])
        assert code_of(stub.ReportTelemetry, rep) == grpc.StatusCode.PERMISSION_DENIED
    with core.store.transaction() as db:
        assert db.execute("SELECT COUNT(*) FROM member_seq").fetchone()[0] == 0
    assert len(list(reg.collect())) == series
    assert reg.get_sample_value("heroserve_link_utilisation_ratio", {"link": "p1-g0|s1"}) is None
    assert reg.get_sample_value("heroserve_link_utilisation_ratio", {"link": "p0-g0|n1"}) is None


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
