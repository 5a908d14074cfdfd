"""``AllReducePricer.ina_bound`` from kept route sums is the bound as written, float for
float: the slowest member's cheapest route alone to the switch (``routes_to_switch``,
``path_time``) plus the aggregation and host overhead (the paper's mode: Eq. 8 as written on
those routes, twice the way up with no latency, plus T_agg), for every group of a small
2tracks cluster and each of its candidate switches, in both cost modes."""

from __future__ import annotations

import pytest

from controller.costmodel.ina import T_AGG_S, ina_pattern
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import written_time
from controller.models import model_spec
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import PlannerOptions, Problem
from controller.topology.generators import two_tracks
from controller.topology.graph import servers
from controller.workload import chatbot, default_sla


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_ina_bound_is_the_cheapest_route_alone(mode: str) -> None:
    g = two_tracks(12)
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    ev = Evaluator(
        Problem(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts), HEROSERVE
    )
    fab = ev.ina_fabric
    gpus = [x for s in servers(g).values() for x in s]
    # groups inside a server, across two servers of a unit, across units
    groups = [gpus[0:4], gpus[2:6], gpus[4:12], gpus[6:10], gpus[0:96:12], gpus[40:56:2]]
    checked = 0
    for nbytes in (0.0, 1e3, 2.4e7):
        for members in groups:
            for s in ev.ina_candidates(members):
                if mode == "paper":  # FP16 bytes, Eq. 10 alone: the bound is T_ina itself
                    worst = max(
                        min(written_time(fab, r, nbytes) for r in fab.routes_to_switch(m, s))
                        for m in members
                    )
                    assert ev.ina_bound(members, s, nbytes) == 2 * worst + T_AGG_S
                    # ...and exact: flat INA on each member's cheapest route alone
                    ina = ina_pattern(fab, members, s, nbytes, ev.net)
                    assert ina.time(fab, nbytes) == pytest.approx(2 * worst + T_AGG_S, rel=1e-12)
                    checked += 1
                    continue
                wire = nbytes * ev.net.ina_wire_ratio
                worst = max(
                    min(fab.path_time(r, wire) for r in fab.routes_to_switch(m, s)) for m in members
                )
                assert ev.ina_bound(members, s, nbytes) == worst + T_AGG_S + ev.net.ina_host_s
                checked += 1
    assert checked >= 30
