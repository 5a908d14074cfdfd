"""The ablation's simulated column: each step's plan (``evaluation.ablation``) simulated at
rising rates until its SLA attainment falls below the SLA's share, with the search
``heroserve evaluate`` uses for its maximum rates (``sweep.max_rates``, the scenario's
requests per point), so a step's simulated H stands beside its predicted one.

Steps whose plans are the same deployment (``deployment.deployment_key``) share one search,
so a step that changes nothing the simulator runs has a simulated ratio of exactly 1. A step
is not simulated, and its cell says why, when it has no plan, when its plan does not load in the
simulator, or when a point at its predicted H would run more requests than the budget.

Holds ``SEED``, ``REL_TOL``, ``SimCell``, ``Job``, ``ablation_problem`` and ``simulate``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from controller.errors import InputError
from controller.evaluation.ablation import Row, ratios
from controller.evaluation.deployment import deployment_key
from controller.evaluation.scenarios import scenario
from controller.evaluation.sweep import Point, Runner, _model_for, max_rates
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

SEED = 0  # `heroserve evaluate`'s default seed
REL_TOL = 0.02  # the max-rate search's resolution (``max_rates``' default, as evaluate runs it)


@dataclass(frozen=True)
class SimCell:
    """One row's simulated H (the largest total rate meeting the SLA's attainment, req/s), or
    why it was not simulated; the ratios as the predicted ones are taken (``ratios``)."""

    rate: float | None
    why: str = ""
    vs_previous: float | None = None
    vs_distserve: float | None = None


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
    rates: dict[str, float] = {}
    for target in sorted({t[4] for t in todo.values()}):
        keys = [k for k, t in todo.items() if t[4] == target]
        say(f"ablation: max rates of {len(keys)} deployment(s) at {target:.0%} attainment")

        def point(key: str, rate: float) -> Point:
            name, over, d, _, _ = todo[key]
            n = scenario(name, **over).requests_at(rate)
            return (name, over, key, d, rate, n, SEED, {"online_scheduler": False})

        br = max_rates(runner, point, {k: todo[k][3] for k in keys}, target, REL_TOL)
        rates.update({k: b.lo for k, b in br.items()})
    out = []
    for j, job in enumerate(jobs):
        vals = [rates[owner[j, i]] if (j, i) in owner else None for i in range(len(job.rows))]
        cells = [
            SimCell(v, why.get((j, i), ""), *r)
            for i, (v, r) in enumerate(zip(vals, ratios(vals), strict=True))
        ]
        out.append(cells)
    return out
