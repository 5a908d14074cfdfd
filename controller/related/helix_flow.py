"""Helix §4.3: a cluster with a model placement as a flow network; its max flow is the
cluster's serving throughput (tokens/s).

A compute node c_i becomes two vertices ``c_i.in`` -> ``c_i.out`` whose edge capacity is the
tokens per second the node processes while holding its layers (T_j, profiled: here priced by
``perf.PerfModel``). The coordinator is ``source`` and ``sink``. A connection is *valid* when
(1) it goes from the coordinator to a node holding the first layer, (2) from a node holding the
last layer to the coordinator, or (3) from c_i to c_j when c_j holds the layers needed right
after c_i: ``s_j <= e_i < e_j`` with partial inference (c_j then infers only [e_i, e_j)),
``s_j == e_i`` without. Its capacity is the connection's bandwidth over the bytes a token
needs on it (a 4-byte token id to or from the coordinator, an h x 2-byte activation between
nodes). Max flow by preflow-push (networkx), as the paper does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import networkx as nx

SOURCE, SINK = "source", "sink"


@dataclass(frozen=True)
class ComputeNode:
    """A compute node: ``throughput[j - 1]`` is T_j, tokens/s while holding j layers
    (j = 1 .. max_layers)."""

    name: str
    throughput: tuple[float, ...]

    @property
    def max_layers(self) -> int:
        return len(self.throughput)

    def t(self, layers: int) -> float:
        return self.throughput[layers - 1] if 1 <= layers <= self.max_layers else 0.0


@dataclass(frozen=True)
class Link:
    """A directed network connection: ``src``/``dst`` are node names or SOURCE/SINK;
    ``capacity`` is S_ij, tokens/s."""

    src: str
    dst: str
    capacity: float


@dataclass
class HelixProblem:
    """What Helix's planner solves: L layers, compute nodes, possible connections."""

    layers: int
    nodes: list[ComputeNode]
    links: list[Link]
    names: dict[str, ComputeNode] = field(init=False)

    def __post_init__(self) -> None:
        self.names = {n.name: n for n in self.nodes}
        if len(self.names) != len(self.nodes):
            raise ValueError("compute node names must be unique")
        for k in self.links:
            for end in (k.src, k.dst):
                if end not in self.names and end not in (SOURCE, SINK):
                    raise ValueError(f"link {k.src}->{k.dst} names an unknown node {end!r}")

    def upper_bound(self) -> float:
        """Helix §4.5: throughput is at most the nodes' compute summed over layers and
        averaged over the model's L layers, sum_i max_j (j T_j) / L."""
        return sum(max((j * n.t(j) for j in range(1, n.max_layers + 1)), default=0.0)
                   for n in self.nodes) / self.layers  # fmt: skip


# a placement: node name -> (first layer s_i, end layer e_i), layers [s_i, e_i)
Placement = dict[str, tuple[int, int]]


def valid(link: Link, placement: Placement, layers: int, partial: bool) -> bool:
    """Whether ``link`` is a valid connection under ``placement`` (§4.3, Constraint-4)."""
    if link.src == SOURCE:
        return link.dst in placement and placement[link.dst][0] == 0
    if link.dst == SINK:
        return link.src in placement and placement[link.src][1] == layers
    if link.src not in placement or link.dst not in placement:
        return False
    (_, e_i), (s_j, e_j) = placement[link.src], placement[link.dst]
    if partial:
        return s_j <= e_i < e_j
    return s_j == e_i


def flow_graph(
    problem: HelixProblem, placement: Placement, partial: bool, links: Iterable[Link] | None = None
) -> nx.DiGraph:
    """The graph abstraction of the cluster under ``placement`` (Fig. 2b)."""
    g = nx.DiGraph()
    g.add_node(SOURCE)
    g.add_node(SINK)
    for name, (s, e) in placement.items():
        node = problem.names[name]
        g.add_edge(f"{name}.in", f"{name}.out", capacity=node.t(e - s))
    for k in problem.links if links is None else links:
        if not valid(k, placement, problem.layers, partial):
            continue
        u = SOURCE if k.src == SOURCE else f"{k.src}.out"
        v = SINK if k.dst == SINK else f"{k.dst}.in"
        g.add_edge(u, v, capacity=k.capacity)
    return g


@dataclass
class MaxFlow:
    value: float  # tokens/s
    edges: dict[tuple[str, str], float]  # (src, dst) -> flow over each valid connection
    nodes: dict[str, float]  # node name -> tokens/s through it


def max_flow(
    problem: HelixProblem,
    placement: Placement,
    partial: bool,
    links: Iterable[Link] | None = None,
) -> MaxFlow:
    """Max flow from source to sink under ``placement`` (preflow-push)."""
    g = flow_graph(problem, placement, partial, links)
    value, flow = nx.maximum_flow(g, SOURCE, SINK, flow_func=nx.algorithms.flow.preflow_push)
    edges: dict[tuple[str, str], float] = {}
    nodes: dict[str, float] = {}
    for u, out in flow.items():
        for v, f in out.items():
            if u.endswith(".in") and v.endswith(".out"):
                nodes[u[:-3]] = f
                continue
            a = SOURCE if u == SOURCE else u[: -len(".out")]
            b = SINK if v == SINK else v[: -len(".in")]
            edges[(a, b)] = f
    return MaxFlow(float(value), edges, nodes)
