"""The ablation's simulated column: each step's plan (``evaluation.ablation``) simulated at
rising rates until its SLA attainment falls below the SLA's share, by the rule of
``evaluation.maxrate`` (a verdict per point only when the second half of the run clears the
target with 95% confidence and without drift, more requests until it does; three seeds),
so a step's simulated H stands beside its predicted one with its spread over seeds, and each
simulated ratio with its interval and verdict (a gain only when the interval excludes 1).

Steps whose plans are the same deployment (``deployment.deployment_key``) share one search,
so a step that changes nothing the simulator runs has a simulated ratio of exactly 1. A step
is not simulated, and its cell says why, when it has no plan, when its plan does not load in the
simulator, or when a point at its predicted H would run more requests than the budget.

Holds ``SEEDS``, ``REL_TOL``, ``SAME``, ``SimCell``, ``Job``, ``ablation_problem`` and
``simulate``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from controller.errors import InputError
from controller.evaluation import maxrate
from controller.evaluation.ablation import Row, _reference
from controller.evaluation.deployment import deployment_key
from controller.evaluation.scenarios import scenario
from controller.evaluation.sweep import Point, Runner, _model_for
from controller.inputs.limits import MAX_LIST, MAX_OPTION_ITEMS
from controller.inputs.plan_checks import dataclass_spec, validate_plan_dict
from controller.inputs.schema import (
    Key,
    ListOf,
    Nullable,
    PlainData,
    Record,
    SchemaError,
    Spec,
    Str,
)
from controller.plan import Plan

SEEDS = maxrate.SEEDS
REL_TOL = 0.02  # the bisection's stopping width; each seed's [lo, hi] enters the ratio intervals
SAME = "same deployment"  # a ratio of one search to itself: exactly 1


@dataclass(frozen=True)
class SimCell:
    """One row's simulated H (the largest total rate meeting the SLA's attainment, req/s: the
    mean over seeds, with their minimum and maximum), or why it was not simulated; the
    ratios as the predicted ones are taken (``ablation.ratios``), each with its interval and
    verdict (``maxrate.compare``; ``SAME`` for two rows of one deployment)."""

    rate: float | None
    why: str = ""
    vs_previous: float | None = None
    vs_distserve: float | None = None
    rate_min: float | None = None
    rate_max: float | None = None
    previous_ci: tuple[float, float] | None = None
    distserve_ci: tuple[float, float] | None = None
    previous_verdict: str = ""
    distserve_verdict: str = ""
    capped: int = 0  # points undecided at the request cap, counted as misses


@dataclass(frozen=True)
class Job:
    """One scenario's ablation rows and, per row, the scenario overrides that rebuild the
    cluster its plan was made on (``scenarios.scenario``)."""

    scenario: str
    rows: Sequence[Row]
    overrides: Sequence[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON data (plans as their plan documents), for the runner's journal."""
        rows = [{**{f.name: getattr(r, f.name) for f in fields(Row) if f.name != "plan"},
                 "plan": r.plan.to_dict() if r.plan is not None else None}
                for r in self.rows]  # fmt: skip
        return {"scenario": self.scenario, "rows": rows, "overrides": list(self.overrides)}

    @classmethod
    def from_dict(cls, d: Any, source: str) -> Job:
        """The job ``to_dict`` gave, checked as hostile input (``source`` names where it was
        read, for the one-line InputError): rows by the schema of their dataclass, plans as
        ``heroserve`` checks a plan file."""
        try:
            return _JOB.check(d)
        except SchemaError as e:
            raise InputError(f"{source}: {e}") from None


def ablation_problem(d: Any) -> str | None:
    """The first problem of ``d`` as an ablation job's document (what ``Job.from_dict``
    refuses), or None: the journal's check of a row read back (``sweep.Runner.call``)."""
    try:
        Job.from_dict(d, "the row")
    except InputError as e:
        return str(e)
    return None


class _PlanDocument(Spec):
    """A plan document, checked as ``heroserve`` checks a plan file."""

    what = "a plan"

    def check(self, value: Any) -> Plan:
        try:
            return validate_plan_dict(value, "the plan")
        except InputError as e:
            raise SchemaError(str(e)) from None


# A journal's job document (``Job.to_dict``).
_ROW = Record(
    {**dataclass_spec(Row).keys, "plan": Key(Nullable(_PlanDocument()))},
    build=lambda d: Row(**d),
    what="a mapping (an ablation row)",
)
_JOB = Record(
    {
        "scenario": Key(Str(min_len=1), required=True),
        "rows": Key(ListOf(_ROW, MAX_LIST), required=True),
        "overrides": Key(ListOf(PlainData(MAX_OPTION_ITEMS), MAX_LIST), required=True),
    },
    build=lambda d: Job(**d),
    what="a mapping (an ablation job)",
)


def simulate(
    jobs: Sequence[Job],
    runner: Runner,
    max_requests: int,
    say: Callable[[str], None] = lambda m: None,
) -> list[list[SimCell]]:
    """The simulated cells of every job's rows: one max-rate search per distinct deployment,
    all of them in one sweep (``max_rates`` runs every plan's bracket at once, so the
    runner's workers stay busy)."""
    why: dict[tuple[int, int], str] = {}
    owner: dict[tuple[int, int], str] = {}  # row -> sweep key of its deployment
    todo: dict[str, tuple[str, dict, dict, float, float]] = {}  # key -> point parts
    for j, job in enumerate(jobs):
        for i, row in enumerate(job.rows):
            over = job.overrides[i] if i < len(job.overrides) else {}
            p = row.plan
            if p is None:
                why[j, i] = "no plan"
                continue
            # one key per deployment on one cluster: the rows that share it share a search,
            # and the sweep's worker cache, keyed by (scenario, overrides, key), never hands
            # a later call in the same process the model of another plan
            dep = json.dumps([job.scenario, sorted(over.items()), deployment_key(p)])
            key = f"{job.scenario}/{hashlib.sha256(dep.encode()).hexdigest()[:16]}"
            if key in todo:
                owner[j, i] = key
                continue
            s = scenario(job.scenario, **over)
            n = s.requests_at(p.predicted.rate)
            if n > max_requests:
                why[j, i] = (f"not simulated: {n:,} requests a point at the predicted H, over "
                             f"the budget of {max_requests:,}")  # fmt: skip
                continue
            d = p.to_dict()
            try:  # as a sweep worker loads it (and kept in its cache when workers = 1)
                _model_for(job.scenario, over, key, d)
            except InputError as e:
                why[j, i] = f"does not load in the simulator: {e}"
                continue
            owner[j, i] = key
            todo[key] = (job.scenario, over, d, p.predicted.rate, s.sla().attainment)
    found: dict[str, maxrate.Rates] = {}
    for target in sorted({t[4] for t in todo.values()}):
        keys = [k for k, t in todo.items() if t[4] == target]
        say(f"ablation: max rates of {len(keys)} deployment(s) at {target:.0%} attainment, "
            f"seeds {', '.join(map(str, SEEDS))}")  # fmt: skip

        def point(key: str, rate: float, n: int, seed: int) -> Point:
            name, over, d, _, _ = todo[key]
            return (name, over, key, d, rate, n, seed, {"online_scheduler": False})

        def base(key: str, rate: float) -> int:
            name, over = todo[key][0], todo[key][1]
            return scenario(name, **over).requests_at(rate)

        guesses = {k: todo[k][3] for k in keys}
        found.update(maxrate.search(runner, point, base, guesses, target, REL_TOL, SEEDS))
    return [_cell(owner, found, why, j, len(job.rows)) for j, job in enumerate(jobs)]


def _cell(
    owner: dict[tuple[int, int], str],
    found: dict[str, maxrate.Rates],
    why: dict[tuple[int, int], str],
    j: int,
    rows: int,
) -> list[SimCell]:
    """Job ``j``'s cells: each row's spread and its ratios to its reference row and to
    DistServe's (row 0), with intervals and verdicts."""

    def ratio(i: int, ref: int | None):
        if ref is None or (j, i) not in owner or (j, ref) not in owner:
            return None, None, ""
        if owner[j, i] == owner[j, ref]:
            return 1.0, (1.0, 1.0), SAME
        c = maxrate.compare(found[owner[j, i]], found[owner[j, ref]])
        return c["ratio"], (c["low"], c["high"]), c["verdict"]

    out = []
    for i in range(rows):
        if (j, i) not in owner:
            out.append(SimCell(None, why.get((j, i), "")))
            continue
        r = found[owner[j, i]]
        sp = maxrate.spread(r)
        pv, pci, pverdict = ratio(i, _reference(i))
        dv, dci, dverdict = ratio(i, 0)
        out.append(SimCell(sp["mean"], "", pv, dv, sp["min"], sp["max"], pci, dci,
                           pverdict, dverdict, r.capped))  # fmt: skip
    return out
