"""Where HeroServe's advantage comes from: one thing switched at a time, from DistServe's
search to HeroServe's, each step planned and its H (Eq. 1) predicted.

The ladder (each step keeps every change above it):

1. ``distserve``: tensor groups inside a server where they fit, NCCL's ring only, groups
   packed by server (the baseline);
2. ``+ cross-server TP``: the search may also try tensor groups that span servers
   (HeroServe's candidates, still ring only);
3. ``+ flat INA``: SwitchML-style aggregation on a switch, Ethernet routes only, for groups
   that span servers (DS-SwitchML's scheme);
4. ``+ NVLink relay``: INA routes may relay over NVLink, and groups inside a server may
   aggregate in the network too;
5. ``+ hierarchical INA``: NVLink reduce-scatter, INA per rail, all-gather;
6. ``+ placement``: HeroServe's k-means grouping (Alg. 2) beside the packed one, and
   DistServe's low-affinity layouts: HeroServe as it plans.

Two further rows change one input of the full planner instead: the INA lane format (16-bit
lanes, FPISA-style, against the int32 lanes the P4 program adds) and the role split (the
paper's fixed split of the testbed, where the cluster has one, against the planner's).

On a cluster with more role splits than ``max_splits``, each step also prices the splits
around the balance points of the steps above it (``search``'s ``contained``), so a step that
only adds options never lowers H; there the last step prices more splits than
``heroserve plan`` does (the balance points of six planners against four).

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
from controller.planner.assemble import build_plan
from controller.planner.baselines import DISTSERVE, packed_grouper
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.heroserve import heroserve_grouper
from controller.planner.options import PlannerOptions, Policy, Problem
from controller.planner.search import Grouper, search
from controller.workload.base import Workload
from controller.workload.sla import SLA

_CROSS = replace(DISTSERVE, name="+ cross-server TP", prefer_intra_server=False)
_FLAT = replace(_CROSS, name="+ flat INA", ina="sync")
_RELAY = replace(_FLAT, name="+ NVLink relay", ina_relay=True, ina_cross_server_only=False)
_HIER = replace(_RELAY, name="+ hierarchical INA", hier=True)
_PACKED: tuple[Grouper, ...] = (packed_grouper,)

# (row name, policy, groupings priced, planner the simulator prices its plan as): DistServe's
# policy grown one switch at a time until it is HeroServe's (the last step's policy is
# HeroServe's own, checked by the tests). The simulator rebuilds a plan's evaluator from its
# planner's name (``planner.reprice.policy_of``); the named planner's policy has the step's
# INA fields (what the evaluator prices with: ``ina``, ``ina_relay``,
# ``ina_cross_server_only``) and allows hierarchical INA wherever the step does, so the plan
# is simulated as the step priced it (checked by the tests)
STEPS: tuple[tuple[str, Policy, tuple[Grouper, ...], str], ...] = (
    ("distserve", DISTSERVE, _PACKED, "distserve"),
    (_CROSS.name, _CROSS, _PACKED, "distserve"),
    (_FLAT.name, _FLAT, _PACKED, "ds-switchml"),
    (_RELAY.name, _RELAY, _PACKED, "heroserve"),
    (_HIER.name, _HIER, _PACKED, "heroserve"),
    ("+ placement (heroserve)", HEROSERVE, (heroserve_grouper, packed_grouper), "heroserve"),
)


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
    it are the planners its candidates contain (``search``'s ``contained``)."""
    _, policy, groupers, priced_as = step
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
