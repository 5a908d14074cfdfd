"""Clusters of the seed papers' evaluations, as cluster graphs (``controller.topology``).

- ``helix24``: Helix §6.2's single cluster: 4 A100 (40 GB), 8 L4 and 12 T4 nodes of one GPU
  each, joined by a 10 Gb/s network (one access switch).
- ``hetero-v100``: the machine of §5.1-5.2 of the heterogeneous high-throughput paper
  (``003_...``): 8 V100-SXM2-32GB GPUs connected over PCIe 3.0 x16 (15.75 GB/s), one
  100 Gb/s port.

``resolve_cluster`` takes these names, the project's built-ins and topology files.
"""

from __future__ import annotations

import networkx as nx

from controller.models.gpus import gpu_spec
from controller.topology import resolve_topology
from controller.topology.generators import add_server
from controller.topology.graph import add_gpu, add_link, add_nvswitch, add_switch
from controller.units import GB, gbps

PCIE3_X16_BPS = 15.75 * GB  # 16 lanes x 8 GT/s x 128b/130b


def helix24(link_gbps: float = 10.0) -> nx.Graph:
    """Helix's single cluster (§6.2): 4 A100, 8 L4, 12 T4 single-GPU nodes, every node's
    port at ``link_gbps`` on one switch (the paper configures 10 Gb/s)."""
    g = nx.Graph(name="helix24")
    add_switch(g, "sw0", tier="access")
    kinds = [("A100-40GB", "a100", 4), ("L4", "l4", 8), ("T4", "t4", 12)]
    for gpu_type, tag, n in kinds:
        for i in range(n):
            (gid,) = add_server(g, f"{tag}-{i}", gpu_type=gpu_type, n_gpus=1, role="any")
            add_link(g, gid, "sw0", link="ethernet", capacity=gbps(link_gbps))
    return g


def hetero_v100(gpus: int = 8) -> nx.Graph:
    """The 8 x V100-SXM2-32GB machine of ``003_...`` §5.1: its GPUs talk over PCIe 3.0 x16,
    not NVLink (the paper's own description)."""
    g = nx.Graph(name="hetero-v100")
    add_switch(g, "sw0", tier="access")
    spec = gpu_spec("V100-32GB")
    add_nvswitch(g, "v100-nvsw", server="v100")
    for i in range(gpus):
        gid = f"v100-gpu{i}"
        add_gpu(
            g, gid, gpu_type="V100-32GB", memory_gb=spec.memory_bytes / GB, server="v100", index=i
        )
        add_link(g, gid, "v100-nvsw", link="pcie", capacity=PCIE3_X16_BPS)
    add_link(g, "v100-gpu0", "sw0", link="ethernet", capacity=gbps(100))
    return g


CLUSTERS = {"helix24": helix24, "hetero-v100": hetero_v100}


def resolve_cluster(spec: str) -> nx.Graph:
    """A seed paper's cluster (``CLUSTERS``), a project built-in or a topology file."""
    if spec in CLUSTERS:
        return CLUSTERS[spec]()
    return resolve_topology(spec)
