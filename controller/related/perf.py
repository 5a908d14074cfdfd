"""The performance model every seed planner prices its nodes with: a *node* is a
tensor-parallel group of GPUs inside one server (all three papers keep TP inside a machine)
that runs prefill and decode iterations of some of the model's layers on the same GPUs, with
continuous batching (vLLM).

It is the project's cost model (``controller.costmodel``), not a new one, so that every
planner is priced on one model of the cluster:

- compute per layer is Eqs. 12-13 (``compute.prefill_layer_time``, ``decode_layer_time``)
  with the GPU's roofline coefficients; an iteration that mixes prefill and decode tokens
  (vLLM's continuous batching, Helix's dynamic batching) shares the weight read and the
  GEMMs: ``max(C4 W, C1 W (K_in + B)) / TP + C2 / (b TP) 3h K2 + C5 / TP 3 h_kv K_ctx +
  max(C3, C6)``, which is exactly Eq. 12 when B = 0 and exactly Eq. 13 when K_in = 0;
- TP all-reduces are the NCCL ring of ``costmodel.ring.ring_pattern`` over the server's
  NVLink (or PCIe), two per layer of (K_in + B) tokens x h x 2 bytes;
- KV cache room is ``r_frac`` of the group's memory minus the weights of its layers and one
  embedding matrix (the first node holds the token embedding, the last the LM head).

Units: seconds, bytes, tokens, tokens/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

from controller.costmodel.compute import (
    ComputeCoefficients,
    decode_layer_time,
    default_coefficients,
    layer_weights,
    prefill_layer_time,
)
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import path_time
from controller.costmodel.ring import ring_pattern
from controller.errors import InputError
from controller.models.gpus import gpu_spec
from controller.models.specs import ModelSpec
from controller.topology.fabric import Fabric
from controller.units import GB

TOKEN_ID_BYTES = 4  # a token id between the coordinator and a node (Helix Fig. 2: 4 bytes)


@dataclass(frozen=True)
class LengthStats:
    """Length statistics of a set of requests, tokens."""

    mean_in: float
    mean_in2: float  # E[l_in^2], Eq. 12's K2 per request
    mean_out: float
    ctx: float  # time-average KV tokens of a decoding request, E[o (l + o/2)] / E[o]
    max_context: int  # longest prompt + output: a node must hold one such request
    count: int = 0  # requests these statistics describe

    @classmethod
    def of(cls, inputs: Sequence[int] | np.ndarray, outputs: Sequence[int] | np.ndarray):
        i = np.asarray(inputs, dtype=float)
        o = np.asarray(outputs, dtype=float)
        if i.size == 0 or i.size != o.size:
            raise InputError("length statistics need as many inputs as outputs, at least one")
        return cls(
            float(i.mean()),
            float(np.mean(i * i)),
            float(o.mean()),
            float(np.sum(o * (i + o / 2)) / max(np.sum(o), 1.0)),
            int(np.max(i + o)),
            int(i.size),
        )

    @property
    def tokens(self) -> float:
        """Tokens a request passes through a node: its prompt once and each output token."""
        return self.mean_in + self.mean_out


@dataclass(frozen=True)
class NodeHW:
    """A tensor-parallel group: its GPUs (one server), the slowest GPU type (its
    coefficients price compute) and the smallest GPU memory (each GPU holds 1/TP)."""

    gpus: tuple[str, ...]
    gpu_type: str
    memory_bytes: float

    @property
    def tp(self) -> int:
        return len(self.gpus)


def node_hw(g: nx.Graph, gpus: Sequence[str]) -> NodeHW:
    """The NodeHW of ``gpus`` in cluster ``g``; they must share one server."""
    if not gpus:
        raise InputError("a node needs at least one GPU")
    servers = {g.nodes[x].get("server") for x in gpus}
    if len(servers) != 1:
        raise InputError(f"node {','.join(gpus)} spans servers {sorted(map(str, servers))}")
    types = [g.nodes[x]["gpu_type"] for x in gpus]
    slowest = min(types, key=lambda t: gpu_spec(t).fp16_flops)
    mem = min(g.nodes[x]["memory_gb"] for x in gpus) * GB
    return NodeHW(tuple(gpus), slowest, mem)


@dataclass(frozen=True)
class Connection:
    """The best route between two nodes: its path, bottleneck bandwidth and latency."""

    path: tuple[str, ...]
    bandwidth: float  # bytes/s, the smallest available bandwidth on the path
    latency_s: float


class PerfModel:
    """Prices nodes of ``model`` on cluster ``g``. ``r_frac``: fraction of a GPU's memory
    the serving engine may use (PlannerOptions.r_frac); ``max_batch``: most requests decoding
    at once on a node (PlannerOptions.max_batch)."""

    def __init__(
        self, g: nx.Graph, model: ModelSpec, *, r_frac: float = 0.9, max_batch: int = 512
    ) -> None:
        if not 0 < r_frac <= 1:
            raise InputError(f"memory fraction must be in (0, 1], got {r_frac}")
        if max_batch < 1:
            raise InputError(f"max batch must be at least 1, got {max_batch}")
        self.g = g
        self.model = model
        self.r_frac = r_frac
        self.max_batch = max_batch
        self.net = NetParams()
        self._coeffs: dict[str, ComputeCoefficients] = {}
        self._ar: dict[tuple[str, ...], tuple[float, float]] = {}
        self._conn: dict[tuple[str, str], Connection | None] = {}
        # (src exits, dst exits) -> which (exit, exit) pair the best route takes (``_route``)
        self._best_exits: dict[tuple, tuple[int, int] | None] = {}
        self._exit_keys: dict[str, int] = {}  # GPU -> the number of its exits' shape
        self._exit_ids: dict[tuple, int] = {}
        self._key_bw: dict[tuple, float | None] = {}  # (src exits, dst exits) -> bandwidth

    @cached_property
    def fabric(self) -> Fabric:
        return Fabric(self.g, relay=True)

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def layer_bytes(self) -> float:
        """Weights of one transformer layer, bytes."""
        return layer_weights(self.model) * self.model.dtype_bytes

    @cached_property
    def embedding_bytes(self) -> float:
        return self.model.vocab * self.model.hidden * self.model.dtype_bytes

    @cached_property
    def activation_bytes(self) -> float:
        """One token's activation between pipeline stages: h x dtype bytes."""
        return self.model.hidden * self.model.dtype_bytes

    def kv_bytes_per_token(self, layers: float) -> float:
        """KV cache of one token over ``layers`` layers (all TP shards together)."""
        return 2.0 * self.model.kv_dim * self.model.dtype_bytes * layers

    def kv_room(self, node: NodeHW, layers: float) -> float:
        """Bytes of KV cache the node holds beside the weights of ``layers`` layers."""
        usable = node.tp * self.r_frac * node.memory_bytes
        return usable - layers * self.layer_bytes - self.embedding_bytes

    def kv_tokens(self, node: NodeHW, layers: float) -> float:
        """KV room in tokens of ``layers`` layers (0 when the weights leave no room)."""
        if layers <= 0:
            return math.inf
        return max(0.0, self.kv_room(node, layers)) / self.kv_bytes_per_token(layers)

    def max_layers(self, node: NodeHW, max_context: int) -> int:
        """Most layers the node holds with room for one request of ``max_context`` tokens."""
        best = 0
        for j in range(1, self.model.layers + 1):
            if self.kv_tokens(node, j) >= max_context:
                best = j
            else:
                break
        return best

    # -- compute -------------------------------------------------------------------------
    def coeffs(self, gpu_type: str) -> ComputeCoefficients:
        if gpu_type not in self._coeffs:
            self._coeffs[gpu_type] = default_coefficients(gpu_type, self.model.dtype_bytes)
        return self._coeffs[gpu_type]

    def _allreduce_terms(self, node: NodeHW) -> tuple[float, float]:
        """(a, b): one all-reduce of D bytes costs a + b D on the node's ring. Inside one
        server the ring's flows are symmetric, so its time is affine in D (priced at two
        sizes on the routes chosen at 1 MB)."""
        hit = self._ar.get(node.gpus)
        if hit is None:
            if node.tp == 1:
                hit = (0.0, 0.0)
            else:
                ref = 1e6
                pat = ring_pattern(self.fabric, list(node.gpus), ref, self.net)
                t1 = pat.time(self.fabric, ref)
                t0 = pat.time(self.fabric, 0.0)
                hit = (t0, (t1 - t0) / ref)
            self._ar[node.gpus] = hit
        return hit

    def layer_time(
        self, node: NodeHW, k_in: float, k_in2: float, batch: float, k_ctx: float
    ) -> float:
        """One layer of an iteration with ``k_in`` prompt tokens (``k_in2`` = sum of their
        squared lengths) and ``batch`` decoding requests holding ``k_ctx`` context tokens,
        plus its two TP all-reduces, s."""
        co = self.coeffs(node.gpu_type)
        m, tp = self.model, node.tp
        if batch <= 0:
            t = prefill_layer_time(co, m, tp, k_in, k_in2) if k_in > 0 else 0.0
        elif k_in <= 0:
            t = decode_layer_time(co, m, tp, batch, k_ctx)
        else:
            w = layer_weights(m)
            t = (
                max(co.c4 * w, co.c1 * w * (k_in + batch)) / tp
                + co.c2 / (co.block * tp) * 3 * m.hidden * k_in2
                + co.c5 / tp * 3 * m.kv_dim * k_ctx
                + max(co.c3, co.c6)
            )
        if tp > 1 and (k_in + batch) > 0:
            a, b = self._allreduce_terms(node)
            t += 2 * (a + b * (k_in + batch) * self.activation_bytes)
        return t

    def step_time(
        self,
        node: NodeHW,
        layers: float,
        k_in: float = 0.0,
        k_in2: float = 0.0,
        batch: float = 0.0,
        k_ctx: float = 0.0,
    ) -> float:
        """One iteration over ``layers`` layers, s."""
        return layers * self.layer_time(node, k_in, k_in2, batch, k_ctx)

    # -- steady state --------------------------------------------------------------------
    def concurrency(self, node: NodeHW, layers: float, stats: LengthStats) -> int:
        """Requests decoding at once: as many as the KV room holds at their time-average
        context, at most ``max_batch``."""
        tok = self.kv_tokens(node, layers)
        if not math.isfinite(tok):
            return self.max_batch
        return int(min(self.max_batch, tok // max(stats.ctx, 1.0)))

    def request_time(
        self, node: NodeHW, layers: float, stats: LengthStats, batch: int | None = None
    ) -> float:
        """Node time one mean request costs on ``layers`` layers at steady state: its prefill
        plus ``mean_out`` decode steps, each shared by ``batch`` requests (default: the
        KV-bound concurrency). Infinite when no request fits."""
        b = self.concurrency(node, layers, stats) if batch is None else batch
        if b < 1:
            return math.inf
        pre = self.step_time(node, layers, stats.mean_in, stats.mean_in2)
        step = self.step_time(node, layers, 0.0, 0.0, b, b * stats.ctx)
        return pre + stats.mean_out * step / b

    def tokens_per_s(self, node: NodeHW, layers: float, stats: LengthStats) -> float:
        """Helix's T_j: tokens (prompt and output) per second the node passes through
        ``layers`` layers at steady state."""
        t = self.request_time(node, layers, stats)
        return stats.tokens / t if math.isfinite(t) and t > 0 else 0.0

    # -- network -------------------------------------------------------------------------
    def connection(self, a: NodeHW, b: NodeHW) -> Connection | None:
        """Best route from node ``a`` to node ``b`` (first GPU to first GPU: after its
        all-reduce every GPU of a stage holds the activation): NVLink inside a server,
        otherwise the route that moves 1 MB fastest."""
        key = (a.gpus[0], b.gpus[0])
        if key not in self._conn:
            self._conn[key] = self._connection(*key)
        return self._conn[key]

    def _connection(self, src: str, dst: str) -> Connection | None:
        fab = self.fabric
        if src == dst:
            return Connection((src,), math.inf, 0.0)
        if fab.nvlink_path(src, dst) is not None:
            routes = fab.routes_between(src, dst)
            best = min(routes, key=lambda p: path_time(fab, p, 1e6))
        else:
            best = self._route(src, dst)
            if best is None:
                return None
        table = fab.link_table
        hops = list(zip(best, best[1:], strict=False))
        bw = min(1.0 / table[e][0] for e in hops)
        lat = sum(table[e][1] for e in hops)
        return Connection(tuple(best), bw, lat)

    def bandwidth(self, a: NodeHW, b: NodeHW) -> float | None:
        """``connection(a, b).bandwidth`` (None: no route), without building the route when
        the nodes are on different servers: the route's links are those of the pair of exit
        shapes it leaves and enters by (``_route``), so the figure is kept per such pair.
        Helix asks it for every ordered pair of 1,200 servers."""
        src, dst = a.gpus[0], b.gpus[0]
        server = self._servers
        if src == dst or server[src] is None or server[src] == server[dst]:
            c = self.connection(a, b)
            return None if c is None else c.bandwidth
        key = (self._exit_key(src), self._exit_key(dst))
        if key not in self._key_bw:
            path = self._route(src, dst)
            table = self.fabric.link_table
            self._key_bw[key] = (
                None
                if path is None
                else min(1.0 / table[e][0] for e in zip(path, path[1:], strict=False))
            )
        return self._key_bw[key]

    @cached_property
    def _servers(self) -> dict[str, str | None]:
        return {n: d.get("server") for n, d in self.g.nodes(data=True)}

    def _exit_key(self, gpu: str) -> int:
        """``gpu``'s exits as the switch each reaches and its links' (1/B, latency): what a
        route through them costs, whichever GPU it starts from. Numbered, so that a pair of
        them hashes in O(1)."""
        hit = self._exit_keys.get(gpu)
        if hit is None:
            table = self.fabric.link_table
            shape = tuple(
                (e[-1], tuple(table[x] for x in zip(e, e[1:], strict=False)))
                for e in self.fabric.exits(gpu)
            )
            hit = self._exit_keys[gpu] = self._exit_ids.setdefault(shape, len(self._exit_ids))
        return hit

    def _route(self, src: str, dst: str) -> list[str] | None:
        """The route between two GPUs of different servers that moves 1 MB fastest: the first
        of ``Fabric.routes_between``'s (an exit of src, a switch path, an exit of dst back)
        with the least ``path_time``. A route's time is a function of its links' (1/B,
        latency) alone, so pairs whose exits reach the same switches over links of the same
        figures (``_exit_key``) choose the same pair of exits: it is found once for them, which
        takes Helix's all-pairs connections on 1,200 servers from O(pairs x exits^2) routes
        priced to O(pod pairs x exits^2)."""
        fab = self.fabric
        key = (self._exit_key(src), self._exit_key(dst))
        if key not in self._best_exits:
            pick, best_t = None, math.inf
            for i, e in enumerate(fab.exits(src)):
                for j, f in enumerate(fab.exits(dst)):
                    sp = fab.flow_switch_path(e[-1], f[-1], src)
                    if sp is None:
                        continue
                    t = path_time(fab, e + sp[1:] + f[::-1][1:], 1e6)
                    if pick is None or t < best_t:  # the first of equal times, as min()
                        pick, best_t = (i, j), t
            self._best_exits[key] = pick
        pick = self._best_exits[key]
        if pick is None:
            return None
        e, f = fab.exits(src)[pick[0]], fab.exits(dst)[pick[1]]
        sp = fab.flow_switch_path(e[-1], f[-1], src)
        assert sp is not None
        return e + sp[1:] + f[::-1][1:]

    def nic_bandwidth(self, node: NodeHW) -> float:
        """The node's bandwidth to the rest of the cluster (its first GPU's fastest
        Ethernet port; the coordinator's messages take it)."""
        g = self.g
        first = node.gpus[0]
        bws = [
            g.edges[first, v]["available"]
            for v in g.neighbors(first)
            if g.edges[first, v]["link"] == "ethernet"
        ]
        return max(bws) if bws else math.inf
