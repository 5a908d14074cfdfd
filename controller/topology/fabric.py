"""Routes over the cluster graph (Alg. 2 lines 1-3 of the paper), and how a path is priced.

Shortest paths between switches are computed with Dijkstra over the switch tier, from each
source switch when a route first needs it (scipy's C implementation; O((S + E_s) log S) per
source for S switches and E_s links between them; once per bandwidth update), weighted by the
store-and-forward cost of a reference message, ``ref_bytes / B(e) + latency(e)`` (an additive
proxy in either cost mode: a pipelined price is not additive over hops). A GPU leaves the GPU
tier through an *exit*: one of its own NIC ports, or, when NVLink relay is allowed, the NIC
port of an NVLink peer reached over the server's NVLink fabric (the paper's key idea, Fig. 2).
Every route is an exit followed by a switch path; candidate routes per GPU are few (one per NIC
in its server), so the load-aware choice among them is cheap. A route between GPUs of two
servers (``flow_switch_path``) takes one of the equal shortest switch paths by a hash of its
source and destination switch, as a fabric's ECMP spreads flows; the other callers take the
predecessor matrix's one (``switch_path``).

The Fabric carries the *cost mode* (docs/costmodel.md), so every path price goes through it:

``pipelined`` (default)  NICs and switches forward packet by packet: a flow whose links carry
    ``load(e)`` bytes takes ``max_e load(e) / B(e) + sum_e latency(e) + packet * (sum_e 1/B(e)
    - max_e 1/B(e))``, the last term one packet's serialisation on every hop but the slowest
    (``(hops - 1) * packet / B`` on equal links; exact for a lone flow).
``paper``  the HeroServe paper's store and forward, ``sum_e (load(e) / B(e) + latency(e))``
    (Eq. 10; Fig. 2's 160 / 90 us).

Either way a flow's time is affine in the bytes when every load scales with the message, which
is what lets a collective be priced once per route choice and re-priced at any size.
``hop_sums`` and ``pipelined_time`` price a route from a prefix's sums carried on over the rest
of its hops, the same floats as ``path_time``, so callers that try many routes sharing a
prefix (KV routes, routes to an INA switch) keep the prefix's sums instead of each route.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from functools import cached_property

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from controller.errors import InputError
from controller.topology.costmodes import COST_MODES, PIPELINED, ROCE_MTU_BYTES
from controller.topology.costmodes import PAPER as PAPER  # named here too (tests, callers)
from controller.topology.graph import GPU, SWITCH, nic_switches, servers
from controller.units import MB

Path = list[str]
Edge = tuple[str, str]

# equal-cost switch paths: within this relative cost of the shortest (float sums of equal
# links differ in the last bits), at most this many per pair (a full mesh of c core switches
# between two access switches of u uplinks each has u * u; the paper's clusters have 16)
ECMP_TOLERANCE = 1e-9
ECMP_MAX_PATHS = 64


class Fabric:
    """Candidate routes in ``g`` and their prices. ``relay`` allows NVLink detours to a peer's
    NIC; ``cost_mode`` (``pipelined`` or ``paper``) and ``packet_bytes`` (the packet a
    pipelined hop serialises before forwarding) set how a path is priced."""

    def __init__(
        self,
        g: nx.Graph,
        *,
        relay: bool = True,
        ref_bytes: float = MB,
        cost_mode: str = PIPELINED,
        packet_bytes: float = ROCE_MTU_BYTES,
    ) -> None:
        if cost_mode not in COST_MODES:
            raise InputError(f"cost mode must be one of {', '.join(COST_MODES)}, got {cost_mode!r}")
        if not packet_bytes > 0:
            raise InputError(f"packet size must be positive, got {packet_bytes!r}")
        self.g = g
        self.relay = relay
        self.ref_bytes = ref_bytes
        self.cost_mode = cost_mode
        self.pipelined = cost_mode == PIPELINED
        self.packet_bytes = float(packet_bytes)
        self._server_gpus = servers(g)
        # node -> its server (None off servers): read once, not through networkx's views
        self._server_of: dict[str, str | None] = dict(g.nodes(data="server"))
        self._nv_cache: dict[tuple[str, str], Path] = {}
        self._exit_cache: dict[str, list[Path]] = {}
        self._sp_cache: dict[tuple[str, str], Path | None] = {}
        self._rts_cache: dict[tuple[str, str], list[Path]] = {}
        # per-fabric memo of route lists and route shapes, for the cost model: routes are
        # never modified once built, so callers share them
        self.memo: dict[object, object] = {}
        sw = [n for n, d in g.nodes(data=True) if d["kind"] == SWITCH]
        self.switch_index = {s: i for i, s in enumerate(sorted(sw))}
        self.switch_names = sorted(sw)
        rows, cols, w = [], [], []
        for a, b, d in g.edges(data=True):
            if a in self.switch_index and b in self.switch_index:
                cost = ref_bytes / d["available"] + d["latency_s"]
                rows += [self.switch_index[a], self.switch_index[b]]
                cols += [self.switch_index[b], self.switch_index[a]]
                w += [cost, cost]
        self._ecmp_cache: dict[tuple[str, str], tuple[Path, ...]] = {}
        n = len(sw)
        m = csr_matrix((w, (rows, cols)), shape=(n, n)) if n else csr_matrix((0, 0))
        # each switch's neighbours (indices, in name order) and link costs are its row: the
        # equal-cost paths' next hops are one vectorised test over it
        self._switch_graph = m.sorted_indices()
        # each source switch's shortest paths (distances, predecessors), found when first
        # asked (``_row``): all pairs at once took minutes holding the GIL (the progress
        # line fell silent) and n^2 x 12 bytes at 8,192 servers, where a plan asks for the
        # rows of the switches its routes start or end at
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Switch ``i``'s distances to every switch (link cost ``ref_bytes / available +
        latency``) and its shortest-path predecessors (scipy's Dijkstra from ``i`` alone:
        the row the all-pairs run gave). O(E log V) once per source."""
        hit = self._rows.get(i)
        if hit is None:
            d, p = dijkstra(self._switch_graph, directed=False, indices=[i],
                            return_predecessors=True)  # fmt: skip
            hit = self._rows[i] = (d[0], p[0])
        return hit

    # -- switch tier ---------------------------------------------------------------------
    def switch_path(self, a: str, b: str) -> Path | None:
        """Shortest switch path a..b (inclusive), or None when unreachable."""
        key = (a, b)
        hit = self._sp_cache.get(key)
        if hit is not None or key in self._sp_cache:
            return hit
        self._sp_cache[key] = path = self._switch_path(a, b)
        return path

    def _switch_path(self, a: str, b: str) -> Path | None:
        i, j = self.switch_index[a], self.switch_index[b]
        if i == j:
            return [a]
        dist, pred = self._row(i)
        if not np.isfinite(dist[j]):
            return None
        out = [b]
        k = j
        while k != i:
            k = int(pred[k])
            out.append(self.switch_names[k])
        return out[::-1]

    def switch_paths(self, a: str, b: str) -> tuple[Path, ...]:
        """Every shortest switch path a..b (cost within ``ECMP_TOLERANCE`` of the shortest),
        in the order of the switches' names, at most ``ECMP_MAX_PATHS``; () when unreachable.
        O(paths * hops * degree), memoised per pair."""
        key = (a, b)
        hit = self._ecmp_cache.get(key)
        if hit is None:
            hit = self._ecmp_cache[key] = self._switch_paths(a, b)
        return hit

    def _switch_paths(self, a: str, b: str) -> tuple[Path, ...]:
        i, j = self.switch_index[a], self.switch_index[b]
        dist = self._row(j)[0]  # every switch's distance to b (the links are undirected)
        if not np.isfinite(dist[i]):
            return ()
        out: list[Path] = []
        stack = [[i]]
        while stack and len(out) < ECMP_MAX_PATHS:
            path = stack.pop()
            k = path[-1]
            if k == j:
                out.append([self.switch_names[x] for x in path])
                continue
            row = slice(self._switch_graph.indptr[k], self._switch_graph.indptr[k + 1])
            nbrs, cost = self._switch_graph.indices[row], self._switch_graph.data[row]
            on = np.abs(cost + dist[nbrs] - dist[k]) <= ECMP_TOLERANCE * dist[k]
            stack.extend(path + [int(n)] for n in nbrs[on][::-1])  # popped in name order
        return tuple(out)

    def flow_switch_path(self, a: str, b: str, flow: str) -> Path | None:
        """The shortest switch path a..b that a flow named ``flow`` takes: a fabric spreads
        flows over its equal-cost paths by a hash of their headers (ECMP), here CRC-32 of
        ``flow`` and ``b`` (stable across runs and processes, unlike ``hash``). One path per
        (flow, b), so every flow to one switch from one source shares it."""
        paths = self.switch_paths(a, b)
        if not paths:
            return None
        if len(paths) == 1:
            return paths[0]
        return paths[zlib.crc32(f"{flow}>{b}".encode()) % len(paths)]

    # -- GPU tier ------------------------------------------------------------------------
    def nvlink_path(self, a: str, b: str) -> Path | None:
        """Path between two GPUs of one server over NVLink/PCIe (no switch): through the
        server's NVSwitch (or PCIe) fabric node, or the direct link of a mesh board. Never
        through a third GPU: a GPU does not forward NVLink traffic between its peers."""
        if a == b:
            return [a]
        key = (a, b)
        if key not in self._nv_cache:
            server = self._server_of.get(a)
            if server is None:
                server = self.g.nodes[a]["server"]  # not a server's GPU: raises, as it did
            if self._server_of.get(b) != server:
                return None
            self._nv_cache[key] = self._nvlink_path(a, b)  # type: ignore[assignment]
        return self._nv_cache[key]

    def _nvlink_path(self, a: str, b: str) -> Path | None:
        """The shortest path a..b through the two GPUs' own non-switch, non-GPU neighbours
        (an NVSwitch, a PCIe hub), or the direct link of a mesh board: never through a third
        GPU. A direct link, or a single common neighbour (a server's NVSwitch), is the only
        shortest path there is, so it is taken without a search; otherwise networkx's BFS
        picks among ties."""
        g = self.g
        if g.has_edge(a, b):
            return [a, b]
        via = [
            x
            for x in g.neighbors(a)
            if g.nodes[x]["kind"] not in (SWITCH, GPU) and g.has_edge(x, b)
        ]
        if len(via) == 1:
            return [a, via[0], b]
        local = [n for n in g.neighbors(a)] + [n for n in g.neighbors(b)]
        sub = g.subgraph({a, b} | {n for n in local if g.nodes[n]["kind"] not in (SWITCH, GPU)})
        try:
            return nx.shortest_path(sub, a, b)
        except nx.NetworkXNoPath:
            return None

    def peers(self, gpu: str) -> list[str]:
        return self._server_gpus.get(self.g.nodes[gpu].get("server"), [gpu])

    def exits(self, gpu: str) -> list[Path]:
        """Ways out of the GPU tier: each a path gpu .. access switch."""
        if gpu not in self._exit_cache:
            out: list[Path] = []
            relays = self.peers(gpu) if self.relay else [gpu]
            for x in relays:
                nv = self.nvlink_path(gpu, x)
                if nv is None:
                    continue
                out += [nv + [a] for a in nic_switches(self.g, x)]
            self._exit_cache[gpu] = out
        return self._exit_cache[gpu]

    def routes_to_switch(self, gpu: str, switch: str) -> list[Path]:
        """Every exit of ``gpu`` followed by the switch path to ``switch`` (shared, read-only
        lists, built once)."""
        key = (gpu, switch)
        out = self._rts_cache.get(key)
        if out is None:
            out = []
            for e in self.exits(gpu):
                sp = self.switch_path(e[-1], switch)
                if sp is not None:
                    out.append(e + sp[1:])
            self._rts_cache[key] = out
        return out

    def routes_between(self, src: str, dst: str) -> list[Path]:
        """Candidate routes from GPU src to GPU dst: NVLink inside a server, otherwise an exit
        of src, the switch path its flows take (``flow_switch_path``), and the reverse of an
        exit of dst."""
        if src == dst:
            return [[src]]
        nv = self.nvlink_path(src, dst)
        if nv is not None:
            return [nv]
        out = []
        for e in self.exits(src):
            for f in self.exits(dst):
                sp = self.flow_switch_path(e[-1], f[-1], src)
                if sp is not None:
                    out.append(e + sp[1:] + f[::-1][1:])
        return out

    @cached_property
    def link_table(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(u, v) -> (1 / B(e), latency) in both directions, for fast pricing."""
        out = {}
        for a, b, d in self.g.edges(data=True):
            out[(a, b)] = out[(b, a)] = (1.0 / d["available"], d["latency_s"])
        return out

    # -- prices (module docstring) -------------------------------------------------------
    def fixed_s(self, edges: list[Edge], packet_bytes: float | None = None) -> float:
        """The part of a flow's time that does not grow with its bytes: the hops' latencies
        and, pipelined, one packet's serialisation on every hop but the slowest."""
        table = self.link_table
        lat = 0.0
        if not self.pipelined:
            for e in edges:
                lat += table[e][1]
            return lat
        return self.fixed_from_sums(self.hop_sums(edges), packet_bytes)

    def fixed_from_sums(
        self, sums: tuple[float, float, float], packet_bytes: float | None = None
    ) -> float:
        """``fixed_s`` of a route on a pipelined fabric from its ``hop_sums``."""
        lat, inv_sum, inv_max = sums
        pkt = self.packet_bytes if packet_bytes is None else packet_bytes
        return lat + pkt * (inv_sum - inv_max)

    def hop_sums(
        self, edges: Iterable[Edge], start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ) -> tuple[float, float, float]:
        """(latency sum, 1/B sum, 1/B max) over ``edges``, carried on from ``start``, hop by
        hop: the sums of a route are its prefix's sums carried on over the rest, float for
        float, so callers keep a prefix's sums and price its many continuations."""
        table = self.link_table
        lat, inv_sum, inv_max = start
        for e in edges:
            inv, le = table[e]
            lat += le
            inv_sum += inv
            if inv > inv_max:
                inv_max = inv
        return lat, inv_sum, inv_max

    def pipelined_time(self, sums: tuple[float, float, float], nbytes: float) -> float:
        """``path_time`` of ``nbytes >= 0`` alone on a pipelined route from its ``hop_sums``:
        ``max_e(D / B(e)) = D * max_e(1 / B(e))`` (rounding is monotone), plus ``fixed_s``."""
        lat, inv_sum, inv_max = sums
        return nbytes * inv_max + (lat + self.packet_bytes * (inv_sum - inv_max))

    def combine(self, terms: list[float]) -> float:
        """Seconds a flow spends moving its bytes, from each hop's ``load(e) / B(e)``: the
        slowest hop (pipelined) or their sum (paper)."""
        if not terms:
            return 0.0
        return max(terms) if self.pipelined else sum(terms)

    def path_time(self, path: Path, nbytes: float, packet_bytes: float | None = None) -> float:
        """One flow of ``nbytes`` alone on ``path``."""
        edges = list(zip(path, path[1:], strict=False))
        table = self.link_table
        return self.combine([nbytes * table[e][0] for e in edges]) + self.fixed_s(
            edges, packet_bytes
        )

    def is_gpu(self, n: str) -> bool:
        return self.g.nodes[n]["kind"] == GPU
