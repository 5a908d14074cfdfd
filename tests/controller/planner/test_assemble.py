"""Plan assembly when the switches' aggregator slots run out (``planner/assemble.py``).

A rail cluster of one-GPU servers, 8 to a unit, every GPU of a unit on the unit's one
access switch, so a TP=4 decode group spans four servers and flat INA at that switch beats
the ring (with fp16 lanes: int32 lanes double the bytes and the ring wins). Each group keeps
a window of ceil(B * RTT / slot bytes) = ceil(12.5e9 B/s * 4 us / 128 B) = 391 slots (one
2 us hop to the switch, there and back). Most access switches have 400 slots, room for one
group; three have 800, room for both stages of a 4x2 decode instance.

The search prices every group with INA; only assembly finds the slots missing. The groups
that lose INA slow their instances, so the deployment is settled again: the instances on the
800-slot switches become the fastest and replace those the search deployed. The plan must
still name, for every group, the GPUs of the instance and stage it numbers, and its KV
transfers must join GPUs it deploys: it round-trips through ``parse_plan`` and
``check_plan_on_topology``, as ``heroserve export`` reads it."""

import math

import pytest

from controller.costmodel.netparams import NetParams
from controller.inputs.plan_checks import check_plan_on_topology, parse_plan
from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology.generators import tracks
from controller.workload import chatbot, default_sla

WINDOW = math.ceil(12.5e9 * 2 * 2e-6 / 128)  # 391 slots
RICH = ("u4-acc0", "u5-acc0", "u6-acc0")  # room for two windows each


def slot_starved(rich: tuple[str, ...] = RICH):
    """7 units of 8 one-GPU servers (u0 ... u6), one access switch per unit (``uK-acc0``)."""
    g = tracks(56, 1, 1, 8, 2, name="slot-starved")
    for n, d in g.nodes(data=True):
        if d["kind"] == "switch":
            d["aggregator_slots"] = 2 * 400 if n in rich else 400
    return g


@pytest.fixture(scope="module")
def planned():
    g = slot_starved()
    # 32 GPUs: one 1x8 prefill instance and three 4x2 decode instances of the six that fit
    opts = PlannerOptions(net=NetParams(ina_lanes="fp16"), max_gpus=32)
    p = plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    return g, p


def test_window_is_the_bandwidth_delay_product(planned):
    _, p = planned
    ina = [gr for gr in p.decode.groups if gr.scheme == "ina"]
    assert ina and all(gr.slots.count == WINDOW for gr in ina)


def test_plan_round_trips_and_groups_are_their_instances_stages(planned):
    g, p = planned
    back = parse_plan(p.to_json())  # raises on a group naming another instance's GPUs
    check_plan_on_topology(back, g)
    for phase in (back.prefill, back.decode):
        keys = sorted((gr.instance, gr.stage) for gr in phase.groups)
        assert keys == [
            (i, s) for i, inst in enumerate(phase.instances) for s in range(len(inst.stages))
        ]
        for gr in phase.groups:
            assert gr.gpus == phase.instances[gr.instance].stages[gr.stage]


def test_kv_transfers_join_deployed_gpus(planned):
    _, p = planned
    pre = {x for inst in p.prefill.instances for s in inst.stages for x in s}
    dec = {x for inst in p.decode.instances for s in inst.stages for x in s}
    assert p.kv_transfer
    assert all(t.src in pre and t.dst in dec for t in p.kv_transfer)


def test_the_slot_rich_units_are_deployed_all_ina(planned):
    """Only the 800-slot switches hold both windows of an instance (2 x 391 = 782 <= 800;
    400 holds one), so the three instances there are the fastest and the ones deployed,
    every group INA at its unit's switch, slots 0+391 and 391+391."""
    _, p = planned
    assert len(p.decode.instances) == 3
    units = sorted({inst.stages[0][0].split("-")[0] for inst in p.decode.instances})
    assert units == ["u4", "u5", "u6"]
    for gr in p.decode.groups:
        unit = gr.gpus[0].split("-")[0]
        assert (gr.scheme, gr.switch) == ("ina", f"{unit}-acc0")
        assert (gr.slots.start, gr.slots.count) in {(0, WINDOW), (WINDOW, WINDOW)}
    # no group of this plan runs as a ring for want of slots, so none is reported
    assert not any("fell back" in n for n in p.notes)


def test_one_rich_switch_reorders_the_instances():
    """All three decode units deployed (no --gpus cap, 32 GPUs): u3's instance keeps INA on
    both stages and becomes the fastest, so it is instance 0, and u1's and u2's second
    group (in claim order) each run as a ring: two groups reported."""
    g = tracks(32, 1, 1, 8, 2, name="one-rich")
    for n, d in g.nodes(data=True):
        if d["kind"] == "switch":
            d["aggregator_slots"] = 800 if n == "u3-acc0" else 400
    opts = PlannerOptions(net=NetParams(ina_lanes="fp16"))
    p = plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    back = parse_plan(p.to_json())
    check_plan_on_topology(back, g)
    first = back.decode.instances[0]
    assert first.stages[0][0].startswith("u3-")
    for gr in back.decode.groups:
        assert gr.gpus == back.decode.instances[gr.instance].stages[gr.stage]
    rings = [gr for gr in back.decode.groups if gr.scheme == "ring"]
    assert len(rings) == 2 and all(gr.instance != 0 for gr in rings)
    assert all(gr.reason == "no aggregator slots left on any candidate switch" for gr in rings)
    assert "2 group(s) fell back to ring: aggregator slots exhausted" in back.notes
