"""Why a search found no deployment, in one line for the user (``explain_infeasible``).

Holds ``explain_infeasible`` and the GPUs the smallest two instances need
(``min_gpus_two_instances``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NoReturn

from controller.errors import InputError
from controller.planner.candidates import tp_pp_candidates
from controller.planner.options import Policy, Problem
from controller.planner.roles import ROLES, RoleSpace
from controller.units import GB


def explain_infeasible(
    problem: Problem, policy: Policy, space: RoleSpace, feasible: dict[str, bool]
) -> NoReturn:
    """Raise the one-line ``InputError`` that says why no deployment was found: the model
    does not fit, ``--gpus`` is too few, a forced (TP, PP) is not feasible, or nothing meets
    the SLA."""
    model, opts, g = problem.model, problem.options, problem.cluster
    every = [*space.fixed_prefill, *space.fixed_decode] + [
        x for c in space.classes for s in c.servers for x in space.free[s]
    ]
    mem = [g.nodes[x]["memory_gb"] for x in every]
    usable = sum(mem) * GB * opts.r_frac
    if not tp_pp_candidates(model, mem, opts.r_frac, opts.max_candi) or (
        usable < 2 * model.param_bytes
    ):
        raise InputError(
            f"{model.name} ({model.param_bytes / 1e9:.0f} GB of weights) does not fit: one "
            f"prefill and one decode instance need {2 * model.param_bytes / 1e9:.0f} GB, the "
            f"{len(every)} GPUs hold {sum(mem):.0f} GB ({opts.r_frac:.0%} usable)"
        )
    if opts.max_gpus is not None:
        need = min_gpus_two_instances(problem, every)
        if opts.max_gpus < need:
            raise InputError(
                f"--gpus {opts.max_gpus} is below the {need} GPUs {model.name} needs for one "
                f"prefill and one decode instance"
            )
    for role in ROLES:
        forced = opts.prefill_par if role == "prefill" else opts.decode_par
        if forced is not None and not feasible[role]:
            raise InputError(
                f"{role} TP={forced[0]} PP={forced[1]} is not feasible: TP must split the "
                f"heads, PP the layers, and the shards must fit"
            )
    forced = [
        f"{role} TP={par[0]} PP={par[1]}"
        for role, par in (("prefill", opts.prefill_par), ("decode", opts.decode_par))
        if par is not None
    ]
    engine = problem.engine
    raise InputError(
        f"no deployment of {model.name}"
        + (f" that {engine.name} runs" if engine is not None else "")
        + f" meets the SLA (TTFT {problem.sla.ttft_s} s, TPOT {problem.sla.tpot_s} s) on this "
        f"cluster with {policy.name}" + (f" with {' and '.join(forced)} forced" if forced else "")
    )


def min_gpus_two_instances(problem: Problem, pool: Sequence[str]) -> int:
    """GPUs of the smallest prefill instance plus the smallest decode instance that fit."""
    g, model, opts = problem.cluster, problem.model, problem.options
    mem = [g.nodes[x]["memory_gb"] for x in pool]
    cands = tp_pp_candidates(model, mem, opts.r_frac, 10**6)
    smallest = min((tp * pp for tp, pp in cands), default=math.inf)
    return int(2 * smallest) if smallest < math.inf else 0
