"""DistServe's low-affinity layouts (``planner.colocated``): the search ranks the layouts by
the H their plan states, after the engines' admission (``ttft.checked_ttft``), so no layout
the options allow plans more than the layout the search keeps."""

from __future__ import annotations

import pytest

from controller.errors import InputError
from controller.evaluation.scenarios import scenario
from controller.planner import PlannerOptions, Problem, plan
from controller.planner.colocated import _nodes_by_type, unit_candidates


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_no_layout_plans_more_than_the_one_the_search_keeps(mode):
    # 2tracks at 12 servers: ranked by the closed form, the search kept PP 3 (H 7.08 req/s
    # after the check, pipelined) where PP 12 with TP 2 / TP 4 plans 16.68
    from controller.costmodel.netparams import NetParams

    s = scenario("2tracks-chatbot", servers=12, cores=4)
    g, model, load, sla = s.cluster(), s.model_spec(), s.load(), s.sla()
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    kept = plan(g, model, load, sla, opts, planner="distserve-paper")
    problem = Problem(g, model, load, sla, opts, None)
    forced = {}
    for nodes in _nodes_by_type(problem).values():
        size = min(len(n) for n in nodes)
        mem = min(g.nodes[x]["memory_gb"] for n in nodes for x in n)
        for pp, tp_p, tp_d in unit_candidates(problem, size, len(nodes), mem):
            one = PlannerOptions(
                net=NetParams(cost_mode=mode), prefill_par=(tp_p, pp), decode_par=(tp_d, pp)
            )
            try:
                forced[(pp, tp_p, tp_d)] = plan(g, model, load, sla, one, "distserve-paper")
            except InputError:
                continue  # no deployment of that layout meets the SLA
    assert len(forced) >= 3
    h = kept.predicted.rate
    assert all(p.predicted.rate <= h * (1 + 1e-9) for p in forced.values())
    shape = (kept.prefill.pp, kept.prefill.tp, kept.decode.tp)
    assert forced[shape].predicted.rate == pytest.approx(h, rel=1e-9)
