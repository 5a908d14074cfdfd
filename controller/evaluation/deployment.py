"""What the simulator runs of a plan: two plans with the same ``deployment_key`` are one
deployment, and every simulation of one is a simulation of the other. Evaluations use it to
simulate such plans once: at 1,200 servers the baselines often deploy HeroServe's or
DistServe's plan, and one simulation point there costs about a CPU-minute.

Holds ``deployment_key`` and ``simulated_together``.
"""

from __future__ import annotations

import json
from typing import Any

from controller.plan import Plan
from controller.planner.reprice import policy_of

# What a plan records for people or as the planner's prediction, and the simulator never
# reads (controller/sim builds its model from the instances, groups, rails, paths, KV
# pairs, batch size, model, SLA and cost-model options): left out of the deployment key.
_PLAN_INFO = ("planner", "notes", "predicted", "idle", "time_limit_reached")
_PHASE_INFO = ("comm_s", "compute_s", "rate_per_instance")
_GROUP_INFO = ("reason", "allreduce_s", "ina_s", "ring_s", "hier_s")


def deployment_key(plan: Plan) -> str:
    """What the simulator runs of ``plan``, as a string: the plan less its predictions and
    notes, and, when a group aggregates in the network, the INA fields of the policy the
    simulator prices it with (a ring's routes do not depend on the policy; with the online
    scheduler off a stage always runs its plan's scheme)."""
    d = plan.to_dict()
    for k in _PLAN_INFO:
        d.pop(k, None)
    ina = False
    for role in ("prefill", "decode"):
        ph = d[role]
        for k in _PHASE_INFO:
            ph.pop(k, None)
        for inst in ph["instances"]:
            inst.pop("rate", None)
        for gr in ph["groups"]:
            for k in _GROUP_INFO:
                gr.pop(k, None)
            ina = ina or gr["scheme"] != "ring"
    for kv in d["kv_transfer"]:
        kv.pop("time_s", None)
    if ina:
        pol = policy_of(plan.planner)
        d["priced_as"] = [pol.ina, pol.ina_relay, pol.ina_cross_server_only]
    return json.dumps(d, sort_keys=True, default=str)


def simulated_together(max_rows: list[dict[str, Any]]) -> list[list[str]]:
    """The planners of ``max_rows`` (``summary.json``'s) that one simulation served, as lists
    of two or more; a row without ``simulated_as`` (a summary written before evaluate shared
    simulations) was simulated for its own planner."""
    same: dict[str, list[str]] = {}
    for r in max_rows:
        same.setdefault(str(r.get("simulated_as", r["planner"])), []).append(str(r["planner"]))
    return [v for v in same.values() if len(v) > 1]
