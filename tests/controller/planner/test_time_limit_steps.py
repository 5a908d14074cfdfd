"""The planner's time limit stops a search inside its steps, not only between them: a
settlement's bisection (``deployment.settle_kv``) and a decode phase's pricing under KV load
(``phases.contend_decode``) check it (``Problem.tick``), so that at 65,536 GPUs the step
between two checks is one rate or one decode instance, not a settlement of minutes.

The CPU clock is replaced by one that advances a second at every reading, so a limit of n
seconds stops the search at its n-th reading, the same on every machine; sweeping n stops
the testbed's search at every point it checks, and each stop must keep a valid plan whose H
relates to the full search's as the stop allows."""

from __future__ import annotations

import types

import pytest

import controller.planner.options as options
from controller.inputs.plan_checks import parse_plan
from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology import testbed
from controller.workload import chatbot, default_sla, summarization

UPPER = "H is an upper bound on what this deployment serves"


class _Clock:
    """A CPU clock that advances one second at each reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _plan(limit: float | None):
    model, w, sla = model_spec("OPT-66B"), chatbot(), default_sla("chatbot")
    return plan(testbed(), model, w, sla, PlannerOptions(time_limit_s=limit), started=0.0)


@pytest.fixture
def ticking(monkeypatch):  # noqa: ANN001, ANN201
    clock = _Clock()
    monkeypatch.setattr(options, "time", types.SimpleNamespace(process_time=clock))
    return clock


def test_every_stop_keeps_a_plan_bounded_as_its_step_allows(ticking):
    """Stopped at every reading of the clock in turn, the search keeps a valid plan:
    - before the second pass settles a deployment, the first pass's (H at or above the full
      search's, said to be an upper bound): the first stops, and only those;
    - inside the second pass's first settlement, once its bisection has served a rate, that
      rate (a lower bound), so the stops there give the bisection's rising rates: at least
      four below the settlement's own (without the check inside the settlement they would be
      upper-bound stops, and only the settled pairs' H would follow: two values here);
    - later, between pairs and splits, the best settled so far; never above the full H."""
    full = _plan(1e9)  # never reached; counts the readings of a whole search
    readings = int(ticking.t)
    top = full.predicted.rate
    assert not full.time_limit_reached and top == _plan(None).predicted.rate
    upper, rates = [], []
    for n in range(1, readings + 2):
        ticking.t = 0.0
        cut = _plan(float(n))
        assert parse_plan(cut.to_json()) == cut
        if any(x.endswith(UPPER) for x in cut.notes):
            assert cut.time_limit_reached and cut.predicted.rate >= top * (1 - 1e-9)
            upper.append(n)
        else:
            assert cut.predicted.rate <= top * (1 + 1e-9)
            rates.append((n, cut.time_limit_reached, cut.predicted.rate))
    assert upper == list(range(1, len(upper) + 1)) and upper  # a prefix of the stops
    assert [r for _, _, r in rates] == sorted(r for _, _, r in rates)  # a stop later keeps more
    assert rates[-1] == (readings + 1, False, top)  # past the last reading: the full search
    below = sorted({r for _, stopped, r in rates if stopped and r < top * (1 - 1e-6)})
    assert len(below) >= 4, below


def test_without_a_plan_in_hand_the_check_inside_a_step_goes_on(ticking):
    """``tick`` raises only with a plan in hand: before the first pass's first plan the
    search goes on to it (a time limit returns the best plan found, never none)."""
    model, w, sla = model_spec("OPT-66B"), chatbot(), default_sla("chatbot")
    problem = options.Problem(testbed(), model, w, sla, PlannerOptions(time_limit_s=0.5))
    problem.started = 0.0
    problem.tick()  # past the limit, no plan: goes on
    assert not problem.timed_out
    problem.plan_in_hand = True
    with pytest.raises(options.TimeLimitReached):
        problem.tick()
    assert problem.timed_out


def test_the_assembly_after_a_stop_is_not_cut_short(ticking):
    """A plan whose group finds no aggregator slots is settled again in the assembly
    (``assemble._settle_slots``); stopped by the limit, the search hands over its plan and
    that settlement runs to its end (before, it raised ``TimeLimitReached`` out of ``plan``)."""
    g = testbed()
    for _, d in g.nodes(data=True):
        if d.get("ina"):
            d["aggregator_slots"] = 0
    model, w, sla = model_spec("OPT-66B"), summarization(), default_sla("summarization")
    fell = "1 group(s) fell back to ring: aggregator slots exhausted"
    full = plan(g, model, w, sla, PlannerOptions(time_limit_s=1e9), started=0.0)
    assert fell in full.notes
    stopped = []
    for n in range(1, int(ticking.t) + 1):
        ticking.t = 0.0
        cut = plan(g, model, w, sla, PlannerOptions(time_limit_s=float(n)), started=0.0)
        assert fell in cut.notes
        assert parse_plan(cut.to_json()) == cut
        stopped += [n] if cut.time_limit_reached else []
    assert stopped[:3] == [1, 2, 3]
