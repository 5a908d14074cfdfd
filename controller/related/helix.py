"""The ``helix`` planner (``000_...``): max-flow model placement by MILP, served with per-request
pipelines and the IWRR scheduler; and its baselines, ``swarm`` and separate pipelines
(``helix-sp``), plus Petals' placement (``helix-petals``) for the placement study.

Planning steps (§4.3-4.5):
1. compute nodes: every server as one tensor-parallel node (the paper's multi-GPU node), or
   every GPU (``helix_nodes="gpu"``); each node's T_j for j layers from ``perf.PerfModel``
   (the one-time profiling), j up to the layers that leave room for one longest request;
2. connections: every ordered pair of nodes (capacity: bandwidth of the best route over an
   h x 2-byte activation per token) and the coordinator's to and from every node (its NIC over
   a 4-byte token id);
3. heuristic placements (Swarm, Petals, SP, ``helix_heuristics``; aligned stages built from
   the nodes' kinds, ``helix_coverage``) priced by max flow; the best is the MILP's warm start;
4. pruning (§4.5, §6.8): the connections carrying flow in a heuristic solution are kept, then
   the fastest others, a speed tier at a time, until the average node degree is
   ``prune_degree`` (uniform connections: none pruned, unless the tier is far larger than
   the target, which is then thinned to a circulant);
5. the MILP (``helix_milp``) with a time limit and early stop against the upper bound; the
   placement's max flow is then recomputed exactly on every connection (pruning only shrinks
   the search) and the better of it and the hint is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from controller.errors import InputError
from controller.models.specs import ModelSpec
from controller.plan import ColocatedNode, ColocatedPlan, FlowEdge, Plan, Predicted, Replica
from controller.related.common import (
    RelatedOptions,
    cluster_nodes,
    colocated_plan,
    node_name,
    stats_of,
)
from controller.related.helix_coverage import aligned_placement
from controller.related.helix_flow import (
    SINK,
    SOURCE,
    ComputeNode,
    HelixProblem,
    Link,
    MaxFlow,
    Placement,
    max_flow,
    valid,
)
from controller.related.helix_heuristics import complete, petals, separate_pipelines, swarm
from controller.related.helix_milp import MilpResult, SolverOptions, solve
from controller.related.perf import TOKEN_ID_BYTES, LengthStats, NodeHW, PerfModel
from controller.topology.graph import servers
from controller.workload.base import Workload
from controller.workload.sla import SLA

HIGH_WATER = 1.0  # Helix masks a node whose estimated KV use would pass its KV room
IDLE_REASON = "in nodes the max flow sends no token through, or too small for one layer"


@dataclass
class HelixSetup:
    """The cluster as Helix sees it: nodes by name, their profile, the flow problem."""

    perf: PerfModel
    stats: LengthStats
    nodes: dict[str, NodeHW]
    problem: HelixProblem
    kinds: dict[str, str]  # node -> GPU type
    half_vram: dict[str, int]  # node -> layers whose weights fill half its memory
    dropped: list[str]  # nodes too small for one layer


def setup(g: nx.Graph, model: ModelSpec, workload: Workload, opts: RelatedOptions) -> HelixSetup:
    perf = PerfModel(g, model, r_frac=opts.r_frac, max_batch=opts.max_batch)
    stats = stats_of(workload, opts.sample, opts.seed)
    nodes: dict[str, NodeHW] = {}
    compute: list[ComputeNode] = []
    dropped = []
    by_server = servers(g)
    for hw in cluster_nodes(g, opts.helix_nodes):
        name = node_name(hw, g, by_server)
        k = perf.max_layers(hw, stats.max_context)
        if k < 1:
            dropped.append(name)
            continue
        nodes[name] = hw
        compute.append(
            ComputeNode(name, tuple(perf.tokens_per_s(hw, j, stats) for j in range(1, k + 1)))
        )
    if sum(n.max_layers for n in compute) < model.layers:
        raise InputError(
            f"model {model.name} ({model.param_bytes / 1e9:.0f} GB) is larger than the memory "
            f"of all nodes of {g.name} together (room for "
            f"{sum(n.max_layers for n in compute)} of its {model.layers} layers)"
        )
    links = []
    for a in compute:
        na = nodes[a.name]
        nic = perf.nic_bandwidth(na)
        links.append(Link(SOURCE, a.name, nic / TOKEN_ID_BYTES))
        links.append(Link(a.name, SINK, nic / TOKEN_ID_BYTES))
        for b in compute:
            if a is b:
                continue
            bw = perf.bandwidth(na, nodes[b.name])
            if bw is not None:
                links.append(Link(a.name, b.name, bw / perf.activation_bytes))
    problem = HelixProblem(model.layers, compute, links)
    half = {
        n: max(1, int(0.5 * hw.tp * hw.memory_bytes // perf.layer_bytes)) for n, hw in nodes.items()
    }
    kinds = {n: hw.gpu_type for n, hw in nodes.items()}
    return HelixSetup(perf, stats, nodes, problem, kinds, half, dropped)


# A speed tier is kept whole up to this many times the pruning target; a larger one (every
# node pair of a uniform 1,200-node cluster: 1.44 M connections) is thinned to a circulant.
WHOLE_TIER_FACTOR = 4


def prune(problem: HelixProblem, keep: set[tuple[str, str]], degree: float) -> list[Link]:
    """Helix's pruning: keep the coordinator's connections and those in ``keep``, then the
    fastest node-to-node connections until the average degree (in + out) per node reaches
    ``degree``, a whole speed tier at a time: connections of equal capacity are all kept or
    all dropped, so no connection is dropped for a faster one it ties with (on Helix's
    24-node cluster, whose links are uniform, nothing is pruned; a random subset would make
    equal nodes unequal and lose placements). A tier too large to keep whole (more than
    ``WHOLE_TIER_FACTOR`` times the target) is thinned to a circulant: node i keeps its
    connections to the nodes 1, 2, ... places after it in the problem's order, the same
    number for every node, until the target is reached. ``degree <= 0`` keeps everything."""
    if degree <= 0:
        return list(problem.links)
    inner = [k for k in problem.links if k.src != SOURCE and k.dst != SINK]
    outer = [k for k in problem.links if k.src == SOURCE or k.dst == SINK]
    target = int(round(degree * len(problem.nodes) / 2))  # each link adds 2 to the degrees
    kept = [k for k in inner if (k.src, k.dst) in keep]
    rest = [k for k in inner if (k.src, k.dst) not in keep]
    order = {n.name: i for i, n in enumerate(problem.nodes)}
    n = len(problem.nodes)
    for cap in sorted({k.capacity for k in rest}, reverse=True):
        if len(kept) >= target:
            break
        tier = [k for k in rest if k.capacity == cap]
        if len(tier) > WHOLE_TIER_FACTOR * target:
            tier.sort(key=lambda k: ((order[k.dst] - order[k.src]) % n, order[k.src]))
            tier = tier[: target - len(kept)]
        kept += tier
    return outer + kept


def _used_links(flow: MaxFlow) -> set[tuple[str, str]]:
    return {e for e, f in flow.edges.items() if f > 0}


@dataclass
class HelixResult:
    placement: Placement
    flow: MaxFlow
    milp: MilpResult | None
    hint: str  # the heuristic that warm-started the MILP
    hint_flow: float
    links_used: int  # connections in the MILP after pruning
    links_total: int
    heuristics: dict[str, float]  # each heuristic's max flow, tokens/s
    milp_limit_s: float = 0.0  # the time the MILP was given (0: it was skipped)


def solve_placement(
    s: HelixSetup,
    opts: RelatedOptions,
    progress: Callable[[str], None] | None = None,
    left_s: Callable[[], float] | None = None,
) -> HelixResult:
    """The heuristics' placements priced by max flow, then the MILP warm-started from the
    best of them, for at most ``opts.time_limit_s`` and what ``left_s()`` says is left of the
    planner's time; with none left the MILP is skipped and the best heuristic kept
    (``milp`` None)."""
    p = s.problem
    partial = opts.partial_inference
    sp_place, _ = separate_pipelines(p, s.kinds)
    candidates = {
        "swarm": complete(p, swarm(p, s.half_vram)),
        "petals": complete(p, petals(p, s.half_vram)),
        "sp": complete(p, sp_place),
    }
    aligned = aligned_placement(p)
    if aligned is not None:
        candidates["aligned"] = complete(p, aligned)
    flows = {k: max_flow(p, pl, partial) for k, pl in candidates.items()}
    hint = max(flows, key=lambda k: (flows[k].value, k))
    keep = set().union(*(_used_links(f) for f in flows.values()))
    links = prune(p, keep, opts.prune_degree)
    if progress:
        progress(
            f"helix: {len(p.nodes)} nodes, {len(links)}/{len(p.links)} connections after "
            f"pruning, warm start {hint} ({flows[hint].value:.0f} tokens/s), "
            f"upper bound {p.upper_bound():.0f} tokens/s"
        )
    limit = opts.time_limit_s if left_s is None else min(opts.time_limit_s, left_s())
    res: MilpResult | None = None
    placement, flow = candidates[hint], flows[hint]
    if limit > 0:
        res = solve(
            p,
            SolverOptions(limit, partial, opts.early_stop_gap, opts.workers, opts.seed),
            hint=candidates[hint],
            links=links,
        )
        got = max_flow(p, res.placement, partial)
        if got.value >= flows[hint].value:  # the solver never lost the hint, but be sure
            placement, flow = res.placement, got
    return HelixResult(
        placement,
        flow,
        res,
        hint,
        flows[hint].value,
        len(links),
        len(p.links),
        {k: f.value for k, f in flows.items()},
        limit if res is not None else 0.0,
    )


# -- plans -----------------------------------------------------------------------------------
def _predicted(s: HelixSetup, placement: Placement, flow: MaxFlow) -> Predicted:
    """Rate = max flow / tokens per request; TTFT and TPOT: each node's iteration at its
    steady-state batch, weighted by the share of tokens it serves (no queueing)."""
    total = flow.value
    perf, st = s.perf, s.stats
    ttft = tpot = 0.0
    if total > 0:
        for name, through in flow.nodes.items():
            if through <= 0:
                continue
            hw, (a, b) = s.nodes[name], placement[name]
            batch = max(1, perf.concurrency(hw, b - a, st))
            w = through / total
            ttft += w * perf.step_time(hw, b - a, st.mean_in, st.mean_in2)
            tpot += w * perf.step_time(hw, b - a, 0.0, 0.0, batch, batch * st.ctx)
    used = [n for n, f in flow.nodes.items() if f > 0]
    gpus = sum(s.nodes[n].tp for n in used)
    rate = total / st.tokens
    return Predicted(ttft, tpot, 0.0, rate, rate / gpus if gpus else 0.0, gpus)


def _colocated(
    s: HelixSetup,
    placement: Placement,
    flow: MaxFlow,
    scheduler: str,
    partial: bool,
    objective: str,
    replicas: list[Replica] | None = None,
) -> ColocatedPlan:
    nodes = [
        ColocatedNode(n, list(s.nodes[n].gpus), a, b, s.problem.names[n].t(b - a))
        for n, (a, b) in sorted(placement.items())
    ]
    edges = [
        FlowEdge(k.src, k.dst, float(flow.edges.get((k.src, k.dst), 0.0)), k.capacity)
        for k in s.problem.links
        if valid(k, placement, s.problem.layers, partial)
    ]
    return ColocatedPlan(
        scheduler=scheduler,
        nodes=nodes,
        flows=edges,
        replicas=replicas or [],
        partial_inference=partial,
        tokens_per_s=flow.value,
        objective=objective,
        params={"high_water": HIGH_WATER, "tokens_per_request": s.stats.tokens},
    )


OBJECTIVE = (
    "max flow of tokens/s through the cluster (throughput; no latency SLA), "
    "prefill and decode on the same GPUs"
)


def plan_helix(
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    opts: RelatedOptions,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    t0 = time.process_time()
    limit = opts.planner_time_limit_s
    left = None if limit is None else (lambda: limit - (time.process_time() - t0))
    s = setup(g, model, workload, opts)
    r = solve_placement(s, opts, progress, left)
    col = _colocated(s, r.placement, r.flow, "iwrr", opts.partial_inference, OBJECTIVE)
    m = r.milp
    if m is None:  # the planner's time went on setting up: the best heuristic, marked
        col.solver = {"warm_start": r.hint, "heuristics_tokens_per_s": r.heuristics}
        notes = [
            f"time limit reached ({limit:g} s) before the MILP: the best heuristic "
            f"placement ({r.hint}, max flow {r.flow.value:.0f} tokens/s)"
        ]
    else:
        col.solver = {
            "solver": "OR-Tools CP-SAT",
            "status": m.status,
            "objective_tokens_per_s": m.objective,
            "bound_tokens_per_s": m.bound,
            "upper_bound_tokens_per_s": m.upper_bound,
            "time_s": m.time_s,
            "time_limit_s": r.milp_limit_s,
            "variables": m.variables,
            "constraints": m.constraints,
            "links": r.links_used,
            "links_before_pruning": r.links_total,
            "warm_start": r.hint,
            "warm_start_tokens_per_s": r.hint_flow,
            "heuristics_tokens_per_s": r.heuristics,
        }
        notes = [
            f"Helix MILP ({m.status}): max flow {r.flow.value:.0f} tokens/s, solver bound "
            f"{m.bound:.0f}, upper bound {m.upper_bound:.0f}, {m.time_s:.1f} s "
            f"(limit {r.milp_limit_s:g} s), warm start {r.hint} at {r.hint_flow:.0f}",
            "serves without disaggregation: every node runs prefill and decode iterations of "
            "its layers; requests take per-request pipelines chosen by IWRR over the flows",
        ]
        if m.status == "time-limit":
            notes.append(
                f"the solver hit its {r.milp_limit_s:g} s time limit: this is the best "
                "placement found, not a proven optimum"
            )
    if s.dropped:
        notes.append(f"nodes too small for one layer, left out: {', '.join(s.dropped)}")
    pred = _predicted(s, r.placement, r.flow)
    plan = colocated_plan("helix", g, model, workload, sla, col, pred, notes, IDLE_REASON)
    plan.time_limit_reached = m is None or m.status == "time-limit"
    return plan


def plan_baseline(
    name: str,
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    opts: RelatedOptions,
) -> Plan:
    """Helix's baselines: ``swarm`` (its placement and its throughput-based scheduler),
    ``helix-sp`` (separate pipelines, requests weighted by pipeline capacity) and
    ``helix-petals`` (Petals' placement with Helix's scheduler, §6.6)."""
    s = setup(g, model, workload, opts)
    p = s.problem
    partial = opts.partial_inference
    replicas: list[Replica] = []
    if name == "swarm":
        placement = swarm(p, s.half_vram)
        scheduler, what = "swarm", "SWARM placement: even stages, balanced throughput"
    elif name == "helix-petals":
        placement = petals(p, s.half_vram)
        scheduler, what = "iwrr", "Petals placement: each node serves the least-served block"
    elif name == "helix-sp":
        placement, pipes = separate_pipelines(p, s.kinds)
        if not pipes:
            raise InputError(f"no GPU type of {g.name} holds {model.name} in its own pipeline")
        flow = MaxFlow(0.0, {}, {})
        for pipe in pipes:  # fixed pipelines: each one's own max flow
            sub = max_flow(p, {n: placement[n] for n in pipe}, False)
            replicas.append(Replica(pipe, sub.value / s.stats.tokens))
            flow.value += sub.value
            flow.edges.update(sub.edges)
            flow.nodes.update(sub.nodes)
        scheduler, what = "wrr", "separate pipelines: one GPU type per pipeline"
    else:
        raise InputError(f"unknown Helix baseline {name!r}")
    if name != "helix-sp":
        flow = max_flow(p, placement, partial)
    col = _colocated(s, placement, flow, scheduler, partial and name != "helix-sp", what, replicas)
    notes = [f"{what}; max flow {flow.value:.0f} tokens/s"]
    pred = _predicted(s, placement, flow)
    return colocated_plan(name, g, model, workload, sla, col, pred, notes, IDLE_REASON)
