"""Journal rows read back are checked like every other input: a row of the
wrong type or with an impossible value (attainment outside [0, 1], a negative latency, NaN)
makes its job run again with one warning line, never a traceback, and never reaches the
result. The hostile values are the finding's: 7.0, null, [], 42, a missing key, a string."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.evaluation.ablation_sim import ablation_problem
from controller.evaluation.journal import Journal
from controller.evaluation.results import point_problem
from controller.evaluation.sweep import Runner
from controller.sim.metrics import SimResult, percentiles


def _result(x: int) -> dict[str, Any]:
    """A simulation point's result as ``sweep.run_point`` writes it (SimResult.to_dict, its
    per-request lists dropped, and the runner's keys)."""
    lat = percentiles(np.asarray([0.1, 0.2, 0.3]))
    r = SimResult(
        requests=10, finished=9, offered_rate=2.0, duration_s=5.0, gpus_used=8,
        sla={"ttft_s": 0.4, "tpot_s": 0.1}, attainment=0.9, ttft_s=lat, tpot_s=lat,
        e2e_s=lat, kv_transfer_s=percentiles(np.asarray([])), ina_throughput_Bps=1e9,
        allreduce_throughput_Bps=2e9, policy_use={"ina": 3}, peak_kv_bytes_per_gpu=1e9,
        peak_kv_fraction=0.5, kv_overflow_events=0, preemptions=0,
        ethernet_util={"mean": 0.1, "max": 0.2, "cv": 0.3},
        little={"L": 1.0}, wall_s=0.01, events=100, rerates=0, kv_timeline=[(0.0, 0.1)],
    )  # fmt: skip
    d = r.to_dict()
    d.update(planner="heroserve", rate=float(x), rate_per_gpu=x / 8)
    d["halves"] = [[4, 5, 0.8], [4, 5, math.inf]]  # sweep.halves: a request never finished
    return json.loads(json.dumps(d))


def _point(x: int) -> dict[str, Any]:
    with open(_LOG, "a") as f:  # noqa: PTH123 - one line per run, to count runs
        f.write(f"{x}\n")
    return _result(x)


_LOG = ""


def _tamper(path: Path, edit: Any) -> None:
    db = sqlite3.connect(path)
    (text,) = db.execute("SELECT result FROM job").fetchone()
    doc = json.loads(text)
    new = edit(doc)
    db.execute("UPDATE job SET result = ?", (json.dumps(new, allow_nan=True),))
    db.commit()
    db.close()


def _set(key: str, value: Any) -> Any:
    return lambda d: {**d, key: value}


def _sub(key: str, sub: str, value: Any) -> Any:
    return lambda d: {**d, key: {**d[key], sub: value}}


HOSTILE = {
    "attainment 7.0": _set("attainment", 7.0),
    "attainment -0.5": _set("attainment", -0.5),
    "attainment NaN": _set("attainment", math.nan),
    "attainment a string": _set("attainment", "0.9"),
    "attainment null": _set("attainment", None),
    "attainment true": _set("attainment", True),
    "negative latency": _sub("ttft_s", "mean", -1.0),
    "infinite latency": _sub("tpot_s", "p90", math.inf),
    "latency a string": _sub("e2e_s", "p99", "x"),
    "latencies a list": _set("ttft_s", []),
    "rate NaN": _set("rate", math.nan),
    "rate negative": _set("rate_per_gpu", -1.0),
    "requests a float": _set("requests", 10.5),
    "finished above requests": _set("finished", 11),
    "planner empty": _set("planner", ""),
    "no attainment": lambda d: {k: v for k, v in d.items() if k != "attainment"},
    "kv timeline of text": _set("kv_timeline", "abc"),
    "kv timeline bad pair": _set("kv_timeline", [[0.0]]),
    "no halves": lambda d: {k: v for k, v in d.items() if k != "halves"},
    "one half": _set("halves", [[4, 5, 0.8]]),
    "halves of text": _set("halves", "ab"),
    "half too short": _set("halves", [[4, 5], [4, 5, 0.8]]),
    "half met above requests": _set("halves", [[6, 5, 0.8], [4, 5, 0.8]]),
    "half met a float": _set("halves", [[4.5, 5, 0.8], [4, 5, 0.8]]),
    "half requests negative": _set("halves", [[0, -5, 0.8], [4, 5, 0.8]]),
    "half slack NaN": _set("halves", [[4, 5, math.nan], [4, 5, 0.8]]),
    "half slack negative": _set("halves", [[4, 5, -0.1], [4, 5, 0.8]]),
    "half slack text": _set("halves", [[4, 5, "1"], [4, 5, 0.8]]),
    "row null": lambda d: None,
    "row []": lambda d: [],
    "row 42": lambda d: 42,
    "row a string": lambda d: "result",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_row_runs_its_job_again_with_one_warning(tmp_path, name):
    global _LOG
    _LOG = str(tmp_path / "calls")
    path = tmp_path / "j.db"
    with Runner(1, journal=Journal(path)) as run:
        first = run.call(_point, [3], check=point_problem)
    assert point_problem(first[0]) is None  # the honest result passes
    _tamper(path, HOSTILE[name])
    warned: list[str] = []
    j = Journal(path, warn=warned.append)
    with Runner(1, journal=j) as run:
        again = run.call(_point, [3], check=point_problem)
    assert again == first  # run again, not the hostile value
    assert Path(_LOG).read_text().split() == ["3", "3"]
    assert (j.hits, j.refused, j.recorded) == (0, 1, 1)
    assert len(warned) == 1 and "\n" not in warned[0] and "running it again" in warned[0]
    # the job recorded anew is believed the next time
    j2 = Journal(path, warn=warned.append)
    with Runner(1, journal=j2) as run:
        assert run.call(_point, [3], check=point_problem) == first
    assert (j2.hits, j2.refused, len(warned)) == (1, 0, 1)


def test_nan_latency_is_what_the_simulator_writes_when_nothing_got_there():
    d = _result(1)
    assert math.isnan(d["kv_transfer_s"]["mean"]) and point_problem(d) is None


def test_an_infinite_slack_is_a_half_with_a_request_that_never_finished():
    """``sweep.halves`` writes an infinite slack where a request never finished: valid, and
    what ``maxrate.judge`` reads as a half that does not meet the SLA's bounds."""
    d = _result(1)
    assert math.isinf(d["halves"][1][2]) and point_problem(d) is None


def test_a_point_without_its_kv_timeline_is_what_a_sweep_keeps():
    """sweep.run_point drops the timeline unless the scenario plots it: such a row is valid
    (refusing it made every `fidelity` run again simulate every point its journal held)."""
    d = _result(1)
    del d["kv_timeline"]
    assert point_problem(d) is None
    del d["attainment"]
    assert point_problem(d) == "the result has no 'attainment'"


def test_the_map_of_simulation_points_checks_rows(monkeypatch, tmp_path):
    """``Runner.map`` (evaluate's and fidelity's sweeps) passes ``point_problem``."""
    seen: list[Any] = []
    import controller.evaluation.sweep as sweep

    monkeypatch.setattr(sweep, "point_problem", lambda d: seen.append(d) or "bad")
    j = Journal(tmp_path / "j.db", warn=lambda m: None)
    monkeypatch.setattr(sweep, "run_point", _point)
    global _LOG
    _LOG = str(tmp_path / "calls")
    with Runner(1, journal=j) as run:
        run.map([3])  # type: ignore[list-item]
        run.map([3])  # type: ignore[list-item]
    assert len(seen) == 1 and j.refused == 1


@pytest.mark.parametrize("doc", [None, [], 42, "x", {}, {"scenario": "testbed"}])
def test_an_ablation_row_of_the_wrong_shape_is_a_problem_not_a_traceback(doc):
    p = ablation_problem(doc)
    assert p is not None and "\n" not in p
