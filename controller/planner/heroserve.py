"""HeroServe's planner (Alg. 1 + Alg. 2): k-means-constrained grouping on an MDS embedding of
the latency matrix, INA or ring per group with NVLink-assisted INA routes, random-swap
perturbation, pod by pod with reuse across identical pods.

Holds its ``POLICY``, ``heroserve_grouper`` (a pool, pod by pod) and ``group_pod`` (one pod)."""

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
    hier=True,
    colocated_layouts=True,
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
    second starting point, so HeroServe never does worse than locality alone.

    The unit that is clustered and swapped is the GPU, as in the paper, except where the
    servers make a coarser unit exact:
    - TP divides every server's GPU count: each group stays inside a server (``packed``).
      A group inside a server moves its bytes over the server's NVLink or PCIe fabric, which
      no route through a NIC beats, so clustering could only move it onto Ethernet.
    - TP is a multiple of a common server size: groups are unions of TP / size whole servers,
      so k-means clusters servers and the perturbation swaps whole servers. Splitting a
      server between groups would put part of each group's traffic on Ethernet that NVLink
      carries otherwise, and leaves servers with unequal member counts, which rules out
      hierarchical INA.
    """
    by_server: dict[str, list[str]] = {}
    for x in members:
        by_server.setdefault(ev.g.nodes[x].get("server") or x, []).append(x)
    sizes = {len(v) for v in by_server.values()}
    if all(n % tp == 0 for n in sizes):
        return packed_groups(ev.g, members, tp)
    if len(sizes) == 1 and tp % (size := sizes.pop()) == 0:
        units = [by_server[s] for s in sorted(by_server, key=lambda s: by_server[s][0])]
        per = tp // size
        groups = _cluster(ev, units, per, nbytes, rng)
        return [[x for u in grp for x in u] for grp in groups]
    usable = len(members) // tp * tp
    return [
        [x[0] for x in grp]
        for grp in _cluster(ev, [[x] for x in members[:usable]], tp, nbytes, rng)
    ]


def _cluster(
    ev: Evaluator, units: list[list[str]], per: int, nbytes: float, rng: random.Random
) -> list[list[list[str]]]:
    """Groups of ``per`` units (a unit is a GPU or a whole server): k-means-constrained on an
    MDS embedding of the units' latency (the mean over their GPUs), and the packed order as a
    second start; each perturbed by swapping units, the cheapest total kept."""
    usable = len(units) // per * per
    units = units[:usable]
    if not units:
        return []
    gpus = [x for u in units for x in u]
    fabric = ev.ring_fabric if ev.policy.ina_relay else ev.ina_fabric
    d_gpu = latency_matrix(fabric, gpus, nbytes)
    owner = np.repeat(np.arange(len(units)), [len(u) for u in units])
    counts = np.bincount(owner).astype(float)
    d = np.zeros((len(units), len(units)))
    np.add.at(d, (owner[:, None], owner[None, :]), d_gpu)
    d /= counts[:, None] * counts[None, :]
    coords = mds_embedding(d)
    finite = d[np.isfinite(d)]
    reps = [u[0] for u in units]
    coords = np.hstack(
        [coords, _type_features(ev, reps, float(finite.max()) if finite.size else 1.0)]
    )
    seed = rng.randrange(2**31)
    index = {u[0]: u for u in units}

    def cost(grp: list[str]) -> float:
        return ev.group_cost([x for r in grp for x in index[r]], nbytes)

    tries = ev.problem.options.perturb_tries
    starts = [
        kmeans_groups(reps, coords, per, seed),
        [reps[i : i + per] for i in range(0, len(reps), per)],
    ]
    results = [perturb(s, cost, rng, tries) for s in starts]
    best = min(results, key=lambda gs: sum(cost(x) for x in gs))
    return [[index[r] for r in grp] for grp in best]


def heroserve_grouper(
    ev: Evaluator, role: str, pool: list[str], tp: int, pp: int, nbytes: float
) -> list[PodGroups]:
    rng = random.Random(ev.problem.options.seed * 1000003 + tp * 101 + pp)
    tag = ("heroserve", tp, nbytes)
    cache = ev.grouping_cache(tag)
    return by_pods(
        ev.g,
        pool,
        tp,
        pp,
        lambda pod: group_pod(ev, pod, tp, nbytes, rng),
        ev.problem.say,
        cache,
        tag,
    )
