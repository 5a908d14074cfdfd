"""HeroServe's planner (Alg. 1 + Alg. 2): k-means-constrained grouping on an MDS embedding of
the latency matrix, INA or ring per group with NVLink-assisted INA routes, random-swap
perturbation, pod by pod with reuse across identical pods."""

from __future__ import annotations

import random

import numpy as np

from controller.planner.evaluate import Evaluator
from controller.planner.grouping import (
    PodGroups,
    by_pods,
    kmeans_groups,
    latency_matrix,
    mds_embedding,
    packed_groups,
    perturb,
)
from controller.planner.options import Policy

POLICY = Policy(
    "heroserve",
    grouping="kmeans",
    ina="sync",
    ina_relay=True,
    ina_cross_server_only=False,
    prefer_intra_server=False,
)


def _type_features(ev: Evaluator, members: list[str], scale: float) -> np.ndarray:
    """One-hot GPU type, scaled: groups should not mix GPU types (the slowest sets the pace)."""
    types = sorted({ev.g.nodes[m]["gpu_type"] for m in members})
    out = np.zeros((len(members), len(types)))
    for i, m in enumerate(members):
        out[i, types.index(ev.g.nodes[m]["gpu_type"])] = scale
    return out


def group_pod(
    ev: Evaluator, members: list[str], tp: int, nbytes: float, rng: random.Random
) -> list[list[str]]:
    """Alg. 2 lines 2-22 for one pod: embed, cluster, perturb. The server-packed grouping is a
    second starting point, so HeroServe never does worse than locality alone."""
    usable = len(members) // tp * tp
    members = members[:usable]
    if not members:
        return []
    d = latency_matrix(ev.ring_fabric if ev.policy.ina_relay else ev.ina_fabric, members, nbytes)
    coords = mds_embedding(d)
    finite = d[np.isfinite(d)]
    coords = np.hstack(
        [coords, _type_features(ev, members, float(finite.max()) if finite.size else 1.0)]
    )
    seed = rng.randrange(2**31)

    def cost(grp):
        return ev.group_cost(grp, nbytes)

    tries = ev.problem.options.perturb_tries
    starts = [kmeans_groups(members, coords, tp, seed), packed_groups(ev.g, members, tp)]
    results = [perturb(s, cost, rng, tries) for s in starts]
    return min(results, key=lambda gs: sum(cost(x) for x in gs))


def heroserve_grouper(
    ev: Evaluator, role: str, pool: list[str], tp: int, pp: int, nbytes: float
) -> list[PodGroups]:
    rng = random.Random(ev.problem.options.seed * 1000003 + tp * 101 + pp)
    return by_pods(
        ev.g, pool, tp, pp, lambda pod: group_pod(ev, pod, tp, nbytes, rng), ev.problem.say
    )
