"""Seeded random heterogeneous clusters, for property tests and benchmarks of the planners.

``random_cluster(seed)`` draws a small rail cluster: 2-5 servers of 2-4 GPUs, one GPU type per
server from a mix of NVLink and PCIe parts, 1-3 tracks (GPU j of server i on access switch
``(i + j) mod tracks``, so servers start on different rails), access switches joined by a core
switch. Every GPU's role is ``any``. The same seed gives the same cluster.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import networkx as nx

from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps

GPU_MIX = ("T4", "L4", "V100-32GB", "A100-40GB", "L40", "A100-80GB", "H100")


def random_cluster(
    seed: int,
    *,
    servers: Sequence[int] = (2, 3, 4, 5),
    gpus_per_server: Sequence[int] = (2, 3, 4),
    tracks: Sequence[int] = (1, 2, 3),
    gpu_types: Sequence[str] = GPU_MIX,
    types_per_cluster: int = 2,
) -> nx.Graph:
    """A random cluster drawn from ``seed``; each parameter lists the values to draw from.
    ``types_per_cluster`` GPU types are drawn for the cluster, then one per server."""
    rng = random.Random(seed)
    n_servers = rng.choice(list(servers))
    n_tracks = rng.choice(list(tracks))
    types = rng.sample(list(gpu_types), min(types_per_cluster, len(gpu_types)))
    g = nx.Graph(name=f"random-{seed}")
    access = [f"a{t}" for t in range(n_tracks)]
    for a in access:
        add_switch(g, a, tier="access")
    if n_tracks > 1:
        add_switch(g, "core", tier="core")
        for a in access:
            add_link(g, a, "core", link="ethernet", capacity=gbps(rng.choice([100, 200, 400])))
    for i in range(n_servers):
        gpu_type = rng.choice(types)
        n = rng.choice(list(gpus_per_server))
        for j, gid in enumerate(add_server(g, f"srv{i}", gpu_type=gpu_type, n_gpus=n, role="any")):
            add_link(g, gid, access[(i + j) % n_tracks], link="ethernet", capacity=gbps(100))
    return g
