"""Pricing a plan that was already made: the :class:`Evaluator` that prices it as its planner
did (its model, SLA and cost-model options, with its planner's policy).

The simulator (``controller/sim/model.py``) and the controller's policy pricing
(``controller/service``) both re-price plans read from files; this is the one place that
says how.

Holds ``evaluator_for_plan`` and ``policy_of`` (the policy a plan's planner name stands for).
"""

from __future__ import annotations

import networkx as nx

from controller.costmodel.netparams import NetParams
from controller.models import model_spec
from controller.plan import Plan
from controller.planner import PLANNERS
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE_POLICY
from controller.planner.options import PlannerOptions, Policy, Problem
from controller.workload import Workload


def policy_of(planner: str) -> Policy:
    """The search policy of ``planner``; plans of the other planners (the seed papers',
    hand-made ones) are priced with every option allowed, as HeroServe's are."""
    if planner in PLANNERS:
        return PLANNERS[planner][0]
    return HEROSERVE_POLICY


def evaluator_for_plan(plan: Plan, cluster: nx.Graph, workload: Workload) -> Evaluator:
    """The evaluator that prices ``plan`` on ``cluster`` under ``workload`` exactly as the
    plan was priced: its model, SLA and the cost-model options recorded in the plan.

    Raises :class:`controller.errors.InputError` when the plan's model is unknown."""
    net = NetParams.from_plan_options(plan.options)
    problem = Problem(cluster, model_spec(plan.model), workload, plan.sla, PlannerOptions(net=net))
    return Evaluator(problem, policy_of(plan.planner))
