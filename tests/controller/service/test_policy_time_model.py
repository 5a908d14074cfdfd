"""Eq. 16's time model in the controller's policy tables (docs/policy-table.md).

The controller gives every policy latency_s = t_c(0) and bandwidth = D_ref / (t_c(D_ref) -
t_c(0)) from the cost model; the C++ GPU agent carries the two fields from the proto into the
tables it publishes, with 0 bandwidth meaning "the bottleneck", and refuses bad values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gpu_agent import (
    AGENT,
    PLUGIN,
    acked,
    apply_plan,
    register_switch,
    segment,
    start_agent,
    wait_until,
)
from support.plans import shared_uplink_cluster, shared_uplink_plan

from agents.gpu.shmview import read_segment
from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.models import model_spec
from controller.planner import plan as make_plan
from controller.scheduler.online import OnlineScheduler, parse_table
from controller.service import tables as service_tables
from controller.service.core import Controller
from controller.service.pricing import PolicyTimer
from controller.service.sample import sample_plan, sample_topology
from controller.service.slots import SlotPool
from controller.service.state import derive
from controller.service.store import Store
from controller.service.tables import table_json
from controller.sim import build_model
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla

# table_json: the JSON form of docs/policy-table.md, as the GPU agent writes it (bandwidth 0
# left out: proto3's "absent").


def build_tables(tmp_path: Path, plan, cluster) -> dict[str, pb.PolicyTable]:  # noqa: ANN001
    store = Store(tmp_path / "c.db")
    state = derive(
        plan,
        "pid",
        1,
        store,
        SlotPool(store),
        cluster,
        lambda _g, _quorum: 0,
        default_slots=1024,
        slots_per_group=16,
        window_s=0.05,
        gamma=0.3,
    )
    return {t.group_id: t for t in state.tables}


def test_ina_group_hand_worked(tmp_path: Path) -> None:
    # Shared-uplink plan, decode group {d0-gpu0, d1-gpu0}: P = 2, every link 12.5e9 B/s
    # (B) with 2 us latency, D_ref = 48 tokens * 5120 * 2 B = 491 520 B. The plan records no
    # cost options, so the defaults: pipelined, int32 lanes.
    # INA on c1 (policy 0): int32 lanes in 210-byte frames of 128 payload bytes put
    # 2 x 210/128 = 3.28125 bytes on every link of both 2-hop routes, up and down, per byte.
    # Collection and distribution overlap: the slowest link (3.28125 D / B) + the longest
    # round trip (4 hops: 8 us + one 210-byte packet on 3 of them, 50.4 ns) + T_agg 1 us +
    # host 4 us:
    #   t(D) = 3.28125 D / B + 13.0504 us -> latency_s = 13.0504 us, bandwidth = B / 3.28125.
    # Fallback ring through c1 (policy 1): each member sends D/2 over 4 hops to the other, its
    # own directed links: a step takes D / (2B) + 8 us + 3 packets of 4096 B (0.98304 us) +
    # NCCL's 4 us step; 2(P-1) = 2 steps:
    #   t(D) = D / B + 25.96608 us -> latency_s = 25.96608 us, bandwidth = B = 12.5e9 B/s.
    g, p = shared_uplink_cluster(), shared_uplink_plan()
    t = build_tables(tmp_path, p, g)["decode/0/0"]
    ina, ring = t.policies
    assert (ina.scheme, ring.scheme) == (pb.SCHEME_INA, pb.SCHEME_RING)
    assert ina.latency_s == pytest.approx(13.0504e-6, rel=1e-12)
    assert ina.bandwidth == pytest.approx(12.5e9 / 3.28125, rel=1e-9)
    assert ring.latency_s == pytest.approx(25.96608e-6, rel=1e-12)
    assert ring.bandwidth == pytest.approx(12.5e9, rel=1e-9)
    # The same cost model as the simulator's option for INA on c1 (142.0744 us at D_ref).
    m = build_model(p, g, chatbot())
    ref = 48 * 5120 * 2
    sim_ina = m.decode[0].stages[0].options[0].time(ref)
    assert ina.latency_s + ref / ina.bandwidth == pytest.approx(sim_ina, rel=1e-9)
    assert sim_ina == pytest.approx(142.0744e-6, rel=1e-9)
    # Crossover 13.0504 + 3.28125 D / B = 25.96608 + D / B at D = 12.91568 us * B / 2.28125
    # = 70 772 B: INA below, the fallback ring above.
    for nbytes, want in ((4096, 0), (30_000, 0), (70_000, 0), (72_000, 1), (ref, 1)):
        assert OnlineScheduler(table_json(t)).select(nbytes) == want, nbytes
    s = OnlineScheduler(table_json(t))
    s.select(ref)
    assert s.last_cost == pytest.approx((25.96608e-6 + ref / 12.5e9) / 0.05, rel=1e-9)


def test_planned_ring_is_priced_like_the_planner(tmp_path: Path) -> None:
    # The testbed plan: the table's time model of every planned ring at D_ref must give the
    # planner's own all-reduce time for the group; groups of one GPU get no table.
    g = make_testbed()
    p = make_plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"))
    c = Controller(Store(tmp_path / "c.db"))  # resolves the plan's topology by name
    c.apply_plan(p.to_json())
    tables = {t.group_id: t for t in c.state.tables}
    timer = PolicyTimer.for_plan(p, g)
    assert timer is not None
    assert timer.ref["decode"] == max(1, p.decode.batch_size) * model_spec("OPT-66B").hidden * 2
    rings, want = 0, []
    for role, phase in (("prefill", p.prefill), ("decode", p.decode)):
        ref = timer.ref[role]
        for gr in phase.groups:
            if len(gr.gpus) < 2:  # TP = 1: no all-reduce, so no table at all
                continue
            want.append(f"{role}/{gr.instance}/{gr.stage}")
            pol = tables[want[-1]].policies[0]
            if gr.scheme == "ring":
                rings += 1
                assert pol.latency_s > 0.0 and pol.bandwidth > 0.0
                assert pol.latency_s + ref / pol.bandwidth == pytest.approx(
                    gr.allreduce_s, rel=1e-9
                )
    assert rings > 0
    assert sorted(tables) == sorted(want)


def test_unpriceable_plan_leaves_the_fields_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A hand-made plan on topology "sample", model "none": the controller cannot price it,
    # so Eq. 16 stays on the bottleneck capacity (both fields 0: absent).
    c = Controller(Store(tmp_path / "c.db"), topology=sample_topology())
    with caplog.at_level(logging.INFO, logger="heroserve.controller"):
        c.apply_plan(sample_plan().to_json())
    assert "without latency_s/bandwidth" in caplog.text
    for t in c.state.tables:
        for pol in t.policies:
            assert (pol.latency_s, pol.bandwidth) == (0.0, 0.0)
        parsed = parse_table(table_json(t))
        for pol in parsed.policies:
            assert (pol.latency_s, pol.bandwidth) == (0.0, pol.bottleneck)


@pytest.fixture
def server(tmp_path: Path) -> Iterator:
    from controller.service.core import Options
    from controller.service.server import ControllerServer, ThreadedServer

    opts = Options(apply_margin=5, telemetry_interval_s=0.2)
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", options=opts, topology=sample_topology()
        )
    )
    yield s
    s.stop()


@pytest.fixture
def prefix() -> Iterator[str]:
    import os
    import time

    p = f"pytest{os.getpid()}t{time.monotonic_ns() % 1000000}."
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


class FixedTimer(PolicyTimer):
    """(latency_s, bandwidth) by scheme, whatever the plan."""

    def __init__(self, by_scheme: dict[int, tuple[float, float]]) -> None:
        self.by_scheme = by_scheme

    def fields(self, role, g, scheme, paths):  # noqa: ANN001, ANN201, ARG002
        return self.by_scheme[scheme]


def published(prefix: str) -> dict:
    """The newest table in the group's shared-memory segment."""
    got = read_segment(segment(prefix))  # the checked read the plugin's layout defines
    assert not got.error, got.error
    return got.tables[-1]


@pytest.mark.skipif(
    not (AGENT.exists() and PLUGIN.exists()), reason="C++ GPU agent not built (make cxx)"
)
def test_gpu_agent_carries_the_fields_and_refuses_bad_ones(
    server, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    timer = FixedTimer({pb.SCHEME_INA: (13e-6, 1.5625e9), pb.SCHEME_RING: (24e-6, 0.0)})
    monkeypatch.setattr(PolicyTimer, "for_plan", lambda plan, cluster=None: timer)
    register_switch(server.port)  # every link 12.5e9 B/s
    e1 = apply_plan(server)
    agent = start_agent(tmp_path, prefix, f"127.0.0.1:{server.port}")
    try:
        wait_until(lambda: acked(server, e1), what=f"ack of epoch {e1}\n{agent.text()}")
        ina, ring = published(prefix)["policies"]
        assert (ina["latency_s"], ina["bandwidth"]) == (13e-6, 1.5625e9)
        # bandwidth 0 in the proto: absent, so the bottleneck capacity
        assert (ring["latency_s"], ring["bandwidth"]) == (24e-6, 12.5e9)
        before = segment(prefix).read_bytes()
        timer.by_scheme[pb.SCHEME_RING] = (-1e-6, 0.0)
        # The controller refuses a table its GPU agents would refuse, naming group and field...
        with pytest.raises(InputError) as ei:
            apply_plan(server, reverse=True)
        assert str(ei.value) == (
            "group prefill/0/0: invalid policy table: policy 1: latency_s must be >= 0, got -1e-06"
        )
        assert server.server.core.epoch == e1
        # ...and one that publishes it anyway (no check: a bug) meets the agent's validator.
        monkeypatch.setattr(service_tables, "check_table", lambda _t: None)
        e2 = apply_plan(server, reverse=True)
        wait_until(lambda: "keeping the last good tables" in agent.text(), what="error log")
        assert "policy 1: latency_s must be >= 0" in agent.text()
        assert not acked(server, e2)
        assert segment(prefix).read_bytes() == before
    finally:
        assert agent.stop() == 0, agent.text()
