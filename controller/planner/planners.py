"""The planners of HeroServe's family (``controller.planner``'s docstring): each one's policy
and groupings (``PLANNERS``), the planners whose candidates a planner's contain
(``CONTAINS``), those whose search is not the common one (``SEARCHES``), the paper's
baselines (``BASELINES``), and :func:`plan`, the common interface. Every planner's name, the
seed papers' too, is listed once with its family in ``controller/cli/planners.py``."""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from controller.errors import InputError
from controller.models.specs import ModelSpec
from controller.plan import Plan
from controller.planner.assemble import build_plan
from controller.planner.baselines import DISTSERVE, DS_ATP, DS_SWITCHML, packed_grouper
from controller.planner.distserve_paper import DISTSERVE_PAPER
from controller.planner.distserve_paper import search as distserve_paper_search
from controller.planner.exhaustive import POLICY as EXHAUSTIVE
from controller.planner.exhaustive import exhaustive_grouper
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.heroserve import heroserve_grouper
from controller.planner.ladder import LADDER
from controller.planner.options import PlannerOptions, Policy, Problem
from controller.planner.search import search
from controller.workload.base import Workload
from controller.workload.sla import SLA

# Each planner: its policy (what it may use) and its groupings, every one priced for every
# candidate, the best kept. HeroServe also prices the baselines' packed grouping, so its
# candidates contain theirs (with more schemes and routes allowed on each group).
PLANNERS: dict[str, tuple[Policy, tuple[Callable, ...]]] = {
    "heroserve": (HEROSERVE, (heroserve_grouper, packed_grouper)),
    "distserve": (DISTSERVE, (packed_grouper,)),
    "ds-atp": (DS_ATP, (packed_grouper,)),
    "ds-switchml": (DS_SWITCHML, (packed_grouper,)),
    "exhaustive": (EXHAUSTIVE, (exhaustive_grouper,)),
    "distserve-paper": (DISTSERVE_PAPER, ()),
}
# The planners whose candidates a planner's contain, as (policy, groupings): on a cluster too
# large to price every role split, it prices the splits around their balance points too
# (``search.search``), so its H is never below theirs. HeroServe's contain the baselines' and
# every step of the ablation's ladder (``ladder.LADDER``): with the baselines' alone, the
# ladder's "+ hierarchical INA" step planned 8tracks-1200 summarization at 1,896.452 req/s and
# ``heroserve plan`` at 1,884.057.
CONTAINS: dict[str, tuple[tuple[Policy, tuple[Callable, ...]], ...]] = {
    "heroserve": (
        *(PLANNERS[n] for n in ("distserve", "ds-atp", "ds-switchml")),
        *((policy, groupers) for _, policy, groupers, _ in LADDER[1:-1]),
    )
}
# Planners whose search is not the common one (``search.search``).
SEARCHES: dict[str, Callable] = {"distserve-paper": distserve_paper_search}
# The paper's baselines in HeroServe's search space, then DistServe's own placement.
BASELINES = ["distserve", "ds-atp", "ds-switchml", "distserve-paper"]


def plan(
    cluster: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    options: PlannerOptions | None = None,
    planner: str = "heroserve",
    progress: Callable[[str], None] | None = None,
    started: float | None = None,
) -> Plan:
    """Plan a disaggregated deployment of ``model`` on ``cluster`` with the named planner;
    its time limit counts from ``started`` (a ``time.process_time`` reading: the caller's
    start, so the limit covers what the caller did before) or from now."""
    if planner not in PLANNERS:
        raise InputError(f"unknown planner {planner!r}; known: {', '.join(PLANNERS)}")
    policy, groupers = PLANNERS[planner]
    problem = Problem(cluster, model, workload, sla, options or PlannerOptions(), progress)
    if started is not None:
        problem.started = started
    if planner in SEARCHES:
        result = SEARCHES[planner](problem, policy, groupers)
    else:
        result = search(problem, policy, groupers, CONTAINS.get(planner, ()))
    return build_plan(result, planner, str(cluster.name), workload.name)
