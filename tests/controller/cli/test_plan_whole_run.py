"""``heroserve plan``'s whole run: its time limit counts from the
command's start, not only the search's (a 65,536-GPU ``--planner-time-limit 20`` run took
203 CPU-s), and it refuses to write a plan every other command would refuse (a 65,536-GPU
plan is 77 MB; ``MAX_PLAN_BYTES`` is 64 MiB), in one line, exit 2, writing nothing."""

from __future__ import annotations

import json
import time

import pytest

import controller.cli.common as common
import controller.cli.plan as plan_cli
from controller.cli import main
from controller.inputs.limits import MAX_PLAN_BYTES


def _burn(cpu_s: float) -> None:
    t = time.process_time()
    while time.process_time() - t < cpu_s:
        pass


@pytest.fixture
def slow_inputs(monkeypatch):  # noqa: ANN001, ANN201
    """Reading the inputs takes 3 CPU-s (as the 65,536-GPU topology takes minutes)."""
    real = common.resolve_inputs

    def slow(*a, **k):  # noqa: ANN002, ANN003, ANN202
        _burn(3.0)
        return real(*a, **k)

    monkeypatch.setattr(common, "resolve_inputs", slow)


def test_the_time_limit_counts_the_inputs_before_the_search(tmp_path, slow_inputs, capsys):
    """Reading the inputs takes the whole limit here: the search starts past it and keeps
    its first plan, marked. Before, the limit started with the search, which on the testbed
    never reaches 3 CPU-s."""
    out = tmp_path / "p.json"
    argv = ["plan", "--planner", "heroserve", "--planner-time-limit", "3", "--json", str(out)]
    assert main(argv) == 0
    assert "heroserve (time limit)" in capsys.readouterr().out
    assert json.loads(out.read_text())["time_limit_reached"] is True


def test_baselines_not_started_by_the_limit_are_not_planned(tmp_path, slow_inputs, capsys):
    """With ``--planner all`` a limit spent before a baseline starts leaves it unplanned,
    said on its line: each would still plan to its first deployment (at 65,536 GPUs minutes
    each, four times over), so the limit would not cover the run."""
    out = tmp_path / "p.json"
    argv = ["plan", "--planner", "all", "--planner-time-limit", "3", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "heroserve (time limit)" in text
    for n in ("distserve", "ds-atp", "ds-switchml", "distserve-paper"):
        assert f"{n}: no plan (not planned: the time limit of 3 CPU-s came first)" in text
        assert not out.with_name(f"p.{n}.json").exists()
    assert json.loads(out.read_text())["time_limit_reached"] is True


def test_without_slow_inputs_the_same_limit_is_not_reached(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["plan", "--planner", "heroserve", "--planner-time-limit", "30", "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["time_limit_reached"] is False


def test_a_plan_above_the_limit_every_command_reads_is_not_written(tmp_path, monkeypatch, capsys):
    """The limit is what validate, export and the controller read; a plan of the testbed is
    made larger than it by a longer notes field (what 65,536 GPUs' paths do)."""
    from controller.plan import Plan

    real = Plan.to_json

    def big(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        d = json.loads(real(self, *a, **k))
        d["notes"] = [*d.get("notes", []), "x" * MAX_PLAN_BYTES]
        return json.dumps(d)

    monkeypatch.setattr(Plan, "to_json", big)
    out = tmp_path / "p.json"
    assert main(["plan", "--planner", "heroserve", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json: the heroserve plan is " in err[0]
    assert f"above the {MAX_PLAN_BYTES:,} every other command reads" in err[0]
    assert not out.exists()


def test_a_plan_at_the_limit_is_written(tmp_path):
    """The bound is inclusive: exactly MAX_PLAN_BYTES is what validate reads."""

    class P:
        def __init__(self, n: int) -> None:
            self.n = n

        def to_json(self) -> str:
            return "x" * (self.n - 1)

    assert len(plan_cli._plan_texts({"h": P(MAX_PLAN_BYTES)}, ["h"])["h"]) == MAX_PLAN_BYTES
