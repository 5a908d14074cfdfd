"""``heroserve plan --planner helix|costeff|hetero-search``, ``heroserve simulate`` of their
colocated plans and ``heroserve compare`` as a user runs them on the testbed, and bad input
(one line, exit 2, no traceback)."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.inputs.plan_checks import load_plan
from controller.models import model_spec


@pytest.mark.parametrize(
    ("planner", "extra"),
    [
        ("helix", ["--time-limit", "2"]),
        ("costeff", ["--budget", "14"]),
        ("hetero-search", ["--model", "OPT-13B"]),
    ],
)
def test_plan_writes_a_colocated_plan_that_loads_and_simulates(tmp_path, capsys, planner, extra):
    out = tmp_path / "plan.json"
    assert main(["plan", "--quiet", "--planner", planner, "--json", str(out), *extra]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{planner} plan: topology testbed")
    assert "optimises" in text
    plan = load_plan(out)  # checked by the schema derived from the dataclasses
    assert plan.layout == "colocated" and plan.colocated is not None
    assert plan.prefill.instances == [] and plan.decode.instances == []
    gpus = plan.all_gpus()
    assert len(gpus) == len(set(gpus)) == plan.predicted.gpus_used > 0
    assert plan.predicted.rate > 0
    res = tmp_path / "sim.json"
    args = ["simulate", "--plan", str(out), "--rate", "0.5", "--requests", "20"]
    assert main([*args, "--json", str(res)]) == 0
    r = json.loads(res.read_text())
    assert r["finished"] == r["requests"] == 20
    assert r["gpus_used"] == plan.predicted.gpus_used


def test_compare_lists_every_planner_and_what_it_optimised(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["compare", "--quiet", "--no-sim", "--time-limit", "2", "--json", str(out),
            "--planners", "heroserve,distserve,helix,costeff,hetero-search"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    rows = {r["planner"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"heroserve", "distserve", "helix", "costeff", "hetero-search"}
    # OPT-66B fits no single testbed machine: the paper's instances stay inside one
    assert "one machine" in rows["hetero-search"]["error"]
    assert "hetero-search: no plan" in text
    assert rows["heroserve"]["layout"] == "disaggregated"
    assert rows["helix"]["layout"] == rows["costeff"]["layout"] == "colocated"
    assert "max flow" in rows["helix"]["optimises"]
    assert "budget" in rows["costeff"]["optimises"]
    for name in ("heroserve", "helix", "costeff"):
        assert f"{name} optimises: " in text
        assert rows[name]["gpus"] > 0 and rows[name]["predicted_rate"] > 0


def test_compare_simulates_a_colocated_plan(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["compare", "--quiet", "--planners", "costeff", "--steps", "2", "--requests", "40",
            "--lives", "1", "--max-requests", "60", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    (row,) = json.loads(out.read_text())
    assert row["simulated_rate"] > 0
    assert row["attainment"] >= 0.9  # the SLA's share at the rate it reports
    assert row["simulated_rate_per_gpu"] == pytest.approx(row["simulated_rate"] / row["gpus"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--planner", "costeff", "--budget", "1"], "no configuration within the budget"),
        (["plan", "--planner", "hetero-search"], "holds OPT-66B with room for one longest"),
        (["plan", "--planner", "helix", "--topology", "{t4}"], "larger than the memory"),
        (["plan", "--planner", "costeff", "--topology", "{t4}"], "no configuration of t4's GPUs"),
        (["plan", "--planner", "costeff", "--price", "V100"], "is not TYPE=USD_PER_HOUR"),
        (["plan", "--planner", "helix", "--time-limit", "0"], "--time-limit: must be positive"),
        (["plan", "--planner", "helix", "--prune-degree", "-1"], "--prune-degree: must be"),
        (["compare", "--planners", "magic"], "unknown planner 'magic'"),
        (["compare", "--sla-tpot", "nan"], "--sla-tpot: must be a finite number"),
        (["compare", "--steps", "0"], "--steps: must be positive"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    t4 = tmp_path / "t4.yaml"  # 2 x 16 GB for OPT-66B's 132 GB of weights
    t4.write_text(
        "servers:\n  - {id: a, gpu_type: T4, gpus: 2}\nswitches:\n  - {id: sw, tier: access}\n"
        "links:\n  - {a: a-gpu0, b: sw, gbps: 100}\n  - {a: a-gpu1, b: sw, gbps: 100}\n"
    )
    args = [str(t4) if x == "{t4}" else x for x in args]
    assert main([*args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_an_overloaded_point_stops_once_the_target_is_out_of_reach(tmp_path):
    """compare's early stop: at 3x the plan's rate (TPOT bound 80 ms, about the light-load
    TPOT) so many requests miss that the run can stop early; its attainment and the full
    run's are both below the 90% target, and at a light load the option changes nothing."""
    from controller.related import plan_related
    from controller.related.colocated import ColocatedOptions, simulate_colocated
    from controller.related.common import RelatedOptions
    from controller.sim import make_requests
    from controller.topology import testbed
    from controller.workload import SLA, chatbot

    g, w = testbed(), chatbot(n=1000)
    plan = plan_related("costeff", g, model_spec("OPT-66B"), w, SLA(0.5, 0.08),
                        RelatedOptions(time_limit_s=5))  # fmt: skip
    n, stop = 300, 300 - 270 + 1
    heavy = make_requests(w, 3 * plan.predicted.rate, n, 0)
    full = simulate_colocated(plan, g, w, heavy)
    cut = simulate_colocated(plan, g, w, heavy, ColocatedOptions(stop_misses=stop))
    assert full.attainment < 0.9 and cut.attainment < 0.9
    assert cut.events < full.events and cut.finished < n
    light = make_requests(w, 0.1 * plan.predicted.rate, 30, 0)
    a = simulate_colocated(plan, g, w, light)
    b = simulate_colocated(plan, g, w, light, ColocatedOptions(stop_misses=1))
    assert a.attainment == b.attainment == 1.0 and a.events == b.events
