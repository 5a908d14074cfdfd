"""Pricing a plan that was already made: the :class:`Evaluator` that prices it as its planner
did (its model, SLA and cost-model options, with its planner's policy).

The simulator (``controller/sim/model.py``) and the controller's policy pricing
(``controller/service``) both re-price plans read from files; this is the one place that
says how.

Holds ``evaluator_for_plan``, ``policy_of`` (the policy a plan's planner name stands for) and
``decided_bytes`` (the message a phase's groups were decided at).
"""

from __future__ import annotations

import networkx as nx

from controller.costmodel.netparams import NetParams
from controller.errors import InputError
from controller.models import model_spec
from controller.plan import Plan
from controller.planner import PLANNERS
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE_POLICY
from controller.planner.options import PlannerOptions, Policy, Problem, ProfileCompute
from controller.workload import Workload


def policy_of(planner: str) -> Policy:
    """The search policy of ``planner``; plans of the other planners (the seed papers',
    hand-made ones) are priced with every option allowed, as HeroServe's are."""
    if planner in PLANNERS:
        return PLANNERS[planner][0]
    return HEROSERVE_POLICY


def evaluator_for_plan(
    plan: Plan, cluster: nx.Graph, workload: Workload, compute: ProfileCompute | None = None
) -> Evaluator:
    """The evaluator that prices ``plan`` on ``cluster`` under ``workload`` exactly as the
    plan was priced: its model, SLA and the cost-model options recorded in the plan, and each
    of its groups with the all-reduce scheme the plan chose for it (``price_as_planned``).

    ``compute``: the engine profile's fitted coefficients and its sha256
    (``PlannerOptions.compute``), which must be the profile the plan records, if any (the
    simulator passes it always: a plan priced with a profile is simulated with it); None
    (the controller's pricing, whose tables are the network's): the datasheets', unchecked.

    Raises :class:`controller.errors.InputError` when the plan's model is unknown or the
    profile is not the one the plan was priced with."""
    net = NetParams.from_plan_options(plan.options)
    recorded = plan.options.get("compute_profile", "")
    if compute is None:
        compute = ((), "")
    elif recorded != compute[1]:
        raise InputError(
            "the plan was priced with an engine profile: pass the same --profile"
            if recorded and not compute[1]
            else "this profile is not the one the plan was priced with"
            if recorded
            else "the plan was priced from datasheets, not from a profile: drop --profile or "
            "plan again with it"
        )
    opts = PlannerOptions(net=net, compute=compute[0], compute_source=compute[1])
    problem = Problem(cluster, model_spec(plan.model), workload, plan.sla, opts)
    ev = Evaluator(problem, policy_of(plan.planner))
    # each group runs the scheme the plan chose, decided at the phase's message: its routes
    # are chosen there, as the planner did
    for phase in (plan.prefill, plan.decode):
        ref = decided_bytes(ev, plan, phase.role)
        for gr in phase.groups:
            ev.price_as_planned(gr, ref)
    return ev


def decided_bytes(ev: Evaluator, plan: Plan, role: str) -> float:
    """The all-reduce message at which the plan's groups of ``role`` were decided (their
    scheme and routes): a prompt of the workload's mean length for prefill, the plan's batch
    for decode."""
    if role == "prefill":
        return ev.prefill_bytes()
    return ev.activation_bytes(max(1, plan.decode.batch_size))
