"""The GPUs a plan leaves idle and why (docs/planner.md, "GPUs left idle").

``idle_gpus`` accounts for every GPU of the cluster that the deployment does not use, one
``controller.plan.IdleGPUs`` entry per (pool, reason):

- memory: too little for a 1/(TP*PP) shard of the weights at the phase's parallelism;
- grouping: fit, but in no instance (fewer than TP*PP GPUs left over, or GPUs the grouping
  could not chain into a whole instance);
- no rate: in an instance that meets the SLA at no rate;
- not deployed: in an instance that would serve, left out because one more adds no H (Eq. 1:
  at equal H the fewest GPUs), with what bounds H (the other phase's capacity, the KV
  transfer's time in the decode TPOT, or ``--gpus``);
- no pool: GPUs in neither phase's pool (a layout that uses some servers only).

The entries of a role sum to its pool less the GPUs it deploys, so the whole list sums to
the cluster's GPUs less ``Predicted.gpus_used``.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.plan import IdleGPUs
from controller.planner.combine import Combination
from controller.planner.evaluate import Evaluator
from controller.planner.results import PhaseResult
from controller.topology.graph import gpus

REL = 1e-9  # Eq. 1's tolerance on equal rates (``Combination.better_than``)


def _bound(
    role: str, comb: Combination, cap: dict[str, float], size: int, max_gpus: int | None
) -> str:
    """Why the next instance of ``role`` (``size`` GPUs) is not deployed: what bounds H."""
    other = "decode" if role == "prefill" else "prefill"
    if max_gpus is not None and comb.gpus_used + size > max_gpus:
        return f"one more would pass the --gpus limit of {max_gpus}"
    if comb.rate < min(cap.values()) * (1 - 1e-6):
        # H sits below both phases' capacity only where ``deployment.settle_kv`` lowered it:
        # the decode instances priced with the KV transfer's time at H, which the links'
        # load stretches well before any link is full (42-71% on the summarization plans of
        # docs/planner.md), so the note names the transfer, not a full link
        return (
            f"more {role} adds no rate, H is bounded by the KV transfer "
            "(its time at H, under the links' load, in the decode TPOT)"
        )
    if cap[other] <= cap[role] * (1 + REL):
        return (
            f"more {role} adds no rate, H is bounded by the {other} instances' capacity "
            f"({cap[other]:.3f} req/s)"
        )
    return f"more {role} adds no rate"


def idle_gpus(
    ev: Evaluator,
    phases: Sequence[tuple[PhaseResult, int, Sequence[str] | None]],
    comb: Combination,
) -> list[IdleGPUs]:
    """The GPUs of ``ev``'s cluster that the deployment ``comb`` leaves unused, by reason.
    ``phases``: per role, its priced instances, how many of them are deployed (the best
    first, as ``combine`` and the plan take them) and the GPUs of its pool (None: the pool
    is what its instances hold)."""
    out: list[IdleGPUs] = []
    deployed_cap: dict[str, float] = {}
    ranked = {}
    for res, n_used, _ in phases:
        order = sorted(res.instances, key=lambda i: -i.rate)
        ranked[res.role] = order
        deployed_cap[res.role] = sum(i.rate for i in order[:n_used])
    seen: set[str] = set()
    for res, n_used, pool in phases:
        role, size = res.role, res.tp * res.pp
        order = ranked[role]
        members = [{x for st in i.stages for x in st} for i in order]
        for m in members[:n_used]:
            seen |= m
        rest = order[n_used:]
        zero = sum(len(members[n_used + k]) for k, i in enumerate(rest) if i.rate <= 0)
        spare = sum(len(members[n_used + k]) for k, i in enumerate(rest) if i.rate > 0)
        for m in members[n_used:]:
            seen |= m
        if spare:
            why = _bound(role, comb, deployed_cap, size, ev.problem.options.max_gpus)
            out.append(
                IdleGPUs(
                    role,
                    spare,
                    f"{spare // size} {res.tp}x{res.pp} instance(s) not deployed: {why}",
                )
            )
        if zero:
            out.append(
                IdleGPUs(
                    role,
                    zero,
                    f"{zero // size} {res.tp}x{res.pp} instance(s) meet the SLA at no rate",
                )
            )
        if pool is None:
            continue
        placed = {x for m in members for x in m}
        left = [x for x in pool if x not in placed]
        seen.update(pool)
        fit = set(ev.fit(left, res.tp, res.pp))
        small = len(left) - len(fit)
        if small:
            out.append(
                IdleGPUs(
                    role,
                    small,
                    f"too little memory for a 1/{size} shard of the weights ({res.tp}x{res.pp})",
                )
            )
        if fit:
            out.append(
                IdleGPUs(
                    role,
                    len(fit),
                    f"in no {res.tp}x{res.pp} instance: left over after grouping the pool",
                )
            )
    outside = [x for x in gpus(ev.g) if x not in seen]
    if outside:
        out.append(IdleGPUs("any", len(outside), "in no pool of this layout"))
    return out
