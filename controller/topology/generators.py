"""Built-in clusters (docs/design.md §3): the paper's testbed (Fig. 6), the track clusters of its
simulations (§V), the Fig. 2 example and ``l40s-rack``, a PCIe-only rack where INA pays
(docs/ina-map.md). Each returns a cluster graph (``graph.py``). Also
:func:`add_server`, one server wired as its board is, which topology files use too."""

from __future__ import annotations

import networkx as nx

from controller.errors import InputError
from controller.inputs.limits import MAX_SERVERS
from controller.models.boards import MESH, NVSWITCH, board_for
from controller.models.gpus import gpu_spec, pcie_per_direction
from controller.topology.graph import add_gpu, add_link, add_nvswitch, add_switch
from controller.units import GB, gbps


def nvlink_per_direction(gpu_type: str) -> float:
    """A GPU's NVLink bandwidth in one direction, bytes/s: the datasheet gives the total over
    both directions (V100 300, A100 600, H100 900 GB/s), a graph link's capacity is per
    direction."""
    return gpu_spec(gpu_type).nvlink_bw / 2


def fabric_node(server: str) -> str:
    """The id of a server's NVSwitch (or PCIe) fabric node; mesh boards have none."""
    return f"{server}-nvsw"


def server_nodes(server: str, gpu_type: str, n_gpus: int) -> list[str]:
    """The node ids ``add_server`` makes: the fabric node (unless the board is a mesh), then
    the GPUs ``<server>-gpu<i>``."""
    hub = [] if board_for(gpu_type, n_gpus).fabric == MESH else [fabric_node(server)]
    return hub + [f"{server}-gpu{i}" for i in range(n_gpus)]


def add_server(g: nx.Graph, server: str, *, gpu_type: str, n_gpus: int, role: str) -> list[str]:
    """One GPU server of ``n_gpus`` GPUs, wired as its board is (``models.boards.board_for``;
    docs/topology.md "Server fabrics"). Returns the GPU ids ``<server>-gpu<i>``.

    * NVSwitch board: one fabric node ``<server>-nvsw``, each GPU's NVLink edge to it with the
      GPU's NVLink bandwidth per direction (half the datasheet's total over both directions,
      ``nvlink_per_direction``), so any pair may use it all.
    * Mesh board: an NVLink edge between every pair of GPUs with the pair's links
      (``Board.pair_bw``: A100 4 x 25 = 100 GB/s, V100 2 x 25 = 50 GB/s each way); no fabric
      node. A server with fewer GPUs than the board holds keeps each pair's links.
    * PCIe parts: the fabric node is the host's PCIe fabric, each card's x16 link to it at its
      generation's rate (``models.gpus.pcie_per_direction``: 32 GB/s for 4.0, 16 for 3.0)."""
    spec = gpu_spec(gpu_type)
    board = board_for(gpu_type, n_gpus)
    out = []
    for i in range(n_gpus):
        gid = f"{server}-gpu{i}"
        add_gpu(
            g,
            gid,
            gpu_type=gpu_type,
            memory_gb=spec.memory_bytes / GB,
            server=server,
            index=i,
            role=role,
        )
        out.append(gid)
    if board.fabric == MESH:
        for i, a in enumerate(out):
            for b in out[i + 1 :]:
                add_link(g, a, b, link="nvlink", capacity=board.pair_bw())
        return out
    hub = fabric_node(server)
    add_nvswitch(g, hub, server=server)
    if board.fabric == NVSWITCH:
        link, bw = "nvlink", nvlink_per_direction(gpu_type)
    else:
        link, bw = "pcie", pcie_per_direction(gpu_type)
    for gid in out:
        add_link(g, gid, hub, link=link, capacity=bw)
    return out


def testbed(fixed_roles: bool = False) -> nx.Graph:
    """The paper's testbed (Fig. 6): 4 servers of 4 GPUs; srv0, srv1 are A100-40GB, srv2, srv3
    V100-32GB; one 100 Gb/s port per GPU on 2 tracks: GPUs 0 and 2 of every server on access
    switch s1, GPUs 1 and 3 on s2; s1 and s2 joined by one 100 Gb/s link.

    Every GPU's role is ``any``: the planner decides which servers prefill and which decode.
    ``fixed_roles`` pins the paper's split (prefill on the A100 servers, decode on the V100
    servers), for comparing the planner's split with it; that graph is the built-in
    ``testbed-paper``."""
    g = nx.Graph(name="testbed-paper" if fixed_roles else "testbed")
    add_switch(g, "s1", tier="access")
    add_switch(g, "s2", tier="access")
    add_link(g, "s1", "s2", link="ethernet", capacity=gbps(100))
    kinds = [
        ("A100-40GB", "prefill"),
        ("A100-40GB", "prefill"),
        ("V100-32GB", "decode"),
        ("V100-32GB", "decode"),
    ]
    for s, (gpu_type, role) in enumerate(kinds):
        role = role if fixed_roles else "any"
        for i, gid in enumerate(add_server(g, f"srv{s}", gpu_type=gpu_type, n_gpus=4, role=role)):
            add_link(g, gid, "s1" if i % 2 == 0 else "s2", link="ethernet", capacity=gbps(100))
    return g


def tracks(
    servers: int,
    gpus_per_server: int,
    n_tracks: int,
    servers_per_unit: int,
    core_switches: int,
    *,
    gpu_type: str = "A100-40GB",
    uplinks_per_access: int = 4,
    gpu_port_gbps: float = 100,
    uplink_gbps: float = 400,
    prefill_fraction: float | None = None,
    name: str | None = None,
) -> nx.Graph:
    """A rail ("track") cluster of the paper's simulations (§V).

    Servers are grouped in units of ``servers_per_unit``; each unit has ``n_tracks`` access
    switches and GPU i of a server plugs into its unit's access switch of track
    ``i mod n_tracks``. Every access switch of unit u has ``uplinks_per_access`` links to the
    core switches ``(u * uplinks_per_access + j) mod core_switches`` (j < uplinks_per_access),
    so the access switches of one unit share their core switches (cross-track traffic inside a
    unit takes access-core-access), and the core tier is modelled as a non-blocking full mesh.
    Every GPU's role is ``any`` (the planner splits the roles); with ``prefill_fraction`` the
    first that fraction of the units is pinned to prefill and the rest to decode (the paper's
    Fig. 4 gives each phase its own access switches).
    """
    if servers % servers_per_unit:
        raise ValueError(f"{servers} servers do not split into units of {servers_per_unit}")
    g = nx.Graph(name=name or f"{n_tracks}tracks-{servers}x{gpus_per_server}")
    units = servers // servers_per_unit
    cores = [f"core{c}" for c in range(core_switches)]
    for c in cores:
        add_switch(g, c, tier="core")
    for i, a in enumerate(cores):
        for b in cores[i + 1 :]:
            add_link(g, a, b, link="ethernet", capacity=gbps(uplink_gbps))
    prefill_units = None if prefill_fraction is None else round(units * prefill_fraction)
    for u in range(units):
        role = "any" if prefill_units is None else ("prefill" if u < prefill_units else "decode")
        acc = [f"u{u}-acc{t}" for t in range(n_tracks)]
        for a in acc:
            add_switch(g, a, tier="access")
            for j in range(uplinks_per_access):
                core = cores[(u * uplinks_per_access + j) % core_switches]
                if not g.has_edge(a, core):
                    add_link(g, a, core, link="ethernet", capacity=gbps(uplink_gbps))
        for s in range(servers_per_unit):
            server = f"u{u}-srv{s}"
            for i, gid in enumerate(
                add_server(g, server, gpu_type=gpu_type, n_gpus=gpus_per_server, role=role)
            ):
                add_link(g, gid, acc[i % n_tracks], link="ethernet", capacity=gbps(gpu_port_gbps))
    return g


def two_tracks(servers: int = 1200) -> nx.Graph:
    """§V's 2tracks: units of 6 servers on 2 access switches (400 access, 27 core at 1200)."""
    return track_cluster("2tracks", servers)


def eight_tracks(servers: int = 1200) -> nx.Graph:
    """§V's 8tracks: units of 16 servers on 8 access switches (600 access, 280 core at 1200)."""
    return track_cluster("8tracks", servers)


# §V's track clusters: servers per unit, access switches per unit (tracks), the paper's core
# switches at its 1,200 servers, and the fewest cores a smaller cluster keeps.
TRACK_CLUSTERS = {"2tracks": (6, 2, 27, 2), "8tracks": (16, 8, 280, 4)}
PAPER_SERVERS = 1200
TRACK_SERVER_GPUS = 8  # §V's servers: 8 A100s each


def track_servers_for(kind: str, gpus: int) -> int:
    """The servers of the smallest ``kind`` cluster (whole units, at most the paper's 1,200)
    that holds ``gpus`` GPUs: the cluster ``plan --gpus N`` searches."""
    unit = TRACK_CLUSTERS[kind][0]
    per_unit = unit * TRACK_SERVER_GPUS
    return min(PAPER_SERVERS, -(-gpus // per_unit) * unit)


def paper_cores(kind: str, servers: int) -> int:
    """The paper's core-switch count of a track cluster scaled to ``servers`` (its own at
    1,200), at least a few."""
    *_, full, least = TRACK_CLUSTERS[kind]
    return full if servers == PAPER_SERVERS else max(least, round(full * servers / PAPER_SERVERS))


def track_cluster(kind: str, servers: int = PAPER_SERVERS, cores: int = 0) -> nx.Graph:
    """A track cluster (``2tracks`` or ``8tracks``) of ``servers`` 8-GPU A100 servers, a
    multiple of its unit, with ``cores`` core switches (0: the paper's count scaled to the
    size, :func:`paper_cores`). Named ``KIND`` at the paper's size, ``KIND-N`` otherwise,
    which :func:`controller.topology.resolve_topology` reads back."""
    if kind not in TRACK_CLUSTERS:
        raise InputError(f"unknown track cluster {kind!r}: one of {', '.join(TRACK_CLUSTERS)}")
    unit, n_tracks, _, _ = TRACK_CLUSTERS[kind]
    if servers > MAX_SERVERS:
        raise InputError(f"{kind} of {servers} servers: at most {MAX_SERVERS} (docs/inputs.md)")
    if servers < unit or servers % unit:
        raise InputError(f"{kind} has whole units of {unit} servers: {servers} is not a multiple")
    name = kind if servers == PAPER_SERVERS else f"{kind}-{servers}"
    return tracks(
        servers, TRACK_SERVER_GPUS, n_tracks, unit, cores or paper_cores(kind, servers), name=name
    )


def fig2() -> nx.Graph:
    """Fig. 2's example: two servers of two GPUs, access switch S2 and core switch S1.

    gn1 (server A) and gn3 (server B) have their NICs on S2; gn2 (A) and gn4 (B) on S1; S1 and
    S2 are joined. The group {gn2, gn3} aggregating on the core S1 (homogeneous INA) needs two
    Ethernet hops from gn3; with NVLink, gn2 relays through gn1's NIC and both reach the access
    switch S2 in one Ethernet hop. The paper's "600GBs" NVLink is the A100's total over both
    directions: 300 GB/s each way."""
    g = nx.Graph(name="fig2")
    add_switch(g, "S1", tier="core")
    add_switch(g, "S2", tier="access")
    add_link(g, "S1", "S2", link="ethernet", capacity=gbps(100))
    names = {"A": ["gn1", "gn2"], "B": ["gn3", "gn4"]}
    for server, gids in names.items():
        add_nvswitch(g, f"{server}-nvsw", server=server)
        for i, gid in enumerate(gids):
            add_gpu(g, gid, gpu_type="A100-40GB", memory_gb=40, server=server, index=i)
            add_link(
                g, gid, f"{server}-nvsw", link="nvlink", capacity=nvlink_per_direction("A100-40GB")
            )
    for gid, sw in [("gn1", "S2"), ("gn3", "S2"), ("gn2", "S1"), ("gn4", "S1")]:
        add_link(g, gid, sw, link="ethernet", capacity=gbps(100))
    return g


# A PCIe-optimised rack (docs/topology.md "Built-in clusters", docs/ina-map.md): NVIDIA's
# "PCIe Optimized 2-8-5" Enterprise Reference Architecture server (2 CPU sockets, 8 GPUs,
# 5 network adapters: 4 east-west, 1 north-south; NVIDIA AI Enterprise Reference Architecture,
# "Compute Node Hardware", which names the L40S among its GPUs) with 8 L40S (PCIe 4.0 x16,
# no NVLink: models.gpus) and, east-west, 4 BlueField-3 B3140 SuperNICs of one 400 GbE port
# each (NVIDIA BlueField-3 user manual): one NIC per 2 GPUs, 200 Gb/s per GPU; 4 servers (the
# architecture's smallest cluster, 32 GPUs) on one Tofino 2 switch (Intel: 12.8 Tb/s, 32 x 400
# GbE ports; the rack uses 16).
L40S_RACK_SERVERS = 4
L40S_RACK_GPUS = 8
L40S_RACK_GPU_GBPS = 4 * 400 / L40S_RACK_GPUS  # the 4 east-west NICs shared by the 8 GPUs


def l40s_rack(servers: int = L40S_RACK_SERVERS) -> nx.Graph:
    """A rack of PCIe-only servers where INA pays (docs/ina-map.md): ``servers`` servers of 8
    L40S on their PCIe 4.0 fabric, every GPU one Ethernet port of 200 Gb/s (its half of a 400
    GbE NIC shared with one peer: exact when both send at once, as in a collective) on one
    INA-capable top-of-rack switch ``tor``. Every GPU's role is ``any``."""
    g = nx.Graph(name="l40s-rack")
    add_switch(g, "tor", tier="access")
    for s in range(servers):
        gids = add_server(g, f"srv{s}", gpu_type="L40S", n_gpus=L40S_RACK_GPUS, role="any")
        for gid in gids:
            add_link(g, gid, "tor", link="ethernet", capacity=gbps(L40S_RACK_GPU_GBPS))
    return g


BUILTIN = {
    "testbed": testbed,
    "testbed-paper": lambda: testbed(fixed_roles=True),
    "2tracks": two_tracks,
    "8tracks": eight_tracks,
    "fig2": fig2,
    "l40s-rack": l40s_rack,
}
