"""The seed planners at full size: the routes between nodes found once per pair of exit
shapes give exactly the connections of pricing every route; Helix within the planner's time
limit keeps its best heuristic, marked; a colocated plan reports the GPUs it leaves idle."""

from __future__ import annotations

import math
import random

from controller.costmodel.network import path_time
from controller.models import model_spec
from controller.related.clusters import helix24, resolve_cluster
from controller.related.common import RelatedOptions, cluster_nodes
from controller.related.helix import plan_helix, setup
from controller.related.helix_coverage import aligned_placement
from controller.related.helix_flow import max_flow
from controller.related.helix_heuristics import complete, petals, separate_pipelines, swarm
from controller.related.perf import PerfModel
from controller.topology.graph import gpus
from controller.workload import SLA, chatbot


def _every_route(perf: PerfModel, src: str, dst: str) -> tuple:
    """The connection as it is defined: every route of ``routes_between`` priced, the first
    of the fastest kept."""
    fab = perf.fabric
    if src == dst:
        return ((src,), math.inf, 0.0)
    best = min(fab.routes_between(src, dst), key=lambda p: path_time(fab, p, 1e6))
    hops = list(zip(best, best[1:], strict=False))
    t = fab.link_table
    return tuple(best), min(1.0 / t[e][0] for e in hops), sum(t[e][1] for e in hops)


def test_routes_found_once_per_exit_shape_are_every_routes_best():
    """The testbed (every GPU a node: NVLink pairs and Ethernet pairs) in full, and 400 pairs of
    2tracks' 1,200 servers (pairs under one access switch pair and pairs across the core):
    path, bandwidth and latency equal to pricing every route, while 2tracks' pairs price
    routes for fewer exit-shape pairs than pairs."""
    g = resolve_cluster("testbed")
    perf = PerfModel(g, model_spec("OPT-66B"))
    nodes = cluster_nodes(g, "gpu")
    for a in nodes:
        for b in nodes:
            c = perf.connection(a, b)
            assert c is not None
            assert (c.path, c.bandwidth, c.latency_s) == _every_route(perf, a.gpus[0], b.gpus[0])
    g = resolve_cluster("2tracks")
    perf = PerfModel(g, model_spec("OPT-175B"))
    nodes = cluster_nodes(g, "server")
    rng = random.Random(0)
    pairs = [tuple(rng.sample(nodes[:24], 2)) for _ in range(200)]
    pairs += [tuple(rng.sample(nodes, 2)) for _ in range(200)]
    for a, b in pairs:
        c = perf.connection(a, b)
        assert c is not None
        assert (c.path, c.bandwidth, c.latency_s) == _every_route(perf, a.gpus[0], b.gpus[0])
    assert len(perf._best_exits) < len(set(pairs))


def test_helix_out_of_time_keeps_its_best_heuristic_marked():
    """A planner limit already spent when the heuristics are priced: no MILP, the best of
    Swarm, Petals, separate pipelines and aligned stages by max flow, marked in the field and
    the notes; the idle GPUs are the cluster's less those the flow uses."""
    g, model, w = helix24(), model_spec("LLaMA-2-70B"), chatbot(n=500)
    opts = RelatedOptions(helix_nodes="gpu", workers=1, planner_time_limit_s=1e-9)
    plan = plan_helix(g, model, w, SLA(5, 0.5), opts)
    assert plan.time_limit_reached
    assert plan.notes[0].startswith("time limit reached (1e-09 s) before the MILP")
    s = setup(g, model, w, opts)
    p = s.problem
    best = max(
        max_flow(p, complete(p, pl), True).value
        for pl in (
            swarm(p, s.half_vram),
            petals(p, s.half_vram),
            separate_pipelines(p, s.kinds)[0],
            aligned_placement(p),
        )
    )
    assert plan.colocated is not None
    assert plan.colocated.tokens_per_s == best
    idle = sum(e.gpus for e in plan.idle)
    assert idle == len(gpus(g)) - plan.predicted.gpus_used


def test_bandwidth_is_the_connections():
    """``PerfModel.bandwidth``, kept per pair of exit shapes, is the bandwidth of the
    connection priced route by route: every GPU pair of the testbed (NVLink inside a server,
    Ethernet between) and 300 server pairs of 8tracks."""
    for name, per, sample in (("testbed", "gpu", None), ("8tracks", "server", 300)):
        g = resolve_cluster(name)
        perf = PerfModel(g, model_spec("OPT-66B"))
        nodes = cluster_nodes(g, per)
        rng = random.Random(1)
        pairs = (
            [(a, b) for a in nodes for b in nodes]
            if sample is None
            else [tuple(rng.sample(nodes, 2)) for _ in range(sample)]
        )
        for a, b in pairs:
            assert perf.bandwidth(a, b) == _every_route(perf, a.gpus[0], b.gpus[0])[1]
