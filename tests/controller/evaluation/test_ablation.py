"""The ablation ladder of ``heroserve fidelity``: from DistServe's search to HeroServe's, one
change a step, its ends the two planners themselves."""

import random
from dataclasses import fields

import pytest

from controller.evaluation.ablation import STEPS, ablation, ratios
from controller.models import model_spec
from controller.planner import CONTAINS, PLANNERS, PlannerOptions, plan
from controller.topology import testbed as make_testbed
from controller.topology.synthetic import random_cluster
from controller.workload import chatbot, default_sla, summarization

# what each step switches, in Policy fields (the name aside)
CHANGES = [
    {"prefer_intra_server"},
    {"ina", "ina_cross_server_only"},  # INA offered to every group, as DS-SwitchML's
    {"ina_relay"},
    {"hier"},
    {"grouping", "colocated_layouts"},
]


def test_the_ladder_runs_from_distserve_to_heroserve_one_change_a_step():
    assert STEPS[0][1:3] == PLANNERS["distserve"]
    assert STEPS[-1][1:3] == PLANNERS["heroserve"]
    for (_, a, *_), (_, b, *_), want in zip(STEPS[:-1], STEPS[1:], CHANGES, strict=True):
        diff = {f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)}
        assert diff - {"name"} == want


def test_testbed_summarization_rows():
    """Its ends are the two planners' H, and the steps multiply to the ratio. On this
    scenario the search space alone (tensor groups across servers) carries the whole gap
    (DistServe 5.342 req/s, every later step the same H as HeroServe's): no INA scheme and
    no placement adds to it."""
    g, model, w = make_testbed(), model_spec("OPT-66B"), summarization()
    sla = default_sla("summarization")
    rows = ablation(g, model, w, sla, fixed_roles=make_testbed(fixed_roles=True))
    assert [r.name for r in rows][-2:] == ["heroserve, fp16 lanes",
                                           "heroserve, the paper's role split"]  # fmt: skip
    assert rows[0].rate == pytest.approx(plan(g, model, w, sla, planner="distserve").predicted.rate)
    assert rows[5].rate == pytest.approx(plan(g, model, w, sla).predicted.rate)
    assert rows[1].vs_previous > 1.1
    assert [r.vs_previous for r in rows[2:6]] == pytest.approx([1.0] * 4)
    product = 1.0
    for r in rows[1:6]:
        product *= r.vs_previous
    assert product == pytest.approx(rows[5].rate / rows[0].rate)
    for r in rows[1:6]:
        assert r.vs_distserve == pytest.approx(r.rate / rows[0].rate)


def test_each_step_is_simulated_with_a_policy_that_prices_it_as_the_step_did():
    """The simulator rebuilds a plan's evaluator from its planner's name: that planner's
    policy has the step's INA fields and allows hierarchical INA wherever the step does."""
    for name, policy, _, priced_as in STEPS:
        named = PLANNERS[priced_as][0]
        for f in ("ina", "ina_relay", "ina_cross_server_only"):
            assert getattr(named, f) == getattr(policy, f), (name, f)
        assert named.hier or not policy.hier, name


def test_ratios_against_the_row_above_then_the_full_planner():
    """Rates of the six ladder rows, then the lanes and role-split rows (against row 6)."""
    rates = [2.0, 3.0, None, 6.0, 6.0, 4.0, 5.0, 2.0]
    assert ratios(rates) == [
        (None, 1.0),
        (1.5, 1.5),
        (None, None),
        (None, 3.0),
        (1.0, 3.0),
        (4.0 / 6.0, 2.0),
        (1.25, 2.5),
        (0.5, 1.0),
    ]


@pytest.mark.parametrize("seed", [7, 12])
def test_a_step_never_lowers_h_where_splits_are_chosen_by_balance(seed):
    """With the role splits chosen around balance points (``max_splits`` 1, as on a cluster
    of hundreds of servers), each step prices the splits of the steps above it, so adding
    an option never lowers H. Without that, on these two random clusters "+ cross-server TP"
    (seed 7) and "+ placement" (seed 12) fell to 0.888x and 0.831x of the row above."""
    g = random_cluster(seed)
    rng = random.Random(seed)
    model = model_spec(rng.choice(["OPT-13B", "LLaMA-3-8B", "OPT-66B", "LLaMA-2-70B"]))
    wname = rng.choice(["chatbot", "summarization"])
    w = chatbot(n=4000) if wname == "chatbot" else summarization(n=4000)
    opts = PlannerOptions(max_splits=1)
    rows = ablation(g, model, w, default_sla(wname), opts)
    assert all(r.rate is not None for r in rows[:6])
    assert all(r.vs_previous >= 1 - 1e-9 for r in rows[1:6]), [r.vs_previous for r in rows]
    # the last row is ``heroserve plan``'s plan there too
    assert rows[5].rate == plan(g, model, w, default_sla(wname), opts).predicted.rate


def test_heroserve_plan_prices_the_balance_points_of_every_step():
    """``heroserve plan`` prices the role splits around the balance point of every step of
    the ladder (``CONTAINS``), as the ablation's last step does: with the baselines' alone,
    the "+ hierarchical INA" step planned 8tracks-1200 summarization at 1,896.452 req/s and
    ``heroserve plan`` at 1,884.057, below a step whose options its own contain."""
    for name, policy, groupers, _ in STEPS[:-1]:
        assert (policy, groupers) in CONTAINS["heroserve"], name
