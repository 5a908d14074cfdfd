"""A switch with exactly one window of aggregator slots left still hosts one INA group, in
the planner's slot accounting (``planner/assemble.SlotPool``) and in the controller's
(``service/slots.SlotPool``); one slot fewer hosts no second group.

The cluster is ``test_assemble``'s rail of one-GPU servers on one access switch, where a
TP=4 decode group's flat INA (fp16 lanes) beats the ring and keeps a window of ceil(12.5e9
B/s x 4 us / 128 B) = 391 slots."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.costmodel.netparams import NetParams
from controller.models import model_spec
from controller.plan import SlotRange
from controller.planner import PlannerOptions, plan
from controller.planner.assemble import SlotPool as PlanSlots
from controller.service.slots import Allocation, SlotError
from controller.service.slots import SlotPool as ServiceSlots
from controller.service.store import Store
from controller.topology.generators import tracks
from controller.workload import chatbot, default_sla

WINDOW = math.ceil(12.5e9 * 2 * 2e-6 / 128)  # 391 slots


def _cluster(slots: int):
    g = tracks(8, 1, 1, 8, 2, name="one-unit")
    for _, d in g.nodes(data=True):
        if d["kind"] == "switch":
            d["aggregator_slots"] = slots
    return g


def test_planner_pool_takes_the_last_window_exactly():
    pool = PlanSlots(SimpleNamespace(g=_cluster(2 * WINDOW)))
    assert pool.take("u0-acc0", WINDOW) == SlotRange(0, WINDOW)
    assert pool.take("u0-acc0", WINDOW) == SlotRange(WINDOW, WINDOW)  # exactly one window left
    assert pool.take("u0-acc0", 1) is None
    rails = PlanSlots(SimpleNamespace(g=_cluster(2 * WINDOW)))
    assert rails.take_all([("u0-acc0", WINDOW), ("u0-acc0", WINDOW)]) == [
        SlotRange(0, WINDOW),
        SlotRange(WINDOW, WINDOW),
    ]
    assert rails.take_all([("u0-acc0", 1)]) is None


def test_plan_puts_the_ina_group_on_a_switch_of_exactly_one_window():
    """The plan's one TP=4 decode group wants INA at u0-acc0, which has exactly its window."""
    opts = PlannerOptions(net=NetParams(ina_lanes="fp16"))
    p = plan(_cluster(WINDOW), model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    ina = [gr for gr in p.prefill.groups + p.decode.groups if gr.scheme == "ina"]
    assert [(gr.switch, gr.slots) for gr in ina] == [("u0-acc0", SlotRange(0, WINDOW))]
    assert not any("fell back" in n for n in p.notes)


def test_service_pool_allocates_the_last_window_exactly(tmp_path: Path):
    pool = ServiceSlots(Store(tmp_path / "c.db"))
    pool.set_capacity("s1", 3 * WINDOW)
    assert pool.allocate("s1", "decode/0/0", WINDOW) == Allocation(0, WINDOW, "decode/0/0")
    assert pool.allocate("s1", "decode/0/1", WINDOW) == Allocation(WINDOW, WINDOW, "decode/0/1")
    # exactly one window left at the end of the pool
    last = pool.allocate("s1", "decode/1/0", WINDOW)
    assert last == Allocation(2 * WINDOW, WINDOW, "decode/1/0")
    with pytest.raises(SlotError, match="no 1 contiguous free slots"):
        pool.allocate("s1", "decode/1/1", 1)
    # exactly one window left in a hole between two ranges
    assert pool.free("s1", "decode/0/1")
    assert pool.allocate("s1", "decode/2/0", WINDOW) == Allocation(WINDOW, WINDOW, "decode/2/0")
    pool.check("s1")
