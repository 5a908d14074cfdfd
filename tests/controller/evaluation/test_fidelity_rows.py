"""The fidelity report's scalability rows: a ratio is HeroServe's H over the baseline's,
marked where either plan is the best found within the planner's time limit."""

from dataclasses import replace

import pytest

from controller.evaluation.fidelity import LIMIT_MARK, Case, _case_rows, _plans, _ratio


@pytest.fixture(scope="module")
def testbed_plans():
    return _plans(Case("testbed-summarization"), "pipelined")


def test_a_ratio_is_the_two_plans_h(testbed_plans):
    hero, base = testbed_plans["heroserve"], testbed_plans["distserve"]
    want = hero.predicted.rate / base.predicted.rate
    assert _ratio(hero, base) == f"{want:.2f}x"
    assert _ratio(hero, None) == "-"


def test_a_plan_stopped_by_the_time_limit_marks_its_ratios(testbed_plans):
    hero, base = testbed_plans["heroserve"], testbed_plans["distserve"]
    cut = replace(base, time_limit_reached=True)
    assert _ratio(hero, cut).endswith(LIMIT_MARK)
    assert _ratio(replace(hero, time_limit_reached=True), base).endswith(LIMIT_MARK)
    assert not _ratio(hero, base).endswith(LIMIT_MARK)


def test_a_scenarios_rows_in_both_modes():
    rows, tpots = _case_rows(Case("testbed-chatbot"))
    assert [r.split(" | ")[1] for r in rows] == ["pipelined", "paper"]
    # TPOT rows: HeroServe against the paper's three baselines, pipelined mode only; on the
    # testbed they make one plan, so one row and one ratio column say so
    assert [t[1] for t in tpots] == ["distserve / ds-atp / ds-switchml (one plan)"]
    assert all(r.split(" | ")[4].endswith("x (one plan)") for r in rows)
    for _, _, t_base, t_hero, red in tpots:
        assert red == pytest.approx(1 - t_hero / t_base)


def test_the_simulated_row_reads_evaluate_summaries_hostile_or_old(tmp_path):
    """``heroserve evaluate``'s summary gives each planner's simulated rate and which plans one
    simulation served; a summary from before that field, or a broken one, is read as such."""
    import json

    from controller.evaluation.fidelity import _measured

    rows = [{"planner": "heroserve", "max_rate_per_gpu": 0.5, "max_rate": 8.0,
             "simulated_as": "heroserve"},
            {"planner": "distserve", "max_rate_per_gpu": 0.5, "max_rate": 8.0,
             "simulated_as": "heroserve"},
            {"planner": "distserve-paper", "max_rate_per_gpu": 0.25, "max_rate": 2.0,
             "simulated_as": "distserve-paper"}]  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"max_rate": rows}))
    rates, twins = _measured(tmp_path, "a")
    assert rates == {"heroserve": (0.5, 8.0), "distserve": (0.5, 8.0),
                     "distserve-paper": (0.25, 2.0)}  # fmt: skip
    assert twins == [["heroserve", "distserve"]]
    old = [{k: v for k, v in r.items() if k != "simulated_as"} for r in rows]
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"max_rate": old}))
    assert _measured(tmp_path, "a") == (rates, [])
    (tmp_path / "a" / "summary.json").write_text('{"max_rate": [1]}')
    assert _measured(tmp_path, "a") is None
    assert _measured(tmp_path, "missing") is None


def test_the_simulated_row_takes_total_rates_as_the_predicted_rows_take_h():
    """distserve-paper's plan leaves GPUs idle: 2 req/s in total on 8 GPUs against
    HeroServe's 8 on 16, so 4.00x (per GPU it would be 2.00x); a planner that did not run
    shows '-'."""
    from controller.evaluation.fidelity import _simulated_row

    row = _simulated_row("x", {"heroserve": (0.5, 8.0), "distserve": (0.5, 8.0),
                               "distserve-paper": (0.25, 2.0)})  # fmt: skip
    assert row == "| x | simulated | max 0.5 req/s/GPU | | 1.00x / - / - | 4.00x | | |"
    three = {"heroserve": (0.5, 8.0), "distserve-paper": (0.25, 2.0),
             **{b: (0.25, 4.0) for b in ("distserve", "ds-atp", "ds-switchml")}}  # fmt: skip
    assert "| | 2.00x (one plan) | 4.00x |" in _simulated_row("x", three)


def test_the_paper_baselines_offer_ina_to_every_group_and_plan_as_distserve(testbed_plans):
    """The paper integrates ATP and SwitchML into DistServe with no limit to groups spanning
    servers: inside a server INA is priced, and loses to the NVLink ring, so on the testbed
    the three baselines are one deployment and the report shows one column."""
    from controller.evaluation.fidelity import one_plan

    for b in ("ds-atp", "ds-switchml"):
        reasons = [g.reason for g in testbed_plans[b].decode.groups]
        assert all(r.startswith(("flat INA cannot beat", "ring ")) for r in reasons), reasons
    assert one_plan(testbed_plans)
    moved = dict(testbed_plans, **{"ds-atp": testbed_plans["heroserve"]})
    assert not one_plan(moved)
