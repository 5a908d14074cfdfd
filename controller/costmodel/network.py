"""Communication costs (DESIGN.md §5, paper Eqs. 6-11). Units: bytes, seconds.

Flows of one collective share links: a link that several flows cross in the same direction is
priced at the sum of their bytes over its available bandwidth. A path costs
``sum_e (load(e) / B(e) + latency(e))`` (store and forward).

A collective is described by a :class:`CommPattern`: its flows (each a path and the share of
the message it carries) and how many rounds it takes. Routes are chosen once for a reference
message size; ``CommPattern.time`` then prices the same routes for any size, which is what the
planner's batch search and the simulator need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.topology.fabric import Fabric, Path

T_AGG_S = 1e-6  # aggregation inside the switch, Eq. 8 (paper: about 1 us)


@dataclass(frozen=True)
class NetParams:
    """Latency terms of the alpha-beta model that are not link latencies, and wire formats."""

    ring_step_net_s: float = 4e-6  # NCCL proxy/protocol overhead of a ring step over the network
    ring_step_nvlink_s: float = 1e-6  # same for a step that stays on NVLink
    ina_host_s: float = 4e-6  # host overhead of one INA round (one synchronisation, like a step)
    ina_element_bytes: int = 4  # int32 lanes on the wire (the P4 program aggregates int32)
    dtype_bytes: int = 2  # FP16 activations


def flow_times(fabric: Fabric, flows: Sequence[tuple[Path, float]]) -> list[float]:
    """Time of each flow (path, bytes) when all run at once and share links (Eq. 10 with the
    shared-link rule). O(total hops)."""
    table = fabric.link_table
    load: dict[tuple[str, str], float] = defaultdict(float)
    for path, nbytes in flows:
        for e in zip(path, path[1:], strict=False):
            load[e] += nbytes
    out = []
    for path, _ in flows:
        t = 0.0
        for e in zip(path, path[1:], strict=False):
            inv_bw, lat = table[e]
            t += load[e] * inv_bw + lat
        out.append(t)
    return out


def path_time(fabric: Fabric, path: Path, nbytes: float) -> float:
    """One flow alone: sum over hops of D / B(e) + latency(e) (``flow_times`` of one flow)."""
    table = fabric.link_table
    t = 0.0
    for e in zip(path, path[1:], strict=False):
        inv_bw, lat = table[e]
        t += nbytes * inv_bw + lat
    return t


class _Loads:
    """Link loads of a set of flows with each flow's time kept current, so that trying one
    more route costs O(its hops + flows sharing them) instead of re-pricing every flow."""

    def __init__(self, fabric: Fabric) -> None:
        self.table = fabric.link_table
        self.load: dict[tuple[str, str], float] = defaultdict(float)
        self.on_edge: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.edges: list[list[tuple[str, str]]] = []
        self.nbytes: list[float] = []
        self.times: list[float] = []

    def _time(self, edges: list[tuple[str, str]]) -> float:
        t = 0.0
        for e in edges:
            inv_bw, lat = self.table[e]
            t += self.load[e] * inv_bw + lat
        return t

    def trial(self, path: Path, nbytes: float) -> float:
        """Slowest flow if a flow of ``nbytes`` on ``path`` joined."""
        delta: dict[int, float] = defaultdict(float)
        own = 0.0
        for e in zip(path, path[1:], strict=False):
            inv_bw, lat = self.table[e]
            own += (self.load[e] + nbytes) * inv_bw + lat
            for i in self.on_edge[e]:
                delta[i] += nbytes * inv_bw
        worst = max(self.times, default=0.0)
        for i, d in delta.items():
            worst = max(worst, self.times[i] + d)
        return max(worst, own)

    def _place(self, k: int, edges: list[tuple[str, str]], sign: float) -> None:
        nb = self.nbytes[k] * sign
        for e in edges:
            self.load[e] += nb
            if sign < 0:
                self.on_edge[e].remove(k)
            for i in self.on_edge[e]:
                self.times[i] += nb * self.table[e][0]
            if sign > 0:
                self.on_edge[e].append(k)

    def add(self, path: Path, nbytes: float) -> int:
        k = len(self.edges)
        self.edges.append(list(zip(path, path[1:], strict=False)))
        self.nbytes.append(nbytes)
        self.times.append(0.0)
        self._place(k, self.edges[k], 1.0)
        self.times[k] = self._time(self.edges[k])
        return k

    def move(self, k: int, path: Path) -> None:
        """Re-route flow ``k``."""
        self._place(k, self.edges[k], -1.0)
        self.edges[k] = list(zip(path, path[1:], strict=False))
        self._place(k, self.edges[k], 1.0)
        self.times[k] = self._time(self.edges[k])

    def worst(self) -> float:
        return max(self.times, default=0.0)


def choose_routes(
    fabric: Fabric,
    options: Sequence[Sequence[Path]],
    nbytes: Sequence[float],
    sweeps: int = 2,
    background: Sequence[tuple[Path, float]] = (),
) -> tuple[list[Path], float]:
    """Pick one route per flow so that the slowest flow finishes first.

    Greedy in flow order, then up to ``sweeps`` rounds in which each flow re-picks its route
    given the others. ``background`` flows share the links but are not re-routed. Returns the
    routes and the time of the slowest flow. Each try is priced incrementally (``_Loads``):
    O(sweeps * F * R * (hops + sharing flows)) for F flows with R candidate routes."""
    if any(len(o) == 0 for o in options):
        raise ValueError("a flow has no route")
    state = _Loads(fabric)
    for p, b in background:
        state.add(p, b)
    base = len(background)
    chosen: list[Path] = []
    for opts, nb in zip(options, nbytes, strict=True):
        best = min(opts, key=lambda p: state.trial(p, nb)) if len(opts) > 1 else opts[0]
        chosen.append(best)
        state.add(best, nb)
    for _ in range(sweeps):
        improved = False
        for i, opts in enumerate(options):
            if len(opts) < 2:
                continue
            current = state.worst()
            for p in opts:
                if p is chosen[i]:
                    continue
                old = chosen[i]
                state.move(base + i, p)
                if state.worst() < current - 1e-15:
                    chosen[i], current, improved = p, state.worst(), True
                else:
                    state.move(base + i, old)
        if not improved:
            break
    return chosen, state.worst()


@dataclass
class CommPattern:
    """A collective as flows over fixed routes.

    ``time(D) = rounds * (slowest flow at share * D  +  per_round_s)  +  fixed_s``."""

    scheme: str  # "ina" or "ring"
    flows: list[tuple[Path, float]]  # (route, bytes on it per byte of message)
    rounds: float
    per_round_s: float
    fixed_s: float
    switch: str | None = None
    paths: dict[str, Path] = field(default_factory=dict)  # member -> its route, for the plan

    def time(self, fabric: Fabric, nbytes: float) -> float:
        if not self.flows:
            return 0.0
        slowest = max(flow_times(fabric, [(p, s * nbytes) for p, s in self.flows]))
        return self.rounds * (slowest + self.per_round_s) + self.fixed_s

    def max_path_latency(self, fabric: Fabric) -> float:
        table = fabric.link_table
        return max(
            (sum(table[e][1] for e in zip(p, p[1:], strict=False)) for p, _ in self.flows),
            default=0.0,
        )


def ina_pattern(
    fabric: Fabric, members: Sequence[str], switch: str, nbytes: float, params: NetParams
) -> CommPattern | None:
    """INA all-reduce at ``switch`` (Eqs. 8-10): every member sends its vector, as
    ``ina_element_bytes`` int32 lanes per FP16 element, to the switch over its cheapest route
    given the other members' flows (routes may relay over NVLink when ``fabric.relay``); the
    result returns the same way (full duplex, so T_dis = T_col).
    T_ina = T_col + T_agg + T_dis (+ one host synchronisation). None if a member cannot reach
    the switch."""
    wire = params.ina_element_bytes / params.dtype_bytes
    options = [fabric.routes_to_switch(m, switch) for m in members]
    if any(not o for o in options):
        return None
    routes, _ = choose_routes(fabric, options, [nbytes * wire] * len(members), sweeps=1)
    return CommPattern(
        "ina",
        [(r, wire) for r in routes],
        2,
        0.0,
        T_AGG_S + params.ina_host_s,
        switch,
        dict(zip(members, routes, strict=True)),
    )


def ring_order(fabric: Fabric, members: Sequence[str]) -> list[str]:
    """NCCL's ring order: servers in turn, GPUs in index order inside a server (NVLink)."""
    g = fabric.g
    return sorted(members, key=lambda n: (g.nodes[n].get("server") or "", g.nodes[n]["index"], n))


def rail_routes(fabric: Fabric, src: str, dst: str) -> list[Path]:
    """NCCL's routes for one inter-server channel: leave through the source GPU's own NIC or,
    with PXN, through an NVLink peer's NIC on the destination's rail; arrive at the destination
    GPU's own NIC."""
    if src == dst or fabric.nvlink_path(src, dst) is not None:
        return fabric.routes_between(src, dst)
    own = [f for f in fabric.exits(dst) if len(f) == 2]  # dst's own NICs: [dst, switch]
    rails = {f[-1] for f in own}
    keep = []
    for e in fabric.exits(src):  # (routes_between's order, without building the others)
        if len(e) != 2 and e[-1] not in rails:
            continue  # a peer's NIC that is not on the destination's rail
        for f in own:
            sp = fabric.switch_path(e[-1], f[-1])
            if sp is not None:
                keep.append(e + sp[1:] + f[::-1][1:])
    return keep or fabric.routes_between(src, dst)


def ring_pattern(
    fabric: Fabric, members: Sequence[str], nbytes: float, params: NetParams
) -> CommPattern:
    """Ring all-reduce (Eq. 11 as an alpha-beta model): 2(P-1) steps; in each, every GPU sends
    D/P bytes to its successor, and a step lasts as long as its slowest flow plus the per-step
    latency. Between servers NCCL runs one channel per NIC pair (as many as the smaller side
    has members), each over its cheapest route (PXN may relay over NVLink), so the D/P bytes
    crossing from one server to the next are spread over those NICs."""
    order = ring_order(fabric, members)
    p = len(order)
    if p == 1:
        return CommPattern("ring", [], 0, 0.0, 0.0, None, {})
    g = fabric.g
    blocks: list[list[str]] = []
    for n in order:
        if blocks and g.nodes[blocks[-1][0]].get("server") == g.nodes[n].get("server"):
            blocks[-1].append(n)
        else:
            blocks.append([n])
    share = 1.0 / p
    intra: list[tuple[Path, float]] = []
    paths: dict[str, Path] = {}

    def local(u: str, v: str) -> Path:
        return fabric.nvlink_path(u, v) or min(fabric.routes_between(u, v), key=len)

    for b in blocks:
        for u, v in zip(b, b[1:], strict=False):
            paths[u] = local(u, v)
            intra.append((paths[u], share))
    if len(blocks) == 1:
        paths[order[-1]] = local(order[-1], order[0])
        intra.append((paths[order[-1]], share))
        return CommPattern("ring", intra, 2 * (p - 1), params.ring_step_nvlink_s, 0.0, None, paths)
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
        paths[b[-1]] = min(
            rail_routes(fabric, b[-1], nxt), key=lambda q: path_time(fabric, q, nbytes * share)
        )
    flows = intra + [(r, share / channels) for r in cross]
    return CommPattern("ring", flows, 2 * (p - 1), params.ring_step_net_s, 0.0, None, paths)
