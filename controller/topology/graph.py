"""The cluster graph (docs/design.md §3): a networkx ``Graph`` whose nodes and edges carry the
attributes below. This module is the only place that names them.

Nodes
  gpu       ``kind="gpu"``, ``gpu_type``, ``memory_gb``, ``server``, ``index`` (GPU number inside
            its server), ``role`` in {prefill, decode, any}. A GPU node stands for the GPU and
            its RDMA NIC(s) (GPUDirect): its Ethernet edges are its NIC ports.
  nvswitch  ``kind="nvswitch"``, ``server``: the NVLink fabric of one server with an NVSwitch
            board (or the PCIe fabric of NVLink-less cards). Each GPU of the server has one
            edge to it with the GPU's NVLink bandwidth per direction (half the datasheet's
            total), so a GPU cannot send more than that to all its peers together. A mesh
            board (4-GPU A100 and V100) has no such node: its GPUs are joined pair by pair by
            ``nvlink`` edges (docs/topology.md "Server fabrics").
  switch    ``kind="switch"``, ``tier`` in {access, core}, ``ina`` (bool), ``aggregator_slots``
            (slots available for INA), ``slot_bytes`` (payload bytes aggregated per slot).
  host      ``kind="host"``: anything else (a parameter server, a client).

Edges (undirected; a link is full duplex, so each direction has the full capacity)
  ``link`` in {nvlink, pcie, ethernet}, ``capacity`` C(e) in bytes/s, ``available`` B(e) in
  bytes/s (capacity minus measured use), ``latency_s`` per hop.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

GPU, NVSWITCH, SWITCH, HOST = "gpu", "nvswitch", "switch", "host"
NODE_KINDS = (GPU, NVSWITCH, SWITCH, HOST)
LINK_KINDS = ("nvlink", "pcie", "ethernet")
ROLES = ("prefill", "decode", "any")
TIERS = ("access", "core")

# Defaults where a topology file is silent (documented in docs/topology.md).
# Per-hop latencies, assumed (docs/costmodel.md: NCCL's own LL-protocol figures beside them,
# and what to measure to replace them)
DEFAULT_ETHERNET_LATENCY_S = 2e-6  # NIC + switch port, one hop
DEFAULT_NVLINK_LATENCY_S = 0.5e-6
DEFAULT_PCIE_LATENCY_S = 1e-6
DEFAULT_AGGREGATOR_SLOTS = 32768  # register depth of the v1model program
DEFAULT_SLOT_BYTES = 128  # 32 int32 lanes per INA packet


def add_gpu(
    g: nx.Graph,
    node: str,
    *,
    gpu_type: str,
    memory_gb: float,
    server: str,
    index: int,
    role: str = "any",
) -> None:
    g.add_node(
        node,
        kind=GPU,
        gpu_type=gpu_type,
        memory_gb=float(memory_gb),
        server=server,
        index=int(index),
        role=role,
    )


def add_nvswitch(g: nx.Graph, node: str, *, server: str) -> None:
    g.add_node(node, kind=NVSWITCH, server=server)


def add_switch(
    g: nx.Graph,
    node: str,
    *,
    tier: str,
    ina: bool = True,
    aggregator_slots: int = DEFAULT_AGGREGATOR_SLOTS,
    slot_bytes: int = DEFAULT_SLOT_BYTES,
) -> None:
    g.add_node(
        node,
        kind=SWITCH,
        tier=tier,
        ina=bool(ina),
        aggregator_slots=int(aggregator_slots),
        slot_bytes=int(slot_bytes),
    )


def add_link(
    g: nx.Graph,
    a: str,
    b: str,
    *,
    link: str,
    capacity: float,
    latency_s: float | None = None,
    available: float | None = None,
) -> None:
    if latency_s is None:
        latency_s = {
            "ethernet": DEFAULT_ETHERNET_LATENCY_S,
            "nvlink": DEFAULT_NVLINK_LATENCY_S,
            "pcie": DEFAULT_PCIE_LATENCY_S,
        }[link]
    g.add_edge(
        a,
        b,
        link=link,
        capacity=float(capacity),
        available=float(capacity if available is None else available),
        latency_s=float(latency_s),
    )


def kind(g: nx.Graph, n: str) -> str:
    return g.nodes[n]["kind"]


def gpus(g: nx.Graph, role: str | None = None) -> list[str]:
    """GPU node ids (sorted), optionally only those that may serve ``role``."""
    out = [n for n, d in g.nodes(data=True) if d["kind"] == GPU]
    if role is not None:
        out = [n for n in out if g.nodes[n].get("role", "any") in (role, "any")]
    return sorted(out, key=gpu_sort_key(g))


def switches(g: nx.Graph, *, ina_only: bool = False) -> list[str]:
    return sorted(
        n
        for n, d in g.nodes(data=True)
        if d["kind"] == SWITCH and (d.get("ina", False) or not ina_only)
    )


def server_of(g: nx.Graph, n: str) -> str | None:
    return g.nodes[n].get("server")


def gpu_sort_key(g: nx.Graph):
    """Order GPUs by server then index, the order NCCL builds rings in."""
    return lambda n: (g.nodes[n].get("server") or "", g.nodes[n].get("index", 0), n)


def servers(g: nx.Graph) -> dict[str, list[str]]:
    """server id -> its GPUs in index order."""
    out: dict[str, list[str]] = {}
    for n in gpus(g):
        out.setdefault(g.nodes[n]["server"], []).append(n)
    return out


def nic_switches(g: nx.Graph, gpu: str) -> list[str]:
    """Switches a GPU's own NIC ports attach to (its Ethernet neighbours)."""
    return sorted(
        v
        for v in g.neighbors(gpu)
        if g.nodes[v]["kind"] == SWITCH and g.edges[gpu, v]["link"] == "ethernet"
    )


def relayed(g: nx.Graph, path: list[str]) -> bool:
    """Whether a GPU's route to a switch leaves it over NVLink (to its server's fabric node or
    a mesh peer) and out through a peer's NIC (the paper's Fig. 2), not through its own."""
    return len(path) > 1 and g.nodes[path[1]]["kind"] != SWITCH


def link_id(a: str, b: str) -> str:
    """Stable id of an undirected link: the two node names sorted, joined by '|'."""
    return "|".join(sorted((a, b)))


def path_links(path: Iterable[str]) -> list[tuple[str, str]]:
    p = list(path)
    return list(zip(p, p[1:], strict=False))


def scale_bandwidth(g: nx.Graph, factor: float) -> nx.Graph:
    """A copy of ``g`` with every link's capacity and available bandwidth multiplied."""
    h = g.copy()
    for _, _, d in h.edges(data=True):
        d["capacity"] *= factor
        d["available"] *= factor
    return h
