"""A free-INA plan is a bound (``PlannerOptions.free_ina``): every all-reduce its policy may
aggregate in the network costs nothing, whatever the switches' aggregator slots. Assembling
it must not send groups back to the ring for want of slots, or the bound falls below the
plans it bounds."""

import pytest

from controller.evaluation.scenarios import scenario
from controller.planner import PLANNERS, PlannerOptions, Problem
from controller.planner.assemble import build_plan
from controller.planner.search import search


@pytest.mark.slow
def test_a_free_ina_plan_keeps_the_searchs_h_when_slots_run_short():
    """2tracks-1200 chatbot: the search finds 5,785.612 req/s with 116 prefill instances of
    TP 4 x PP 4 and 242 decode instances of TP 32; with the groups short of slots sent back
    to the ring, the plan kept 56 prefill instances and 2,771.900 req/s, 0.66x of the H of
    HeroServe's real plan (4,214.171)."""
    s = scenario("2tracks-chatbot", servers=1200)
    g, w = s.cluster(), s.load()
    problem = Problem(g, s.model_spec(), w, s.sla(), PlannerOptions(free_ina=True))
    result = search(problem, *PLANNERS["heroserve"])
    p = build_plan(result, "heroserve", str(g.name), w.name)
    assert p.predicted.rate == result.combination.rate
    assert len(p.prefill.instances) == result.combination.n_prefill
