"""Offline planners (docs/design.md §6). Every planner returns a :class:`controller.plan.Plan`.

``plan(cluster, model, workload, sla, options, planner=...)`` is the common interface;
``PLANNERS`` lists the names: heroserve (Alg. 1 + 2), distserve, ds-atp, ds-switchml,
distserve-paper and exhaustive (small clusters only); ``CONTAINS`` the planners whose
candidates a planner's contain (for HeroServe, the ablation's ``ladder`` among them);
``SEARCHES`` the planners whose search is not the common one; ``BASELINES`` the paper's
baselines.

The package's modules: ``search`` (Alg. 1, the common search) with ``bounds``,
``deployment`` and ``roles``; ``evaluate`` (the ``Evaluator``, which prices placements) with
its parts ``context``, ``allreduce``, ``pipeline``, ``instances``, ``kvtransfer`` and
``phases``, and ``results`` and ``combine`` (Eq. 1); the groupings ``grouping``, ``heroserve``,
``baselines``, ``exhaustive``; ``colocated`` and ``distserve_paper`` (DistServe's own
placement); ``candidates``, ``options``, ``assemble`` (search result to plan) and
``reprice`` (a plan priced again); ``infeasible`` (why a search found no deployment);
``planners`` (the tables above and :func:`plan`).

The names here are imported when first used (PEP 562 ``__getattr__``): importing a light
module of the package (``controller.planner.options``, whose dataclass the command line
builds its flags from) does not import the searches (scipy, OR-Tools, k-means)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.planner.options import PlannerOptions, Problem
    from controller.planner.planners import BASELINES, CONTAINS, PLANNERS, SEARCHES, plan

_LAZY = {
    **dict.fromkeys(("BASELINES", "CONTAINS", "PLANNERS", "SEARCHES", "plan"), "planners"),
    **dict.fromkeys(("PlannerOptions", "Policy", "Problem"), "options"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BASELINES", "CONTAINS", "PLANNERS", "SEARCHES", "PlannerOptions", "Problem", "plan"]
