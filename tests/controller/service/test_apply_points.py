"""Where a new policy table applies (docs/control-plane.md, "Apply points"): from the
sequence numbers the group's agents report, and no one agent can move that point beyond
what the others justify: a report of 2^53 froze its group's tables for good (max-merged
and persisted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.plan import Plan
from controller.service.core import DEFAULT_APPLY_MARGIN, Controller
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer
from controller.service.store import MAX_SEQ, MAX_SEQ_RATE, SEQ_GAP_S, SEQ_SLACK, Store
from controller.service.tables import report_quorum

GROUP = "prefill/0/0"


def _cross_server_plan(reverse: bool = False) -> Plan:
    """The sample plan with its two INA groups made of two GPUs of each server p0 and p1, so
    each group is served by two agents (p0 and p1)."""
    p = sample_plan(ina_groups=2)
    a, b = p.prefill.groups
    a.gpus[2:], b.gpus[:2] = b.gpus[:2], a.gpus[2:]
    for i, g in enumerate((a, b)):
        if reverse:
            g.gpus.reverse()  # every table changes: new versions, new apply points
        g.paths = {x: [x, g.switch] for x in g.gpus}
        p.prefill.instances[i].stages[0] = list(g.gpus)
    return p


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(ina_groups=2)
        )
    )
    s.call(lambda: s.server.core.apply_plan(_cross_server_plan().to_json()))
    yield s
    s.stop()


def _report(stub: pb_grpc.ControlStub, node: str, seq: int) -> None:
    ident = pb.NodeIdentity(node_id=node, kind=pb.NODE_KIND_GPU)
    gpus = [pb.GpuInfo(gpu_id=f"{node}-g{k}") for k in range(4)]
    session = stub.Register(
        pb.RegisterRequest(identity=ident, gpu=pb.GpuInventory(gpus=gpus)), timeout=5
    ).session_id
    sel = pb.PolicySelection(group_id=GROUP, policy_id=0, selections=1, last_seq=seq)
    rep = pb.TelemetryReport(identity=ident, session_id=session, window_s=0.1, selections=[sel])
    assert stub.ReportTelemetry(rep, timeout=5).accepted == 1


def test_one_agent_cannot_push_its_groups_apply_point(srv: ThreadedServer) -> None:
    core = srv.server.core
    cluster, group = sample_topology(ina_groups=2), _cross_server_plan().prefill.groups[0]
    assert report_quorum(cluster, group) == 2
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        stub = pb_grpc.ControlStub(ch)
        _report(stub, "p0", MAX_SEQ)  # hostile: the highest number the bounds let through
        _report(stub, "p1", 5000)  # honest
    srv.call(lambda: core.apply_plan(_cross_server_plan(reverse=True).to_json()))
    froms = {t.group_id: t.apply_from_seq for t in core.state.tables}
    # What the honest member justifies, not 2^53 + 1025 (no collective ever reaches it).
    assert froms[GROUP] == 5000 + 1 + DEFAULT_APPLY_MARGIN
    # The other group had no report at all: it applies at once, as before.
    assert froms["prefill/1/0"] == 0


def test_one_agent_alone_is_not_a_quorum(tmp_path: Path) -> None:
    """Before a second agent reports, a cross-server group has no apply point to move."""
    c = Controller(Store(tmp_path / "c.db"), topology=sample_topology(ina_groups=2))
    c.apply_plan(_cross_server_plan().to_json())
    c.store.note_seq(GROUP, "p0", MAX_SEQ)
    c.apply_plan(_cross_server_plan(reverse=True).to_json())
    assert {t.group_id: t.apply_from_seq for t in c.state.tables}[GROUP] == 0


def test_the_quorum_th_highest_report_counts(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    assert s.last_seq("g", 2) is None
    for node, seq in (("a", 5000), ("b", 5003), ("evil", MAX_SEQ)):
        s.note_seq("g", node, seq, now=100.0)
    assert (s.last_seq("g", 1), s.last_seq("g", 2), s.last_seq("g", 3)) == (MAX_SEQ, 5003, 5000)
    assert s.last_seq("g", 4) is None
    # A later report replaces the agent's previous one (not a persisted maximum): the
    # hostile agent, back to the truth, no longer counts above it.
    s.note_seq("g", "evil", 5001, now=101.0)
    assert s.last_seq("g", 1) == 5003 and s.last_seq("g", 2) == 5001


def test_a_report_runs_ahead_of_the_last_by_at_most_the_rate(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    assert s.note_seq("g", "a", 100, now=10.0) == 100  # a first report is taken as it is
    # 1.5 s later: at most 100 + 1024 + 1.5 M
    kept = s.note_seq("g", "a", MAX_SEQ, now=11.5)
    assert kept == 100 + SEQ_SLACK + 1_500_000 == 100 + SEQ_SLACK + int(1.5 * MAX_SEQ_RATE)
    assert s.last_seq("g") == kept
    # within the bound: as reported; a restarted engine counts from 0 again
    assert s.note_seq("g", "a", kept + 10, now=11.5) == kept + 10
    assert s.note_seq("g", "a", 7, now=12.0) == 7
    # a clock that went back gives no credit, only the slack
    assert s.note_seq("g", "a", MAX_SEQ, now=1.0) == 7 + SEQ_SLACK
    s.close()
    assert Store(tmp_path / "c.db").last_seq("g") == 7 + SEQ_SLACK  # survives a restart


@pytest.mark.parametrize("gap_s", [2.0, 5.0, 60.0, 86400.0])
def test_the_bound_holds_over_any_gap(tmp_path: Path, gap_s: float) -> None:
    """With 5 s between two reports the apply point reached 5,006,215 while the
    members were at about 1,000. A report counts at most SEQ_GAP_S (2 s) of credit."""
    s = Store(tmp_path / "c.db")
    s.note_seq("g", "a", 1000, now=100.0)
    kept = s.note_seq("g", "a", MAX_SEQ, now=100.0 + gap_s)
    assert kept == 1000 + SEQ_SLACK + 2_000_000 == 1000 + SEQ_SLACK + int(SEQ_GAP_S * MAX_SEQ_RATE)


def test_a_group_s_apply_point_after_reports_seconds_apart(tmp_path: Path) -> None:
    """The finding end to end: one agent serving a group inside its server (quorum 1)
    reports 1,000, then 5 s later the highest number the wire takes."""
    c = Controller(Store(tmp_path / "c.db"), topology=sample_topology(ina_groups=2))
    plan = sample_plan(ina_groups=2)
    c.apply_plan(plan.to_json())
    cluster = sample_topology(ina_groups=2)
    assert report_quorum(cluster, plan.prefill.groups[0]) == 1
    t = 1000.0
    c.store.note_seq(GROUP, "p0", 1000, now=t)
    c.store.note_seq(GROUP, "p0", MAX_SEQ, now=t + 5.0)
    plan.prefill.groups[0].gpus.reverse()  # a new table version
    c.apply_plan(plan.to_json())
    got = {x.group_id: x.apply_from_seq for x in c.state.tables}[GROUP]
    # was 1000 + 1024 + 5,000,000 + 1 + 1024 (5,003,049): now two seconds' credit at most
    assert got == 1000 + SEQ_SLACK + 2_000_000 + 1 + DEFAULT_APPLY_MARGIN == 2_003_049
