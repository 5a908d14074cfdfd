"""Where HeroServe's advantage comes from: one thing switched at a time, from DistServe's
search to HeroServe's, each step planned and its H (Eq. 1) predicted.

The ladder is ``planner.ladder.LADDER`` (each step keeps every change above it), here
``STEPS``.

Two further rows change one input of the full planner instead: the INA lane format (16-bit
lanes, FPISA-style, against the int32 lanes the P4 program adds) and the role split (the
paper's fixed split of the testbed, where the cluster has one, against the planner's).

On a cluster with more role splits than ``max_splits``, each step also prices the splits
around the balance points of the steps above it (``search``'s ``contained``), so a step that
only adds options never lowers H; the last step, HeroServe's planner, prices those that
``heroserve plan`` prices (``planner.CONTAINS``: the baselines' and every step's), so its row
is that command's plan.

Every row keeps its plan, named for the simulator after the planner whose evaluator prices it
as the step's search did (``STEPS``' fourth field), so ``ablation_sim`` can simulate it.

Holds ``STEPS``, ``Row`` and ``ablation`` (one scenario's rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from controller.errors import InputError
from controller.models.specs import ModelSpec
from controller.plan import Plan
from controller.planner import CONTAINS
from controller.planner.assemble import build_plan
from controller.planner.ladder import LADDER
from controller.planner.options import PlannerOptions, Policy, Problem
from controller.planner.search import Grouper, search
from controller.workload.base import Workload
from controller.workload.sla import SLA

STEPS = LADDER


@dataclass(frozen=True)
class Row:
    """One step: its H (requests/s), GPUs used, and H over the previous row's and over
    DistServe's (None where a plan has no H); its plan (None: no plan meets the SLA)."""

    name: str
    rate: float | None
    gpus: int | None
    vs_previous: float | None
    vs_distserve: float | None
    plan: Plan | None = None


def _plan(
    g: nx.Graph,
    model: ModelSpec,
    w: Workload,
    sla: SLA,
    opts: PlannerOptions,
    step: tuple[str, Policy, Sequence[Grouper], str],
) -> Plan | None:
    """The step's plan, named after the planner the simulator prices it as. The steps above
    it are the planners its candidates contain (``search``'s ``contained``); the last step's
    are HeroServe's (``planner.CONTAINS``, those steps among them)."""
    _, policy, groupers, priced_as = step
    if step is STEPS[-1]:
        above: Sequence[tuple[Policy, Sequence[Grouper]]] = CONTAINS["heroserve"]
    else:
        above = [(p, gs) for _, p, gs, _ in STEPS[: STEPS.index(step)]] if step in STEPS else []
    try:
        result = search(Problem(g, model, w, sla, opts), policy, groupers, above)
    except InputError:  # no plan meets the SLA under this step's policy
        return None
    return build_plan(result, priced_as, str(g.name), w.name)


def _reference(i: int) -> int | None:
    """The row a row's ratio is taken against: the one above on the ladder, the full
    planner's for the rows after it (the other lanes, the paper's role split)."""
    if i == 0:
        return None
    return i - 1 if i < len(STEPS) else len(STEPS) - 1


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(rates: Sequence[float | None]) -> list[tuple[float | None, float | None]]:
    """(over the reference row's, over DistServe's) for every row's H; None where either
    side has none."""
    return [
        (_ratio(r, rates[ref]) if (ref := _reference(i)) is not None else None,
         _ratio(r, rates[0]))
        for i, r in enumerate(rates)
    ]  # fmt: skip


def ablation(
    g: nx.Graph,
    model: ModelSpec,
    w: Workload,
    sla: SLA,
    opts: PlannerOptions | None = None,
    fixed_roles: nx.Graph | None = None,
    say: Callable[[str], None] = lambda m: None,
) -> list[Row]:
    """The ladder's rows on one scenario (module docstring), then the lane-format row and,
    when ``fixed_roles`` (the same cluster with the paper's role split) is given, the
    role-split row; ratios of those two are against the full planner."""
    opts = opts or PlannerOptions()
    plans: list[tuple[str, Plan | None]] = []
    for step in STEPS:
        say(f"ablation: {step[0]}")
        plans.append((step[0], _plan(g, model, w, sla, opts, step)))
    other = "fp16" if opts.net.ina_lanes != "fp16" else "int32"
    lanes = replace(opts, net=replace(opts.net, ina_lanes=other))
    say(f"ablation: {other} lanes")
    plans.append((f"heroserve, {other} lanes", _plan(g, model, w, sla, lanes, STEPS[-1])))
    if fixed_roles is not None:
        say("ablation: the paper's role split")
        p = _plan(fixed_roles, model, w, sla, opts, STEPS[-1])
        plans.append(("heroserve, the paper's role split", p))
    rates = [p.predicted.rate if p is not None else None for _, p in plans]
    return [
        Row(name, rate, p.predicted.gpus_used if p is not None else None, *r, p)
        for (name, p), rate, r in zip(plans, rates, ratios(rates), strict=True)
    ]
