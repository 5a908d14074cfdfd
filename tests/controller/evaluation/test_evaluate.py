"""`heroserve evaluate`: one CSV row per planner with
max_rate_per_gpu, a PNG of attainment against rate, a note with the measured order; the sweep
runs on a process pool and on Ray (skipped without the optional extra)."""

import csv
import importlib.util
import math

import pytest

from controller.cli import main
from controller.evaluation.scenarios import SCENARIOS, scenario
from controller.evaluation.sweep import Bracket, Runner, max_rates

PLANNERS = ["heroserve", "distserve", "ds-atp", "ds-switchml", "distserve-paper"]


@pytest.mark.slow
def test_evaluate_testbed_chatbot_writes_csv_png_and_note(tmp_path, capsys):
    out = tmp_path / "tb"
    rc = main(["evaluate", "--scenario", "testbed-chatbot", "--out", str(out),
               "--requests", "300", "--workers", "2", "--quiet"])  # fmt: skip
    assert rc == 0
    with (out / "max_rate.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["planner"] for r in rows] == PLANNERS  # one row per planner
    for r in rows:
        assert float(r["max_rate_per_gpu"]) > 0
        assert float(r["attainment_at_max"]) >= 0.9
    png = (out / "attainment.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    names = ["attainment.csv", "latency.csv", "ina_throughput.csv", "latency.png"]
    names += ["ina_throughput.png", "notes.md", "summary.json", "plans/heroserve.json"]
    for name in names:
        assert (out / name).exists(), name
    note = (out / "notes.md").read_text()
    assert "Measured order" in note and "Paper's order" in note
    assert "reproduced" in note  # either reproduced or explained with numbers
    assert "1.53x" in note  # the paper's claim beside the measured ratio
    printed = capsys.readouterr().out
    assert "Measured order" in printed
    (line,) = [ln for ln in printed.splitlines() if ln.startswith(f"written to {out}/: ")]
    on_disk = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert sorted(line.split(": ", 1)[1].split()) == on_disk  # every file, and only those
    assert {"latency.svg", "ina_throughput.png", "summary.json"} <= set(on_disk)


def test_every_scenario_is_defined():
    assert set(SCENARIOS) == {
        "testbed-chatbot", "testbed-summarization", "2tracks-chatbot", "8tracks-chatbot",
        "2tracks-summarization", "8tracks-summarization",
    }  # fmt: skip
    s = scenario("2tracks-chatbot", servers=12)
    g = s.cluster()
    assert s.model == "OPT-175B" and s.sla().ttft_s == 4.0 and s.sla().tpot_s == 0.2
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu") == 96
    assert scenario("testbed-summarization").sla().ttft_s == 15.0


@pytest.mark.parametrize("args,needle", [
    (["--scenario", "nope"], "unknown scenario"),
    (["--scenario", "testbed-chatbot", "--workers", "0"], "must be positive"),
    (["--scenario", "testbed-chatbot", "--servers", "12"], "track scenarios only"),
    (["--scenario", "2tracks-chatbot", "--servers", "7"], "multiple of 6"),
    (["--scenario", "testbed-chatbot", "--planners", "magic"], "unknown planner"),
])  # fmt: skip
def test_evaluate_bad_input_one_line_exit_2(capsys, args, needle):
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


class _Curve:
    """A fake runner: attainment falls linearly from 1 at rate 0 to 0 at rate ``2 * knee``,
    so the 90% point is at 0.2 * knee, whatever the search does."""

    def __init__(self, workers):
        self.workers = workers
        self.calls = 0

    def map(self, points, what=""):
        self.calls += 1
        return [{"attainment": max(0.0, 1.0 - r / (2.0 * k))} for k, r in points]


class _P(tuple):
    def __getitem__(self, i):
        return tuple.__getitem__(self, 1 if i == 4 else i)


@pytest.mark.parametrize("workers", [1, 4])
def test_max_rate_bisection_finds_the_90_percent_point(workers):
    knees = {"a": 10.0, "b": 3.0}
    br = max_rates(_Curve(workers), lambda p, r: _P((knees[p], r)), {"a": 1.0, "b": 50.0},
                   target=0.9, rel_tol=0.01)  # fmt: skip
    for p, k in knees.items():
        b: Bracket = br[p]
        assert b.lo <= 0.2 * k <= b.hi
        assert b.hi - b.lo <= 0.01 * b.hi + 1e-12


def test_process_pool_gives_the_same_points_as_one_process():
    from controller.evaluation.run import make_plans

    s = scenario("testbed-chatbot", planners=("heroserve",), requests=120)
    plans, _ = make_plans(s, lambda m: None)
    d = plans["heroserve"].to_dict()
    pts = [(s.name, {}, "heroserve", d, rate, 120, 0, {}) for rate in (1.0, 3.0)]
    with Runner(1) as one, Runner(2) as pool:
        a, b = one.map(pts), pool.map(pts)
    assert [x["attainment"] for x in a] == [x["attainment"] for x in b]
    assert [x["ttft_s"]["mean"] for x in a] == [x["ttft_s"]["mean"] for x in b]


def test_point_options_reach_the_simulator():
    """A point's options: ``keep_timeline`` is the sweep's (the KV timeline of Fig. 10 kept
    in the result), ``fast`` the simulator's (the same requests on the fast path: the same
    attainment and, on this plan at a light load, the same mean TTFT)."""
    from controller.evaluation.run import make_plans

    s = scenario("testbed-chatbot", planners=("heroserve",), requests=120)
    plans, _ = make_plans(s, lambda m: None)
    d = plans["heroserve"].to_dict()
    point = (s.name, {}, "heroserve", d, 1.0, 120, 0)
    kept, plain, fast = Runner(1).map(
        [(*point, {"keep_timeline": True}), (*point, {}), (*point, {"fast": True})]
    )
    assert len(kept["kv_timeline"]) > 10 and "kv_timeline" not in plain
    assert fast["attainment"] == plain["attainment"]
    assert fast["ttft_s"]["mean"] == pytest.approx(plain["ttft_s"]["mean"], rel=1e-9)
    assert fast["events"] != plain["events"]  # it did take the other path


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (optional extra heroserve[ray]; CI skips it)",
)
def test_ray_runner_matches_the_local_one():
    import ray

    from controller.evaluation.run import make_plans

    s = scenario("testbed-chatbot", planners=("heroserve",), requests=120)
    plans, _ = make_plans(s, lambda m: None)
    d = plans["heroserve"].to_dict()
    pts = [(s.name, {}, "heroserve", d, 2.0, 120, 0, {})]
    try:
        with Runner(ray_address="local") as r:
            got = r.map(pts)
    finally:
        ray.shutdown()
    want = Runner(1).map(pts)
    assert got[0]["attainment"] == want[0]["attainment"]
    assert math.isclose(got[0]["tpot_s"]["mean"], want[0]["tpot_s"]["mean"])


def test_requests_per_point_cover_thirty_request_lives():
    s = scenario("testbed-chatbot")
    life = s.load().mean_output * s.sla().tpot_s  # 336.3 tokens x 0.15 s = 50.4 s
    assert s.life_s() == pytest.approx(life) and life == pytest.approx(50.44, abs=0.01)
    assert s.requests_at(3.6) == math.ceil(3.6 * 30 * life) == 5449
    assert s.requests_at(1.0) == 2000  # 1513 requests arrive in 30 lives: the floor
    assert scenario("testbed-chatbot", requests=300).requests_at(10.0) == 300


def _testbed_plans(*names):
    from controller.evaluation.run import make_plans

    s = scenario("testbed-chatbot", planners=names, requests=120)
    return s, make_plans(s, lambda m: None)[0]


def test_plans_that_are_one_deployment_are_simulated_once():
    """Plans equal but for the planner's name, notes and groups' reasons and alternatives are
    one deployment; another batch or the online scheduler (which only HeroServe's points run)
    make a different one."""
    from dataclasses import replace

    from controller.evaluation.run import same_deployments

    _, plans = _testbed_plans("heroserve", "distserve")
    hero, ds = plans["heroserve"], plans["distserve"]
    assert hero.notes != ds.notes and hero.decode.groups[0].reason != ds.decode.groups[0].reason
    batch = replace(ds, planner="ds-atp", decode=replace(ds.decode, batch_size=7))
    given = {"heroserve": hero, "distserve": ds, "ds-atp": batch}
    assert same_deployments(given, online_scheduler=False) == {
        "heroserve": "heroserve", "distserve": "heroserve", "ds-atp": "ds-atp"}  # fmt: skip
    assert same_deployments(given, online_scheduler=True)["distserve"] == "distserve"


class _Recording(Runner):
    """A one-process runner that keeps the planner of every point it simulates."""

    def __init__(self):
        super().__init__(1)
        self.planners: list[str] = []

    def map(self, points, what=""):
        self.planners += [p[2] for p in points]
        return super().map(points, what)


@pytest.mark.slow
def test_evaluate_simulates_a_shared_deployment_once_and_reports_it_for_each(tmp_path):
    """On the testbed's chatbot HeroServe and DistServe deploy the same plan: every point is
    simulated for one of them, and both rows carry its figures."""
    from controller.evaluation.run import evaluate

    s = scenario("testbed-chatbot", planners=("heroserve", "distserve"), requests=150,
                 curve_points=2, fixed_rates_per_gpu=(0.1,))  # fmt: skip
    r = _Recording()
    summary = evaluate(s, tmp_path, r)
    assert set(r.planners) == {"heroserve"}  # distserve's plan was never simulated
    rows = {row["planner"]: row for row in summary["max_rate"]}
    assert rows["distserve"]["simulated_as"] == "heroserve"
    for k in ("max_rate", "attainment_at_max", "first_miss_rate_per_gpu"):
        assert rows["distserve"][k] == rows["heroserve"][k]
    with (tmp_path / "attainment.csv").open() as f:
        curve = list(csv.DictReader(f))
    assert [c["planner"] for c in curve] == ["heroserve", "distserve"] * 2
    assert "simulated once" in (tmp_path / "notes.md").read_text()
    on_disk = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file())
    assert summary["written"] == on_disk  # what the CLI lists is what is there
