"""A plan against its cluster, before anything is exported from it.

A launch configuration built from a plan that does not match the cluster would start
engines on GPUs that are not there, on one GPU twice, or with a weight shard that does not
fit; so the exporter refuses such a plan, and the message names what is wrong.
"""

from __future__ import annotations

import networkx as nx

from controller.errors import InputError
from controller.inputs.plan_checks import check_dataplane_lanes, check_plan_on_topology
from controller.models import model_spec
from controller.plan import Plan
from controller.planner.options import PlannerOptions
from controller.units import GB


def instance_name(role: str, index: int) -> str:
    return f"{role}/{index}"


def check_plan(plan: Plan, g: nx.Graph) -> None:
    """Raise :class:`InputError` naming the first thing in ``plan`` that ``g`` contradicts.

    The plan's own consistency (each GPU used once, stages of the phase's TP and PP, groups
    matching their stages, paths starting at their member and reaching their switch, KV
    transfers from a prefill to a decode GPU) was checked when it was read
    (``controller.inputs.plan_checks.load_plan``); ``check_plan_on_topology`` checks it
    against the cluster as every
    command does (GPUs, roles, INA switches and their slots, every hop a link). What only a
    launch needs is added here: every GPU holds its weight shard (``r_frac`` of its memory,
    the plan's own ``options["r_frac"]`` or the planner's default), and the plan was priced
    for the INA lanes the switches aggregate (``check_dataplane_lanes``)."""
    check_plan_on_topology(plan, g)
    check_dataplane_lanes(plan)
    model = model_spec(plan.model)
    r_frac = float(plan.options.get("r_frac", PlannerOptions().r_frac))
    for phase in (plan.prefill, plan.decode):
        for i, inst in enumerate(phase.instances):
            name = instance_name(phase.role, i)
            shard = model.param_bytes / (len(inst.stages[0]) * len(inst.stages))
            for stage in inst.stages:
                for gpu in stage:
                    node = g.nodes[gpu]
                    room = node["memory_gb"] * GB * r_frac
                    if shard > room:
                        raise InputError(
                            f"{name}: GPU {gpu} ({node['gpu_type']}, {node['memory_gb']:g} GB) "
                            f"cannot hold its 1/{len(inst.stages[0]) * len(inst.stages)} weight "
                            f"shard: {shard / GB:.1f} GB > {room / GB:.1f} GB usable at r_frac "
                            f"{r_frac:g}"
                        )
