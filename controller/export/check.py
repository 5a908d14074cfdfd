"""A plan against its cluster, before anything is exported from it (issue 12).

A launch configuration built from a plan that does not match the cluster would start
engines on GPUs that are not there, on one GPU twice, or with a weight shard that does not
fit; so the exporter refuses such a plan, and the message names what is wrong.
"""

from __future__ import annotations

import networkx as nx

from controller.errors import InputError
from controller.models import model_spec
from controller.plan import Group, PhasePlan, Plan
from controller.planner.options import PlannerOptions
from controller.units import GB


def instance_name(role: str, index: int) -> str:
    return f"{role}/{index}"


def _kind(g: nx.Graph, node: str) -> str | None:
    return g.nodes[node].get("kind") if node in g else None


def _check_path(g: nx.Graph, path: list[str], start: str, what: str) -> None:
    if not path or path[0] != start:
        raise InputError(f"{what}: the path must start at {start}, got {path}")
    for a, b in zip(path, path[1:], strict=False):
        if a not in g or b not in g:
            missing = a if a not in g else b
            raise InputError(f"{what}: node {missing!r} of its path is not in topology {g.name}")
        if not g.has_edge(a, b):
            raise InputError(f"{what}: {a} - {b} on its path is not a link of topology {g.name}")


def _check_switch(g: nx.Graph, switch: str | None, what: str) -> None:
    if _kind(g, switch or "") != "switch":
        raise InputError(f"{what}: aggregation switch {switch!r} is not a switch of {g.name}")
    if not g.nodes[switch].get("ina"):
        raise InputError(f"{what}: switch {switch} cannot aggregate (ina: false in {g.name})")


def _check_group(g: nx.Graph, role: str, grp: Group, stage_gpus: list[str]) -> None:
    what = f"group {role}/{grp.instance}/{grp.stage}"
    if sorted(grp.gpus) != sorted(stage_gpus):
        raise InputError(f"{what}: its GPUs {grp.gpus} are not its stage's {stage_gpus}")
    if grp.scheme == "ina":
        _check_switch(g, grp.switch, what)
        for gpu in grp.gpus:
            path = grp.paths.get(gpu, [])
            _check_path(g, path, gpu, f"{what} member {gpu}")
            if grp.switch not in path:
                raise InputError(f"{what} member {gpu}: its path never reaches {grp.switch}")
    elif grp.scheme == "hier":
        if not grp.rails:
            raise InputError(f"{what}: hierarchical INA without rails")
        for k, rail in enumerate(grp.rails):
            rw = f"{what} rail {k}"
            _check_switch(g, rail.switch, rw)
            for m in rail.members:
                if m not in grp.gpus:
                    raise InputError(f"{rw}: member {m} is not in the group")
                _check_path(g, rail.paths.get(m, []), m, f"{rw} member {m}")
    elif grp.scheme == "ring":
        for gpu, path in grp.paths.items():
            _check_path(g, path, gpu, f"{what} member {gpu}")
    else:
        raise InputError(f"{what}: unknown scheme {grp.scheme!r}")


def _check_phase(
    g: nx.Graph, phase: PhasePlan, used: dict[str, str], shard_bytes: float, r_frac: float
) -> None:
    for i, inst in enumerate(phase.instances):
        name = instance_name(phase.role, i)
        if len(inst.stages) != phase.pp:
            raise InputError(f"{name}: {len(inst.stages)} stages, its phase's PP is {phase.pp}")
        for s, stage in enumerate(inst.stages):
            if len(stage) != phase.tp:
                raise InputError(
                    f"{name} stage {s}: {len(stage)} GPUs, its phase's TP is {phase.tp}"
                )
            for gpu in stage:
                kind = _kind(g, gpu)
                if kind is None:
                    raise InputError(f"{name}: GPU {gpu!r} is not in topology {g.name}")
                if kind != "gpu":
                    raise InputError(f"{name}: {gpu!r} is a {kind} in topology {g.name}, not a GPU")
                if gpu in used:
                    raise InputError(f"GPU {gpu} is used twice: by {used[gpu]} and by {name}")
                used[gpu] = name
                node = g.nodes[gpu]
                if node.get("role", "any") not in ("any", phase.role):
                    raise InputError(
                        f"{name}: GPU {gpu} is reserved for {node['role']} in topology {g.name}"
                    )
                room = node["memory_gb"] * GB * r_frac
                if shard_bytes > room:
                    raise InputError(
                        f"{name}: GPU {gpu} ({node['gpu_type']}, {node['memory_gb']:g} GB) cannot "
                        f"hold its 1/{phase.tp * phase.pp} weight shard: {shard_bytes / GB:.1f} GB "
                        f"> {room / GB:.1f} GB usable at r_frac {r_frac:g}"
                    )
    stage_of = {
        (i, s): st for i, inst in enumerate(phase.instances) for s, st in enumerate(inst.stages)
    }
    for grp in phase.groups:
        stage = stage_of.get((grp.instance, grp.stage))
        if stage is None:
            raise InputError(
                f"group {phase.role}/{grp.instance}/{grp.stage}: no such instance and stage"
            )
        _check_group(g, phase.role, grp, stage)


def check_plan(plan: Plan, g: nx.Graph) -> None:
    """Raise :class:`InputError` naming the first thing in ``plan`` that ``g`` contradicts:
    a GPU that is missing, not a GPU, used twice or reserved for the other phase; a stage
    whose size is not the phase's TP; a weight shard that does not fit (``r_frac`` of the
    GPU's memory, the plan's own ``options["r_frac"]`` or the planner's default); a group,
    rail or KV transfer whose path is not made of the topology's links; a KV transfer that
    does not go from a prefill GPU to a decode GPU."""
    model = model_spec(plan.model)
    r_frac = float(plan.options.get("r_frac", PlannerOptions().r_frac))
    used: dict[str, str] = {}
    for phase in (plan.prefill, plan.decode):
        if phase.tp < 1 or phase.pp < 1:
            raise InputError(f"{phase.role}: TP {phase.tp} and PP {phase.pp} must be >= 1")
        _check_phase(g, phase, used, model.param_bytes / (phase.tp * phase.pp), r_frac)
    for k, kv in enumerate(plan.kv_transfer):
        what = f"kv_transfer[{k}] {kv.src} -> {kv.dst}"
        if not used.get(kv.src, "").startswith("prefill/"):
            raise InputError(f"{what}: {kv.src} is not a prefill GPU of the plan")
        if not used.get(kv.dst, "").startswith("decode/"):
            raise InputError(f"{what}: {kv.dst} is not a decode GPU of the plan")
        _check_path(g, kv.path, kv.src, what)
        if kv.path[-1] != kv.dst:
            raise InputError(f"{what}: the path ends at {kv.path[-1]}, not at {kv.dst}")
