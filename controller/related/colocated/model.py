"""The colocated plan priced on its cluster, and the run state of its nodes and requests.

A *node* is a tensor-parallel group holding layers [start, end). Every request gets a
*pipeline*: a list of (node, lo, hi) stages (:data:`Stage`) covering the model's layers in
order (``routing.py`` picks it).

Holds :data:`SOURCE` (the coordinator's vertex in a plan's flows), :class:`SimNode` (a node's
priced hardware and its state during a run), :class:`ColocatedModel` (the plan, its nodes and
routes between them), :func:`build_colocated` (price and check a plan), :data:`Stage` and
:class:`RequestState` (a request during a run).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import networkx as nx

from controller.errors import InputError
from controller.models import model_spec
from controller.plan import ColocatedPlan, Plan
from controller.related.perf import LengthStats, NodeHW, PerfModel, node_hw
from controller.workload import Request, Workload

SOURCE = "source"


@dataclass
class SimNode:
    """A node of the plan (a TP group holding layers [start, end)): its priced hardware and
    KV room, and its queues, KV use and busy time during a run."""

    index: int
    name: str
    hw: NodeHW
    start: int
    end: int
    tokens_per_s: float
    kv_cap: float  # bytes of KV room
    kv_bpt_layer: float  # KV bytes per token per layer
    queue: deque = field(default_factory=deque)  # decode passes waiting
    prefills: deque = field(default_factory=deque)  # prefill passes waiting
    busy: bool = False
    kv_used: float = 0.0
    kv_est: float = 0.0  # Helix's estimates of the requests routed here
    residents: set = field(default_factory=set)
    busy_s: float = 0.0
    iterations: int = 0


@dataclass
class ColocatedModel:
    """A colocated plan priced on its cluster: its nodes, and routes between them on demand."""

    plan: Plan
    cluster: nx.Graph
    perf: PerfModel
    nodes: list[SimNode]
    by_name: dict[str, int]
    stats: LengthStats
    _paths: dict[tuple[int, int], tuple[tuple[tuple[str, str], ...], float, float]] = field(
        default_factory=dict
    )

    @property
    def col(self) -> ColocatedPlan:
        assert self.plan.colocated is not None
        return self.plan.colocated

    @property
    def gpus_used(self) -> int:
        return sum(n.hw.tp for n in self.nodes)

    def path(self, a: int, b: int) -> tuple[tuple[tuple[str, str], ...], float, float]:
        """(directed links, bottleneck bytes/s, latency s) from node a to node b."""
        key = (a, b)
        hit = self._paths.get(key)
        if hit is None:
            conn = self.perf.connection(self.nodes[a].hw, self.nodes[b].hw)
            if conn is None:
                raise InputError(f"no route from {self.nodes[a].name} to {self.nodes[b].name}")
            links = tuple(zip(conn.path, conn.path[1:], strict=False))
            hit = self._paths[key] = (links, conn.bandwidth, conn.latency_s)
        return hit


def build_colocated(plan: Plan, g: nx.Graph, workload: Workload) -> ColocatedModel:
    """Price a colocated plan on cluster ``g``; InputError when it does not fit the cluster."""
    col = plan.colocated
    if plan.layout != "colocated" or col is None:
        raise InputError("not a colocated plan (layout must be 'colocated' with its nodes)")
    if not col.nodes:
        raise InputError("colocated plan has no node")
    model = model_spec(plan.model)
    for n in col.nodes:
        for x in n.gpus:
            if x not in g or g.nodes[x].get("kind") != "gpu":
                raise InputError(f"plan node {n.name} names GPU {x!r}, not in cluster {g.name!r}")
        if not 0 <= n.start < n.end <= model.layers:
            raise InputError(
                f"plan node {n.name} holds layers [{n.start}, {n.end}) of {model.layers}"
            )
    seen: set[str] = set()
    for x in plan.all_gpus():
        if x in seen:
            raise InputError(f"GPU {x} is in two nodes of the plan")
        seen.add(x)
    params = col.params
    perf = PerfModel(
        g,
        model,
        r_frac=float(params.get("r_frac", 0.9)),
        max_batch=int(params.get("max_batch", 512)),
    )
    nodes = []
    for k, n in enumerate(col.nodes):
        hw = node_hw(g, n.gpus)
        layers = n.end - n.start
        room = perf.kv_room(hw, layers)
        if room <= 0:
            raise InputError(f"plan node {n.name}: layers [{n.start}, {n.end}) leave no KV room")
        nodes.append(
            SimNode(k, n.name, hw, n.start, n.end, n.tokens_per_s, room, perf.kv_bytes_per_token(1))
        )
    by_name = {n.name: n.index for n in nodes}
    if len(by_name) != len(nodes):
        raise InputError("node names of the plan are not unique")
    for f in col.flows:
        for end in (f.src, f.dst):
            if end not in by_name and end not in (SOURCE, "sink"):
                raise InputError(f"plan flow {f.src}->{f.dst} names an unknown node {end!r}")
    for r in col.replicas:
        if not r.nodes or any(x not in by_name for x in r.nodes):
            raise InputError(f"plan replica {r.nodes} names an unknown node")
        cover = 0
        for x in r.nodes:
            nd = nodes[by_name[x]]
            if nd.start > cover or nd.end <= cover:
                raise InputError(f"plan replica {r.nodes} does not cover the layers in order")
            cover = nd.end
        if cover != model.layers:
            raise InputError(f"plan replica {r.nodes} stops at layer {cover} of {model.layers}")
    if not col.replicas and not any(f.src == SOURCE and f.flow > 0 for f in col.flows):
        raise InputError("colocated plan has neither replicas nor flow out of the coordinator")
    stats = LengthStats.of(workload.inputs, workload.outputs)
    return ColocatedModel(plan, g, perf, nodes, by_name, stats)


Stage = tuple[int, int, int]  # (node index, first layer, end layer) of a pipeline


class RequestState:
    """One request during a run: its lengths, progress, pipeline and KV held per stage."""

    __slots__ = (
        "id", "inp", "out", "arrival", "first", "finish", "gen", "pipe", "epoch", "kv",
        "est", "admit", "replica", "cls", "pred_out", "work", "missed",
    )  # fmt: skip

    def __init__(self, i: int, r: Request) -> None:
        self.id = i
        self.inp = r.input_tokens
        self.out = max(1, r.output_tokens)
        self.arrival = r.arrival_s
        self.first = math.nan
        self.finish = math.nan
        self.gen = 0  # output tokens made
        self.pipe: list[Stage] = []
        self.epoch = 0  # bumped by a preemption: passes of an older epoch are dropped
        self.kv: list[int] = []  # tokens of KV held at each stage
        self.est: list[float] = []  # Helix: estimated KV bytes reserved at each stage
        self.admit = 0  # admission order (the newest is preempted first)
        self.replica = -1
        self.cls = ""
        self.pred_out = 0.0
        self.work = 0.0  # the mapper's workload of this request on its instance
        self.missed = False  # known to miss the SLA (ColocatedOptions.stop_misses)
