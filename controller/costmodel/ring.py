"""NCCL's ring all-reduce (paper Eq. 11, docs/costmodel.md "Ring"): the order NCCL builds
rings in and the routes its channels take between servers.

Holds :func:`ring_order` (servers in turn, GPUs by index: the one definition, which the
emulation and the controller's policies use too), :func:`rail_routes` (one inter-server
channel's routes, PXN included), :func:`local_path` (a hop inside a server),
:func:`server_ring` (a ring step inside one server, spread over a mesh board's links),
:func:`written_ring` (Eq. 11 as the paper writes it) and :func:`ring_pattern` (the priced
collective).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from controller.costmodel.netparams import NetParams
from controller.costmodel.network import CommPattern, Phase, choose_routes, written_route
from controller.topology.fabric import Fabric, Path


def ring_order(fabric: Fabric | nx.Graph, members: Sequence[str]) -> list[str]:
    """NCCL's ring order: servers in turn, GPUs in index order inside a server (NVLink).

    Takes the fabric being priced or, where none is built (the emulation), its graph."""
    g = fabric.g if isinstance(fabric, Fabric) else fabric
    return sorted(members, key=lambda n: (g.nodes[n].get("server") or "", g.nodes[n]["index"], n))


def server_blocks(fabric: Fabric | nx.Graph, members: Sequence[str]) -> list[list[str]]:
    """NCCL's ring order cut into one block per server: the GPUs a ring visits in a server
    before it crosses to the next (the channels between servers are as many as the smallest
    block has GPUs)."""
    g = fabric.g if isinstance(fabric, Fabric) else fabric
    blocks: list[list[str]] = []
    for n in ring_order(g, members):
        if blocks and g.nodes[blocks[-1][0]].get("server") == g.nodes[n].get("server"):
            blocks[-1].append(n)
        else:
            blocks.append([n])
    return blocks


def rail_routes(fabric: Fabric, src: str, dst: str) -> list[Path]:
    """NCCL's routes for one inter-server channel: leave through the source GPU's own NIC or,
    with PXN, through an NVLink peer's NIC on the destination's rail; arrive at the destination
    GPU's own NIC. Built once per pair (``Fabric.memo``; shared, read-only lists)."""
    key = ("rail", src, dst)
    hit = fabric.memo.get(key)
    if hit is None:
        hit = fabric.memo[key] = _rail_routes(fabric, src, dst)
    return hit  # type: ignore[return-value]


def _rail_routes(fabric: Fabric, src: str, dst: str) -> list[Path]:
    if src == dst or fabric.nvlink_path(src, dst) is not None:
        return fabric.routes_between(src, dst)
    own = [f for f in fabric.exits(dst) if len(f) == 2]  # dst's own NICs: [dst, switch]
    rails = {f[-1] for f in own}
    keep = []
    for e in fabric.exits(src):  # (routes_between's order, without building the others)
        if len(e) != 2 and e[-1] not in rails:
            continue  # a peer's NIC that is not on the destination's rail
        for f in own:
            sp = fabric.flow_switch_path(e[-1], f[-1], src)
            if sp is not None:
                keep.append(e + sp[1:] + f[::-1][1:])
    return keep or fabric.routes_between(src, dst)


def local_path(fabric: Fabric, u: str, v: str) -> Path:
    """The route between two GPUs of one server: NVLink (or PCIe), else the shortest route."""
    return fabric.nvlink_path(u, v) or min(fabric.routes_between(u, v), key=len)


def server_ring(fabric: Fabric, block: Sequence[str], share: float) -> list[tuple[Path, float]]:
    """The flows of one ring step among ``block``, the group's GPUs in one server (NCCL's
    order), each GPU sending ``share`` of the message to its successor.

    Through an NVSwitch (or PCIe) fabric node: one ring in NCCL's order. On a point-to-point
    mesh (every pair of the block joined by its own NVLink link, docs/topology.md "Server
    fabrics") NCCL's channels take several ring orders, so that every link carries traffic
    (NVIDIA's DGX-1 whitepaper: the cube-mesh "as three interwoven rings"); spread evenly over
    every directed ring of the m GPUs, each directed link is in the same number of them
    ((m - 2)! of the (m - 1)!), so each directed link carries ``share / (m - 1)``: one flow per
    directed pair."""
    m = len(block)
    pairs = [(u, v) for u in block for v in block if u != v]
    if m > 2 and all(fabric.nvlink_path(u, v) == [u, v] for u, v in pairs):
        return [([u, v], share / (m - 1)) for u, v in pairs]
    return [(local_path(fabric, u, block[(i + 1) % m]), share) for i, u in enumerate(block)]


def written_route_between(fabric: Fabric, u: str, v: str) -> Path:
    """A ring edge's route as Eq. 11 prices it: NVLink (or PCIe) inside a server, else the
    route between the two GPUs with the widest bottleneck (``network.written_route``)."""
    local = fabric.nvlink_path(u, v)
    return local if local is not None else written_route(fabric, fabric.routes_between(u, v), True)


def written_ring(fabric: Fabric, order: Sequence[str], steps: int, share: float) -> Phase:
    """Eq. 11 as written over the GPUs of ``order`` (a ring, each sending to the next):
    ``steps`` steps of ``share`` of the message per GPU, each step as long as the slowest
    GPU's share at its route's slowest link, D_rg / min B; one route per GPU, priced alone,
    no latency, per-hop or channel terms."""
    flows = [
        (written_route_between(fabric, u, order[(i + 1) % len(order)]), share)
        for i, u in enumerate(order)
    ]
    return Phase(flows, steps, 0.0, bottleneck=True, alone=True)


def ring_pattern(
    fabric: Fabric, members: Sequence[str], nbytes: float, params: NetParams
) -> CommPattern:
    """Ring all-reduce (Eq. 11): 2(P-1) steps; in each, every GPU sends D/P bytes to its
    successor. Between servers NCCL runs one channel per NIC pair (as many as the smaller side
    has members), each over its cheapest route (PXN may relay over NVLink), so the D/P bytes
    crossing from one server to the next are spread over those NICs.

    Paper mode (Eq. 11 as written, ``written_ring``): 2(P-1) steps of D/P at the slowest
    link of the ring's routes, each GPU's route to its successor priced alone, no latency,
    no channels and no spreading over a mesh board's links.
    Pipelined (NCCL's own tuning model): 2(P-1) times the slowest flow's bytes over bandwidth,
    plus the latency a chunk accumulates going round: 2(N-1) network hops and 2(P-N) NVLink
    hops for N servers, each hop its route's latency plus NCCL's per-hop overhead."""
    order = ring_order(fabric, members)
    p = len(order)
    if p == 1:
        return CommPattern("ring", [], None, {})
    if params.as_written:
        phase = written_ring(fabric, order, 2 * (p - 1), 1.0 / p)
        paths = {u: r for u, (r, _) in zip(order, phase.flows, strict=True)}
        return CommPattern("ring", [phase], None, paths)
    blocks = server_blocks(fabric, order)
    share = 1.0 / p
    intra: list[tuple[Path, float]] = []
    paths: dict[str, Path] = {}
    for b in blocks:
        for u, v in zip(b, b[1:], strict=False):
            paths[u] = local_path(fabric, u, v)
            intra.append((paths[u], share))
    steps = 2 * (p - 1)
    if len(blocks) == 1:
        paths[order[-1]] = local_path(fabric, order[-1], order[0])
        intra = server_ring(fabric, order, share)
        chain = ((float(steps), tuple(range(len(intra))), params.ring_step_nvlink_s),)
        phase = Phase(intra, steps, params.ring_step_nvlink_s, chain=chain, bottleneck=True)
        return CommPattern("ring", [phase], None, paths)
    channels = min(len(b) for b in blocks)
    options, sizes = [], []
    for i, b in enumerate(blocks):
        nxt = blocks[(i + 1) % len(blocks)]
        for c in range(channels):
            options.append(rail_routes(fabric, b[c], nxt[c]))
            sizes.append(nbytes * share / channels)
    cross, _ = choose_routes(
        fabric, options, sizes, sweeps=1, background=[(q, s * nbytes) for q, s in intra]
    )
    for i, b in enumerate(blocks):  # the plan's ring edge from a server's last GPU onwards
        nxt = blocks[(i + 1) % len(blocks)][0]
        paths[b[-1]] = list(
            min(rail_routes(fabric, b[-1], nxt), key=lambda q: fabric.path_time(q, nbytes * share))
        )
    flows = intra + [(r, share / channels) for r in cross]
    n_servers = len(blocks)
    net_hops = 2 * (n_servers - 1)
    chain = (
        (float(steps - net_hops), tuple(range(len(intra))), params.ring_step_nvlink_s),
        (float(net_hops), tuple(range(len(intra), len(flows))), params.ring_step_net_s),
    )
    phase = Phase(flows, steps, params.ring_step_net_s, chain=chain, bottleneck=True)
    return CommPattern("ring", [phase], None, paths)
