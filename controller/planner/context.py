"""What every pricer of the evaluator reads, for one problem and one policy, fixed at its start.

``PricingContext`` (frozen) holds the problem, the policy, the cluster and its fabrics (the
ring's, which may relay over NVLink; the Ethernet-only one; the one INA uses under the
policy), the model, the workload's means and its prompt lengths, the server maps; and the
small lookups every pricer uses, each memoised here because no pricer's choices change them:
message sizes (docs/design.md §5), compute coefficients per GPU type, the slowest GPU type of
a set, ``shape_signature`` of groups, a pool's (memory, GPU type) counts, the GPUs of a pool
that fit a weight shard, and the grouping's pod caches.

Nothing here changes a price once built: state that does (the groups forced onto the ring,
a made plan's chosen schemes) belongs to ``allreduce.AllReducePricer``. The pricers built on
it are in ``allreduce``, ``pipeline``, ``instances``, ``kvtransfer`` and ``phases``;
``evaluate.Evaluator`` joins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from controller.costmodel.compute import ComputeCoefficients, default_coefficients
from controller.costmodel.netparams import NetParams
from controller.models import ModelSpec
from controller.models.gpus import gpu_spec
from controller.planner.grouping import shape_signature
from controller.planner.options import Policy, Problem
from controller.topology.fabric import Fabric
from controller.topology.graph import servers
from controller.units import GB


@dataclass(frozen=True, eq=False)
class PricingContext:
    """One problem and one policy, with the lookups shared by the evaluator's pricers
    (module docstring). Build it with ``PricingContext.of``."""

    problem: Problem
    policy: Policy
    g: nx.Graph
    net: NetParams
    ring_fabric: Fabric  # NCCL's PXN may relay over NVLink
    eth_fabric: Fabric  # Ethernet-only routes
    ina_fabric: Fabric  # the one INA is routed on under the policy
    model: ModelSpec
    mean_in: float
    mean_in2: float
    decode_steps: float  # tokens a decode instance makes per request
    kv_tokens: float  # the prompt a KV transfer carries (mean over the requests that make one)
    kv_share: float  # the share of requests that make a KV transfer
    mean_kv_tokens: float  # a decode step's mean context
    # the workload's prompt lengths and the share of requests of each
    input_lengths: tuple[np.ndarray, np.ndarray]
    server_gpus: dict[str, list[str]]
    # node -> its server (None: not a server's), read in the hot loops as a plain dict
    # (networkx's node views cost a call per lookup)
    server_of: dict[str, str | None]
    memory_gb: dict[str, float]  # GPU -> its memory (``fit``'s and the KV room's hot loops)
    # memo: one entry per GPU type asked: at most the cluster's GPU types
    _coeffs: dict[str, ComputeCoefficients] = field(default_factory=dict, repr=False)
    # memo: one entry per distinct tuple of parts asked (a group, a hop's two stages, an
    # instance's stages): at most the groups, stage pairs and instances one search prices
    _shapes: dict[tuple, tuple] = field(default_factory=dict, repr=False)
    # memo: one dict per grouping tag (grouping, TP, message size), each one entry per
    # distinct pod signature: at most tags x the cluster's pod classes
    _grouping_caches: dict[tuple, dict] = field(default_factory=dict, repr=False)
    # memo: one entry per distinct pool asked: at most the role splits' pools of one search
    _pool_summaries: dict[frozenset, dict[tuple[float, str], int]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(cls, problem: Problem, policy: Policy) -> PricingContext:
        """The context of ``problem`` under ``policy``: its fabrics (built by the problem's
        first context, ``Problem.fabrics``), its workload's means read once."""
        g = problem.cluster
        net = problem.options.net
        fabrics = problem.fabrics
        if not fabrics:
            fabrics[True] = net.fabric(g, relay=True)
            fabrics[False] = net.fabric(g, relay=False)
        ring, eth = fabrics[True], fabrics[False]
        w = problem.workload
        lengths, counts = np.unique(np.asarray(w.inputs, dtype=float), return_counts=True)
        return cls(
            problem=problem,
            policy=policy,
            g=g,
            net=net,
            ring_fabric=ring,
            eth_fabric=eth,
            ina_fabric=ring if policy.ina_relay else eth,
            model=problem.model,
            mean_in=w.mean_input,
            mean_in2=w.mean_input_sq,
            decode_steps=w.mean_decode_steps,
            kv_tokens=w.mean_kv_transfer_tokens,
            kv_share=w.decode_share,
            mean_kv_tokens=w.mean_kv_tokens,
            input_lengths=(lengths, counts / counts.sum()),
            server_gpus=servers(g),
            server_of=dict(g.nodes(data="server")),
            memory_gb={n: d for n, d in g.nodes(data="memory_gb") if d is not None},
        )

    def grouping_cache(self, key: tuple) -> dict:
        """A pod-signature cache for one way of grouping (``grouping.by_pods``), kept for the
        evaluator's life so the role splits of one search group each distinct pod once."""
        return self._grouping_caches.setdefault(key, {})

    def server_node(self, x: str) -> str:
        """``x``'s server, or ``x`` itself for a node outside servers."""
        return self.server_of.get(x) or x

    # -- sizes ---------------------------------------------------------------------------
    def activation_bytes(self, tokens: float) -> float:
        """One all-reduce moves tokens * h * dtype bytes per GPU (docs/design.md §5)."""
        return tokens * self.model.hidden * self.model.dtype_bytes

    def prefill_bytes(self) -> float:
        """The all-reduce message of one mean-length prompt."""
        return self.activation_bytes(self.mean_in)

    # -- GPUs ----------------------------------------------------------------------------
    def coeffs(self, gpu_type: str) -> ComputeCoefficients:
        """The compute model's coefficients for ``gpu_type`` (Eqs. 12-13): fitted to the
        engine profile the options carry for it, else the datasheet's; memoised."""
        if gpu_type not in self._coeffs:
            fitted = dict(self.problem.options.compute).get(gpu_type)  # an engine profile's
            self._coeffs[gpu_type] = fitted or default_coefficients(
                gpu_type, self.model.dtype_bytes
            )
        return self._coeffs[gpu_type]

    def slowest_type(self, members: Sequence[str]) -> str:
        """The GPU type of ``members`` with the least FP16 throughput: an instance computes
        at the pace of its slowest GPU."""
        nodes = self.g.nodes
        types = list(dict.fromkeys(nodes[m]["gpu_type"] for m in members))  # first seen first
        return min(types, key=lambda t: gpu_spec(t).fp16_flops) if len(types) > 1 else types[0]

    def shape(self, *parts: Sequence[str]) -> tuple:
        """``shape_signature`` of ``parts``, memoised per exact parts."""
        key = tuple(tuple(p) for p in parts)
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = shape_signature(self.g, parts, self.server_gpus)
        return hit

    # -- pools ---------------------------------------------------------------------------
    def pool_summary(self, pool: Sequence[str]) -> dict[tuple[float, str], int]:
        """(memory GB, GPU type) -> how many GPUs of ``pool`` have them; memoised per pool."""
        key = frozenset(pool)
        hit = self._pool_summaries.get(key)
        if hit is None:
            hit = {}
            for x in pool:
                d = self.g.nodes[x]
                k = (d["memory_gb"], d["gpu_type"])
                hit[k] = hit.get(k, 0) + 1
            self._pool_summaries[key] = hit
        return hit

    def fit(self, pool: Sequence[str], tp: int, pp: int) -> list[str]:
        """The GPUs of ``pool`` with enough memory for a 1/(TP*PP) weight shard (Alg. 1
        lines 5-6)."""
        need = self.model.param_bytes / (tp * pp * self.problem.options.r_frac)
        memory = self.memory_gb
        return [x for x in pool if memory[x] * GB >= need]
