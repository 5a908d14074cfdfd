"""Every planner the command line offers, listed once: HeroServe's family (HeroServe, the
paper's baselines, the exhaustive planner; disaggregated plans, ``controller.planner``) and the
seed papers' (Helix and its baselines, the cost-efficiency planner, the heterogeneous search;
colocated plans, ``controller.related``). ``plan``, ``compare`` and ``evaluate`` take their
names, help text and checks from :data:`REGISTRY`, and run a planner through
:meth:`Planner.plan`, one signature for both families; the planner's modules are imported
only then, so this module is light (the command line's help is built from it).

The families' own tables (``controller.planner.PLANNERS``: each planner's policy and
groupings; ``controller.related.RELATED`` and ``HELIX_BASELINES``: what ``plan_related``
dispatches on) are how each family plans, below this layer; tests/controller/cli/
test_planners.py checks that they hold exactly the names listed here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from controller.planner.options import PlannerOptions
from controller.related.options import RelatedOptions

if TYPE_CHECKING:
    import networkx as nx

    from controller.models.specs import ModelSpec
    from controller.plan import SLA, Plan
    from controller.workload.base import Workload

Family = Literal["heroserve", "seed"]


@dataclass(frozen=True)
class Options:
    """What a planner of either family is given: each family reads its own part."""

    planner: PlannerOptions = field(default_factory=PlannerOptions)
    related: RelatedOptions = field(default_factory=RelatedOptions)
    # the CPU clock (time.process_time) the time limit counts from: ``heroserve plan``'s
    # start, so the limit covers the whole run; None: each planner's own start
    started: float | None = None


@dataclass(frozen=True)
class Planner:
    name: str
    family: Family  # heroserve: disaggregated plans; seed: the seed papers', colocated
    summary: str  # a few words for the help text
    short: str  # what it optimises, in a table column (compare)
    optimises: str = ""  # what it optimises, a line (compare; a colocated plan says its own)
    in_all: bool = False  # one of ``heroserve plan --planner all``
    in_compare: bool = False  # one of ``heroserve compare``'s default planners

    def plan(
        self,
        cluster: nx.Graph,
        model: ModelSpec,
        workload: Workload,
        sla: SLA,
        options: Options | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Plan:
        """A plan by this planner (its family's modules are imported now)."""
        opts = options or Options()
        if self.family == "heroserve":
            from controller.planner import plan

            return plan(
                cluster, model, workload, sla, opts.planner, self.name, progress, opts.started
            )
        from controller.related import plan_related

        return plan_related(self.name, cluster, model, workload, sla, opts.related, progress)


_RATE = "SLA rate/GPU"
REGISTRY: dict[str, Planner] = {
    p.name: p
    for p in (
        Planner("heroserve", "heroserve", "HeroServe, Alg. 1 + 2", _RATE,
                "SLA-meeting rate per GPU (Eq. 1), disaggregated, INA or ring per group",
                in_all=True, in_compare=True),
        Planner("distserve", "heroserve", "baseline: NCCL ring, TP inside a server", _RATE,
                "SLA-meeting rate per GPU, disaggregated, NCCL ring, TP inside a server",
                in_all=True, in_compare=True),
        Planner("ds-atp", "heroserve", "baseline: distserve with ATP's INA", _RATE,
                "as distserve with ATP's best-effort INA over Ethernet",
                in_all=True, in_compare=True),
        Planner("ds-switchml", "heroserve", "baseline: distserve with SwitchML's INA", _RATE,
                "as distserve with SwitchML's synchronous INA over Ethernet",
                in_all=True, in_compare=True),
        Planner("exhaustive", "heroserve", "every grouping, small clusters", _RATE,
                "SLA-meeting rate per GPU over every grouping (small clusters)"),
        Planner("distserve-paper", "heroserve", "baseline: DistServe's own placement", "-",
                in_all=True),
        Planner("helix", "seed", "Helix: max flow, MILP placement", "max flow tok/s",
                in_compare=True),
        Planner("swarm", "seed", "Helix's baseline", "(baseline)"),
        Planner("helix-sp", "seed", "Helix's baseline: separate pipelines", "(baseline)"),
        Planner("helix-petals", "seed", "Helix's baseline", "(baseline)"),
        Planner("costeff", "seed", "cost efficiency: makespan under a budget",
                "makespan, budget", in_compare=True),
        Planner("hetero-search", "seed", "heterogeneous throughput search",
                "Alg. 1 tok/s", in_compare=True),
    )
}  # fmt: skip


def names(family: Family | None = None) -> list[str]:
    """The planners' names (of one family), in the registry's order."""
    return [n for n, p in REGISTRY.items() if family is None or p.family == family]


def planner(name: str) -> Planner:
    return REGISTRY[name]


def planner_list(family: Family | None = None) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated planner names (of ``family``), each known, at
    least one."""
    known = names(family)

    def parse(s: str) -> list[str]:
        out = [x.strip() for x in s.split(",") if x.strip()]
        if not out:
            raise argparse.ArgumentTypeError("name at least one planner")
        for n in out:
            if n not in known:
                raise argparse.ArgumentTypeError(
                    f"unknown planner {n!r}; known: {', '.join(known)}"
                )
        return out

    parse.__name__ = "planner list"
    return parse


def describe(family: Family | None = None) -> str:
    """``name: summary`` of every planner (of ``family``), for a help text."""
    return "; ".join(f"{n}: {REGISTRY[n].summary}" for n in names(family))
