"""Configurations of the cost-efficiency planner (``002_...`` §4.3, Appendix D, G): workload
classes, GPU prices, and the enumeration of deployment configurations with their filters.

A *configuration* c serves one model replica: a pipeline of stages, each a TP group of one
GPU type inside one machine (Appendix D (i): TP only within a machine), layers split across
stages in proportion to the stage's memory (D (ii)). It has a GPU vector d_n(c), a price
o_c = sum_n d_n(c) p_n and a throughput h_{c,w} per workload class w, requests/s, from the
project's cost model (``perf.PerfModel``, the paper's one-time profiling): the replica runs as
many requests as every stage's KV room holds, split into one micro-batch per stage, and its
rate is set by its slowest stage (prefill plus output tokens at that batch, plus the
activations it sends on).

Filters: the memory check (D: sum_n d_n(c) m_n at least the model's weights), every stage
holding its layers and one longest request of the class, connectivity (a cluster's GPUs are
connected, the topology validator checks it), at most one stage more than the memory check
needs (G (i): deeper pipelines add communication without need), and dominance (G (i): a
configuration no cheaper, using no fewer GPUs of any type and no faster on any class than
another is dropped).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from controller.models.specs import ModelSpec
from controller.related.perf import LengthStats, NodeHW, PerfModel
from controller.topology.graph import servers

# Workload classes: Fig. 1 of the paper calls inputs longer than 512 tokens and outputs longer
# than 128 tokens long.
LONG_INPUT = 512
LONG_OUTPUT = 128

# GPU rental prices, $/h per GPU. Table 1 of the paper (cloud marketplace prices): L40 0.83,
# A100 1.75 (its A100 row lists the 40 GB part's 1555 GB/s with 80 GB: both A100s take it),
# H100 2.99. L4 and T4 are not in it: Helix's Table 3 lists purchase prices (A100 10-15k, L4
# ~3k, T4 ~1k USD), scaled here to A100's hourly price by the purchase ratio (12.5k midpoint):
# L4 1.75 * 3 / 12.5 = 0.42, T4 1.75 * 1 / 12.5 = 0.14. No seed gives V100 or H200 a price:
# pass one (``--price TYPE=USD``) to rent them.
PRICES: dict[str, float] = {
    "H100": 2.99,
    "A100-80GB": 1.75,
    "A100-40GB": 1.75,
    "L40": 0.83,
    "L4": 0.42,
    "T4": 0.14,
}


def workload_class(inp: int, out: int) -> str:
    """One of four classes: short or long input, short or long output."""
    i = "long" if inp > LONG_INPUT else "short"
    o = "long" if out > LONG_OUTPUT else "short"
    return f"{i}-in/{o}-out"


def classes_of(inputs: Sequence[int], outputs: Sequence[int]) -> dict[str, LengthStats]:
    """The sample's requests by class (classes with no request are absent)."""
    groups: dict[str, tuple[list[int], list[int]]] = {}
    for i, o in zip(inputs, outputs, strict=True):
        a, b = groups.setdefault(workload_class(int(i), int(o)), ([], []))
        a.append(int(i))
        b.append(int(o))
    return {c: LengthStats.of(*groups[c]) for c in sorted(groups)}


@dataclass(frozen=True)
class StageType:
    gpu_type: str
    tp: int
    memory_bytes: float  # per GPU


@dataclass
class Config:
    """A deployment configuration (v_c, s_c, o_c, h_{c,w})."""

    stages: tuple[StageType, ...]  # in pipeline order
    layers: tuple[int, ...]  # layers per stage
    gpus: dict[str, int]  # d_n(c)
    price: float  # o_c, $/h
    rate: dict[str, float]  # h_{c,w}, requests/s per class

    def name(self) -> str:
        return "+".join(f"{s.gpu_type}x{s.tp}" for s in self.stages)


def stage_types(g: nx.Graph, model: ModelSpec) -> tuple[list[StageType], dict[str, int]]:
    """TP groups a machine of each GPU type can form (degrees dividing the machine's GPU
    count and the model's heads), and the GPUs available per type (a_n)."""
    sizes: dict[str, set[int]] = {}
    avail: Counter = Counter()
    mem: dict[str, float] = {}
    for _, gpus in servers(g).items():
        types = {g.nodes[x]["gpu_type"] for x in gpus}
        if len(types) != 1:
            continue  # a machine of mixed GPU types: the paper's machines have one type
        (t,) = types
        sizes.setdefault(t, set()).add(len(gpus))
        avail[t] += len(gpus)
        m = min(g.nodes[x]["memory_gb"] for x in gpus) * 1e9
        mem[t] = min(mem.get(t, math.inf), m)
    out = []
    for t, ns in sorted(sizes.items()):
        for tp in range(1, max(ns) + 1):
            if all(n % tp == 0 for n in ns) and model.heads % tp == 0 and model.kv_heads % tp == 0:
                out.append(StageType(t, tp, mem[t]))
    return out, dict(avail)


def split_layers(layers: int, memories: Sequence[float]) -> tuple[int, ...] | None:
    """Layers per stage in proportion to the stage memories, each at least 1 (D (ii))."""
    if len(memories) > layers:
        return None
    total = sum(memories)
    raw = [layers * m / total for m in memories]
    out = [max(1, int(math.floor(x))) for x in raw]
    while sum(out) < layers:  # largest remainders first
        k = max(range(len(out)), key=lambda i: (raw[i] - out[i], -i))
        out[k] += 1
    while sum(out) > layers:
        k = max((i for i in range(len(out)) if out[i] > 1), key=lambda i: (out[i] - raw[i], i))
        out[k] -= 1
    return tuple(out)


def replica_rate(
    perf: PerfModel, nodes: Sequence[NodeHW], layers: Sequence[int], stats: LengthStats
) -> float:
    """h_{c,w}: requests/s of one replica (see module docstring); 0 if a stage cannot hold
    one of the class's longest requests."""
    conc = []
    for hw, n in zip(nodes, layers, strict=True):
        if perf.kv_tokens(hw, n) < stats.max_context:
            return 0.0
        conc.append(perf.concurrency(hw, n, stats))
    # requests in flight: as many as every stage's KV holds, one micro-batch per stage of at
    # most max_batch (vLLM's max_num_seqs per virtual engine)
    resident = min(
        perf.kv_tokens(hw, n) // max(stats.ctx, 1.0) for hw, n in zip(nodes, layers, strict=True)
    )
    if min(conc) < 1:
        return 0.0
    micro = int(max(1, min(perf.max_batch, resident // len(nodes))))
    worst = 0.0
    for k, (hw, n) in enumerate(zip(nodes, layers, strict=True)):
        t = perf.request_time(hw, n, stats, micro)
        if k + 1 < len(nodes):
            conn = perf.connection(hw, nodes[k + 1])
            if conn is None:
                return 0.0
            if math.isfinite(conn.bandwidth):
                t += stats.tokens * perf.activation_bytes / conn.bandwidth
        worst = max(worst, t)
    return 1.0 / worst if worst > 0 else 0.0


def _representative(g: nx.Graph, st: StageType) -> NodeHW:
    """A node of this stage type to price it on: the first machine of the type."""
    for _, gpus in sorted(servers(g).items()):
        if g.nodes[gpus[0]]["gpu_type"] == st.gpu_type and len(gpus) >= st.tp:
            from controller.related.perf import node_hw

            return node_hw(g, gpus[: st.tp])
    raise ValueError(f"no machine of type {st.gpu_type}")


def enumerate_configs(
    g: nx.Graph,
    perf: PerfModel,
    classes: dict[str, LengthStats],
    prices: dict[str, float],
    max_stages: int,
) -> tuple[list[Config], dict[str, int]]:
    """Every configuration that passes the filters, and a_n."""
    types, avail = stage_types(g, perf.model)
    types = [t for t in types if t.gpu_type in prices]
    reps = {t: _representative(g, t) for t in types}
    weights = perf.model.param_bytes
    out: list[Config] = []
    for size in range(1, max_stages + 1):
        for combo in itertools.combinations_with_replacement(types, size):
            use = Counter()
            for st in combo:
                use[st.gpu_type] += st.tp
            if any(use[t] > avail.get(t, 0) for t in use):
                continue
            mems = [st.tp * st.memory_bytes for st in combo]
            if sum(mems) < weights:  # the paper's memory check
                continue
            smallest_two = sorted(mems)[:2]
            if size >= 3 and sum(mems) - sum(smallest_two) >= weights:
                continue  # two stages more than the memory check needs
            order = sorted(combo, key=lambda st: (-st.tp * st.memory_bytes, st.gpu_type))
            layers = split_layers(perf.model.layers, [st.tp * st.memory_bytes for st in order])
            if layers is None:
                continue
            nodes = [reps[st] for st in order]
            rate = {c: replica_rate(perf, nodes, layers, s) for c, s in classes.items()}
            if not any(v > 0 for v in rate.values()):
                continue
            price = sum(prices[t] * n for t, n in use.items())
            out.append(Config(tuple(order), layers, dict(use), price, rate))
    return prune_dominated(out), avail


def prune_dominated(configs: list[Config]) -> list[Config]:
    """Drop every configuration another one dominates (G (i))."""
    keep = []
    for c in configs:
        dominated = False
        for o in configs:
            if o is c:
                continue
            no_worse = (
                o.price <= c.price
                and all(o.gpus.get(t, 0) <= n for t, n in c.gpus.items())
                and all(o.gpus.get(t, 0) == 0 or t in c.gpus for t in o.gpus)
                and all(o.rate[w] >= c.rate[w] for w in c.rate)
            )
            better = (
                o.price < c.price
                or sum(o.gpus.values()) < sum(c.gpus.values())
                or any(o.rate[w] > c.rate[w] for w in c.rate)
            )
            if no_worse and better:
                dominated = True
                break
        if not dominated:
            keep.append(c)
    return keep


def class_counts(classes: dict[str, LengthStats]) -> np.ndarray:
    return np.array([s.count for s in classes.values()], dtype=float)
