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

Holds ``STEPS``, ``Row`` and ``ablation`` (one scenario's rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from controller.errors import InputError
from controller.models.specs import ModelSpec
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

# (row name, policy, groupings priced): DistServe's policy grown one switch at a time until
# it is HeroServe's (the last step's policy is HeroServe's own, checked by the tests)
STEPS: tuple[tuple[str, Policy, tuple[Grouper, ...]], ...] = (
    ("distserve", DISTSERVE, _PACKED),
    (_CROSS.name, _CROSS, _PACKED),
    (_FLAT.name, _FLAT, _PACKED),
    (_RELAY.name, _RELAY, _PACKED),
    (_HIER.name, _HIER, _PACKED),
    ("+ placement (heroserve)", HEROSERVE, (heroserve_grouper, packed_grouper)),
)


@dataclass(frozen=True)
class Row:
    """One step: its H (requests/s), GPUs used, and H over the previous row's and over
    DistServe's (None where a plan has no H)."""

    name: str
    rate: float | None
    gpus: int | None
    vs_previous: float | None
    vs_distserve: float | None


def _rate(
    g: nx.Graph,
    model: ModelSpec,
    w: Workload,
    sla: SLA,
    opts: PlannerOptions,
    policy: Policy,
    groupers: Sequence[Grouper],
) -> tuple[float | None, int | None]:
    try:
        comb = search(Problem(g, model, w, sla, opts), policy, groupers).combination
    except InputError:  # no plan meets the SLA under this step's policy
        return None, None
    return comb.rate, comb.gpus_used


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


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
    rows: list[Row] = []
    base = prev = None
    for name, policy, groupers in STEPS:
        say(f"ablation: {name}")
        rate, gpus = _rate(g, model, w, sla, opts, policy, groupers)
        base = rate if base is None else base
        rows.append(Row(name, rate, gpus, _ratio(rate, prev) if rows else None,
                        _ratio(rate, base)))  # fmt: skip
        prev = rate
    full = prev
    other = "fp16" if opts.net.ina_lanes != "fp16" else "int32"
    lanes = replace(opts, net=replace(opts.net, ina_lanes=other))
    say(f"ablation: {other} lanes")
    rate, gpus = _rate(g, model, w, sla, lanes, HEROSERVE, STEPS[-1][2])
    rows.append(Row(f"heroserve, {other} lanes", rate, gpus, _ratio(rate, full),
                    _ratio(rate, base)))  # fmt: skip
    if fixed_roles is not None:
        say("ablation: the paper's role split")
        rate, gpus = _rate(fixed_roles, model, w, sla, opts, HEROSERVE, STEPS[-1][2])
        rows.append(Row("heroserve, the paper's role split", rate, gpus, _ratio(rate, full),
                        _ratio(rate, base)))  # fmt: skip
    return rows
