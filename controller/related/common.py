"""What the seed planners share: their options (defined in ``controller.related.options``),
the cluster's nodes, and the colocated :class:`~controller.plan.Plan` they all return."""

from __future__ import annotations

import math
from collections.abc import Sequence

import networkx as nx

from controller.models.specs import ModelSpec
from controller.plan import ColocatedPlan, IdleGPUs, PhasePlan, Plan, Predicted
from controller.related.options import RelatedOptions as RelatedOptions
from controller.related.perf import LengthStats, NodeHW, PerfModel, node_hw
from controller.topology.graph import gpus, servers
from controller.workload.base import Workload
from controller.workload.sla import SLA


def stats_of(workload: Workload, sample: int, seed: int) -> LengthStats:
    """Length statistics of ``sample`` requests drawn from the workload (all of it when it
    is smaller)."""
    import numpy as np

    n = len(workload.inputs)
    if n <= sample:
        return LengthStats.of(workload.inputs, workload.outputs)
    idx = np.random.default_rng(seed).choice(n, sample, replace=False)
    return LengthStats.of(workload.inputs[idx], workload.outputs[idx])


def cluster_nodes(g: nx.Graph, per: str) -> list[NodeHW]:
    """Compute nodes of the cluster: every server as one TP group, or every GPU alone."""
    out = []
    for _, members in sorted(servers(g).items()):
        if per == "server":
            out.append(node_hw(g, members))
        else:
            out += [node_hw(g, [x]) for x in members]
    return out


def node_name(node: NodeHW, g: nx.Graph, by_server: dict[str, list[str]] | None = None) -> str:
    """A node's name in a plan: its server for a whole server, else its GPU. ``by_server``:
    ``servers(g)`` when the caller names many nodes (it costs O(GPUs) to build)."""
    server = g.nodes[node.gpus[0]].get("server")
    by_server = servers(g) if by_server is None else by_server
    whole = len(node.gpus) > 1 and len(by_server.get(server, [])) == len(node.gpus)
    return str(server) if whole else node.gpus[0]


def empty_phase(role: str) -> PhasePlan:
    """The prefill or decode phase of a colocated plan: no instance (the nodes serve both)."""
    return PhasePlan(role, 1, 1, "", [], [], 0.0, 0.0, 1, 0.0)  # type: ignore[arg-type]


def colocated_plan(
    planner: str,
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    colocated: ColocatedPlan,
    predicted: Predicted,
    notes: Sequence[str],
    idle_reason: str = "in no node the plan serves on",
) -> Plan:
    """A colocated plan; the cluster's GPUs beyond ``predicted.gpus_used`` are reported idle
    for ``idle_reason`` (the planner's own words for what left them out)."""
    idle = len(gpus(g)) - predicted.gpus_used
    return Plan(
        planner=planner,
        topology=str(g.name),
        model=model.name,
        workload=workload.name,
        sla=sla,
        prefill=empty_phase("prefill"),
        decode=empty_phase("decode"),
        kv_transfer=[],
        predicted=predicted,
        notes=list(notes),
        options={},
        layout="colocated",
        colocated=colocated,
        idle=[IdleGPUs("any", idle, idle_reason)] if idle > 0 else [],
    )


def pipeline_latency(
    perf: PerfModel, stages: Sequence[tuple[NodeHW, int]], stats: LengthStats
) -> tuple[float, float]:
    """(TTFT, TPOT) of a mean request on a pipeline of (node, layers) at each node's
    steady-state batch, without queueing, plus the activation hops between stages."""
    ttft = tpot = 0.0
    for k, (node, layers) in enumerate(stages):
        b = max(1, perf.concurrency(node, layers, stats))
        ttft += perf.step_time(node, layers, stats.mean_in, stats.mean_in2)
        tpot += perf.step_time(node, layers, 0.0, 0.0, b, b * stats.ctx)
        if k + 1 < len(stages):
            conn = perf.connection(node, stages[k + 1][0])
            if conn is not None and math.isfinite(conn.bandwidth):
                ttft += stats.mean_in * perf.activation_bytes / conn.bandwidth + conn.latency_s
                tpot += perf.activation_bytes / conn.bandwidth + conn.latency_s
    return ttft, tpot
