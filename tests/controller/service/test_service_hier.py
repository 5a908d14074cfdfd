"""The controller's service with hierarchical INA (docs/design.md §9): rails on their
switches, three kinds of policy, tables priced by the cost model whole or not at all, bad
hierarchical groups refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.service import hier_plan

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.plan import SLA
from controller.service.store import Store


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
    # The reduce-scatter and all-gather inside each server run over the direct NVLink link
    # of its two members (the 4-GPU A100 board is a point-to-point mesh).
    assert list(hier.links) == sorted(
        [f"s{k + 1}|srv{s}-gpu{k}" for s in (0, 1) for k in (0, 1)]
        + [f"srv{s}-gpu0|srv{s}-gpu1" for s in (0, 1)]
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
