"""The ablation's simulated column (``evaluation.ablation_sim``): one max-rate search per
deployment, the same figures as ``maxrate.search`` run alone, exactly 1.000x for a step
that changes nothing the simulator runs, and a reason in every cell it cannot simulate."""

from dataclasses import replace

import pytest

from controller.evaluation import maxrate
from controller.evaluation.ablation import Row
from controller.evaluation.ablation_sim import REL_TOL, SAME, Job, simulate
from controller.evaluation.deployment import deployment_key
from controller.evaluation.scenarios import scenario
from controller.evaluation.sweep import Runner
from controller.planner import plan

NAME = "testbed-summarization"
CHEAP = {"requests": 200}  # points of 200 requests: a second each, enough for the invariants


@pytest.fixture(scope="module")
def ds_plan():
    s = scenario(NAME)
    return plan(s.cluster(), s.model_spec(), s.load(), s.sla(), planner="distserve")


def _row(name, p):
    return Row(name, p.predicted.rate if p else None, None, None, None, p)


def test_descriptive_fields_and_a_ring_plans_label_do_not_change_the_deployment(ds_plan):
    """DistServe's plan is ring only: relabelled as another planner, with other notes and
    reasons, it is the same deployment; moving one GPU makes another."""
    assert all(g.scheme == "ring" for g in ds_plan.prefill.groups + ds_plan.decode.groups)
    groups = [replace(g, reason="another reason") for g in ds_plan.decode.groups]
    same = replace(
        ds_plan,
        planner="ds-switchml",
        notes=["other"],
        decode=replace(ds_plan.decode, groups=groups, comm_s=1.0),
    )
    assert deployment_key(same) == deployment_key(ds_plan)
    batch = replace(ds_plan, decode=replace(ds_plan.decode, batch_size=1))
    assert deployment_key(batch) != deployment_key(ds_plan)


def test_an_ina_plan_is_keyed_by_the_policy_it_is_priced_with(ds_plan):
    """A group aggregated in the network is priced on the routes its policy allows (NVLink
    relay or Ethernet only), so the same plan under two policies is two deployments."""
    g0 = replace(ds_plan.decode.groups[0], scheme="ina", switch="s1")
    ina = replace(ds_plan, decode=replace(ds_plan.decode, groups=[g0]))
    assert deployment_key(replace(ina, planner="ds-switchml")) != deployment_key(
        replace(ina, planner="heroserve")
    )
    assert deployment_key(replace(ina, planner="exhaustive")) == deployment_key(
        replace(ina, planner="heroserve")
    )  # both priced with NVLink relays allowed


def test_an_unchanged_step_is_exactly_one_and_shares_the_search(ds_plan):
    """Two rows of the same deployment (the second relabelled): one search, whose H is what
    ``maxrate.search`` finds for the plan alone (the mean over seeds, with their spread);
    the second row's simulated ratio is exactly 1, and says it is one deployment."""
    twin = replace(ds_plan, planner="ds-switchml", notes=["relabelled"])
    job = Job(NAME, [_row("distserve", ds_plan), _row("+ cross-server TP", twin)], [CHEAP] * 2)
    with Runner(1) as runner:
        cells = simulate([job], runner, max_requests=10_000)[0]
        searched = runner.done
    s = scenario(NAME, **CHEAP)
    d = ds_plan.to_dict()

    def point(key, rate, n, seed):
        return (NAME, CHEAP, key, d, rate, n, seed, {"online_scheduler": False})

    with Runner(1) as alone:
        guess = {"alone": ds_plan.predicted.rate}
        found = maxrate.search(alone, point, lambda k, r: s.requests_at(r), guess, 0.9, REL_TOL)
        want = found["alone"]
        assert searched == alone.done  # one search, not two
    sp = maxrate.spread(want)
    assert cells[0].rate == sp["mean"] > 0
    assert (cells[0].rate_min, cells[0].rate_max) == (sp["min"], sp["max"])
    assert cells[1].rate == cells[0].rate
    assert cells[1].vs_previous == 1.0 and cells[1].vs_distserve == 1.0
    assert cells[1].previous_verdict == cells[1].distserve_verdict == SAME
    assert cells[0].vs_previous is None and cells[0].vs_distserve == 1.0
    assert cells[0].why == cells[1].why == ""


def test_cells_that_cannot_run_say_why_and_nothing_is_simulated(ds_plan):
    """No plan; a point over the requests budget (200 requests a point, budget 199); a plan
    whose stage names a GPU its group does not: three reasons, no simulation run."""
    first = ds_plan.decode.instances[0]
    stages = [["nosuch", *first.stages[0][1:]], *first.stages[1:]]
    instances = [replace(first, stages=stages), *ds_plan.decode.instances[1:]]
    broken = replace(ds_plan, decode=replace(ds_plan.decode, instances=instances))
    rows = [_row("distserve", ds_plan), _row("none", None), _row("broken", broken)]
    with Runner(1) as runner:
        over = simulate([Job(NAME, rows[:2], [CHEAP] * 2)], runner, max_requests=199)[0]
        bad = simulate([Job(NAME, [rows[2]], [CHEAP])], runner, max_requests=10_000)[0]
        assert runner.done == 0
    assert over[0].rate is None
    assert over[0].why == ("not simulated: 200 requests a point at the predicted H, over the "
                           "budget of 199")  # fmt: skip
    assert over[1].rate is None and over[1].why == "no plan"
    assert bad[0].rate is None
    assert bad[0].why == ("does not load in the simulator: plan: decode.groups[0].gpus: must be "
                          "the GPUs of instance 0 stage 0")  # fmt: skip
    assert all(c.vs_previous is None for c in over + bad)
