"""Helix (000_...): the graph abstraction and max flow of its Fig. 2, the placement MILP, its
heuristics, its pruning and the planner's invariants."""

from __future__ import annotations

import pytest

from controller.errors import InputError
from controller.models import model_spec
from controller.related.clusters import helix24
from controller.related.colocated import IWRR, integer_weights
from controller.related.common import RelatedOptions
from controller.related.helix import plan_baseline, plan_helix, prune, setup, solve_placement
from controller.related.helix_flow import (
    SINK,
    SOURCE,
    ComputeNode,
    HelixProblem,
    Link,
    max_flow,
    valid,
)
from controller.related.helix_heuristics import even_split, separate_pipelines, swarm
from controller.related.helix_milp import UNITS, SolverOptions, solve
from controller.workload import SLA, chatbot

# Solver time limits where a test asserts the optimum: hang guards, so that a loaded machine
# (wall time) cannot turn a millisecond solve into a time-limit status.
GUARD_S = 120.0

TOKEN, ACTIVATION = 4, 16 * 1024  # Fig. 2: a token id is 4 bytes, an activation 16 KB


def mbps(x: float) -> float:
    return x * 1e6 / 8


def fig2() -> HelixProblem:
    """Fig. 2a: coordinator, A100 (c1), T4-1 (c2), T4-2 (c3); link speeds in Mb/s; node
    capacities of Fig. 2b at the layers they hold (A100: 1500 tokens/s with 2 layers)."""
    bw = {
        ("coord", "a100"): 80,
        ("coord", "t4-1"): 20,
        ("coord", "t4-2"): 40,
        ("a100", "t4-2"): 60,
        ("t4-1", "t4-2"): 50,
        ("a100", "t4-1"): 90,
    }
    links = []
    for (a, b), v in bw.items():
        for x, y in ((a, b), (b, a)):
            if x == "coord":
                links.append(Link(SOURCE, y, mbps(v) / TOKEN))
            elif y == "coord":
                links.append(Link(x, SINK, mbps(v) / TOKEN))
            else:
                links.append(Link(x, y, mbps(v) / ACTIVATION))
    nodes = [
        ComputeNode("a100", (3000.0, 1500.0, 1000.0)),
        ComputeNode("t4-1", (1000.0,)),
        ComputeNode("t4-2", (1000.0,)),
    ]
    return HelixProblem(3, nodes, links)


FIG2_PLACEMENT = {"a100": (0, 2), "t4-1": (0, 1), "t4-2": (2, 3)}
# Every token crosses the A100 -> T4-2 connection (T4-2 alone holds layer 3 and only the
# A100 ends at layer 2): 60 Mb/s over a 16 KB activation.
FIG2_MAX_FLOW = 60e6 / 8 / 16384  # 457.76 tokens/s


@pytest.mark.parametrize("partial", [True, False])
def test_fig2_max_flow_is_the_slow_activation_link(partial: bool) -> None:
    p = fig2()
    f = max_flow(p, FIG2_PLACEMENT, partial)
    assert f.value == pytest.approx(FIG2_MAX_FLOW, rel=1e-12)
    assert f.edges[("a100", "t4-2")] == pytest.approx(FIG2_MAX_FLOW)
    assert f.edges[("t4-2", SINK)] == pytest.approx(FIG2_MAX_FLOW)
    # T4-1 -> A100 is valid only with partial inference (the A100 then infers layer 2 only)
    assert (("t4-1", "a100") in f.edges) == partial
    assert (("t4-1", "t4-2") in f.edges) is False  # T4-1 ends at 1, T4-2 starts at 2


def test_fig2_milp_with_the_placement_fixed_is_the_max_flow() -> None:
    r = solve(fig2(), SolverOptions(time_limit_s=GUARD_S, workers=1), fixed=FIG2_PLACEMENT)
    assert r.status == "optimal"
    assert r.placement == FIG2_PLACEMENT
    # capacities are rounded down to 1e-6 of the upper bound
    assert r.objective == pytest.approx(FIG2_MAX_FLOW, abs=2 * r.upper_bound / UNITS)


def test_fig2_milp_finds_the_best_placement() -> None:
    """Hand-worked: with 3 layers the best is the A100 on two layers feeding both T4s on the
    third (or both T4s feeding it): its 60 and 90 Mb/s links carry 457.76 + 686.65 tokens/s
    (the A100 alone on all 3 layers passes 1000)."""
    p = fig2()
    r = solve(
        p, SolverOptions(time_limit_s=GUARD_S, workers=1, early_stop_gap=0.0), hint=FIG2_PLACEMENT
    )
    best = (60e6 + 90e6) / 8 / 16384
    assert r.status == "optimal"
    assert max_flow(p, r.placement, True).value == pytest.approx(best, rel=1e-9)
    assert r.bound == pytest.approx(r.objective, rel=1e-6)
    assert p.upper_bound() == pytest.approx(5000 / 3)  # (3 x 1000 + 1000 + 1000) / 3


def test_early_stop_against_the_upper_bound() -> None:
    p = fig2()
    r = solve(p, SolverOptions(time_limit_s=10, workers=1, early_stop_gap=0.5), hint=FIG2_PLACEMENT)
    assert r.status in ("early-stop", "optimal")
    assert r.objective >= 0.5 * p.upper_bound() - 1e-6


def test_connection_validity() -> None:
    k = Link("a", "b", 1.0)
    assert valid(k, {"a": (0, 4), "b": (4, 8)}, 8, partial=False)
    assert not valid(k, {"a": (0, 4), "b": (3, 8)}, 8, partial=False)
    assert valid(k, {"a": (0, 4), "b": (3, 8)}, 8, partial=True)  # b infers [4, 8)
    assert not valid(k, {"a": (0, 4), "b": (5, 8)}, 8, partial=True)  # layer 4 is skipped
    assert not valid(k, {"a": (0, 4), "b": (0, 4)}, 8, partial=True)  # nothing new on b
    assert valid(Link(SOURCE, "a", 1), {"a": (0, 4)}, 8, True)
    assert not valid(Link("a", SINK, 1), {"a": (0, 4)}, 8, True)


def test_iwrr_interleaves_by_weight_and_skips_masked() -> None:
    it = IWRR(["a", "b"], [3, 1])
    assert [it.pick() for _ in range(8)] == ["a", "b", "a", "a"] * 2
    assert it.pick(lambda c: c == "b") == "b"
    assert it.pick(lambda c: False) is None
    assert integer_weights([2.0, 1.0, 0.01]) == [100, 50, 1]


def test_heuristics() -> None:
    assert even_split(10, 3) == [(0, 4), (4, 7), (7, 10)]
    p = HelixProblem(
        8,
        [ComputeNode(n, tuple(100.0 / j for j in range(1, 9))) for n in ("x", "y", "z")],
        [],
    )
    # the weakest holds 4 layers with half its memory: 2 stages of 4; 3 nodes balanced
    pl = swarm(p, {"x": 4, "y": 4, "z": 6})
    assert sorted(pl.values()) == [(0, 4), (0, 4), (4, 8)]
    # type A nodes hold at most 4 layers: a pipeline of two; the B node holds all 8
    p2 = HelixProblem(
        8,
        [ComputeNode("x", (1.0,) * 4), ComputeNode("y", (1.0,) * 4), ComputeNode("w", (1.0,) * 4),
         ComputeNode("z", (1.0,) * 8)],
        [],
    )  # fmt: skip
    sp, pipes = separate_pipelines(p2, {"x": "A", "y": "A", "w": "A", "z": "B"})
    assert pipes == [["w", "x"], ["z"]]  # the third A node is left over
    assert sp == {"w": (0, 4), "x": (4, 8), "z": (0, 8)}


def test_pruning_keeps_the_coordinator_and_used_links() -> None:
    nodes = [ComputeNode(f"n{i}", (1.0,)) for i in range(6)]
    links = [Link(SOURCE, n.name, 1.0) for n in nodes]
    links += [Link(a.name, b.name, float(i)) for i, (a, b) in
              enumerate((a, b) for a in nodes for b in nodes if a is not b)]  # fmt: skip
    p = HelixProblem(1, nodes, links)
    kept = prune(p, {("n0", "n1")}, degree=2)
    inner = [k for k in kept if k.src != SOURCE]
    assert len(inner) == 6  # average degree 2 over 6 nodes: 6 links
    assert ("n0", "n1") in {(k.src, k.dst) for k in inner}
    # the five fastest besides the kept one: capacities 29 down to 25
    assert sorted(k.capacity for k in inner if (k.src, k.dst) != ("n0", "n1")) == [
        25,
        26,
        27,
        28,
        29,
    ]
    assert sum(k.src == SOURCE for k in kept) == 6
    assert prune(p, set(), 0) == links


def test_pruning_keeps_or_drops_a_speed_tier_whole() -> None:
    """Uniform connections: none is faster than another, so none is pruned (a random subset
    would make equal nodes unequal); two tiers: the fast one is kept whole, then the slow
    one whole only while the degree is short."""
    nodes = [ComputeNode(f"n{i}", (1.0,)) for i in range(4)]
    pairs = [(a.name, b.name) for a in nodes for b in nodes if a is not b]
    uniform = HelixProblem(1, nodes, [Link(a, b, 5.0) for a, b in pairs])
    assert prune(uniform, set(), degree=2) == uniform.links
    tiers = HelixProblem(1, nodes, [Link(a, b, 9.0 if a < b else 1.0) for a, b in pairs])
    kept = prune(tiers, set(), degree=2)  # target 4 links: the 6 fast ones are all kept
    assert sorted(k.capacity for k in kept) == [9.0] * 6
    assert len(prune(tiers, set(), degree=4)) == 12  # target 8: the slow tier joins, whole


def test_pruning_thins_a_huge_uniform_tier_to_a_circulant() -> None:
    """Six nodes, every pair at one speed (30 connections) and degree 2: the target of 6 is
    under a fifth of the tier, so each node keeps its connection to the next node in order
    (n5 to n0), one in and one out each."""
    nodes = [ComputeNode(f"n{i}", (1.0,)) for i in range(6)]
    pairs = [(a.name, b.name) for a in nodes for b in nodes if a is not b]
    p = HelixProblem(1, nodes, [Link(a, b, 5.0) for a, b in pairs])
    kept = sorted((k.src, k.dst) for k in prune(p, set(), degree=2))
    assert kept == [(f"n{i}", f"n{(i + 1) % 6}") for i in range(6)]


@pytest.fixture(scope="module")
def h24():
    g = helix24()
    model = model_spec("LLaMA-2-70B")
    w = chatbot(n=2000)
    opts = RelatedOptions(time_limit_s=3, helix_nodes="gpu", workers=1)
    return g, model, w, opts


def test_helix24_nodes_and_bound(h24) -> None:
    g, model, w, opts = h24
    s = setup(g, model, w, opts)
    assert len(s.nodes) == 24
    by = {n.name: n for n in s.problem.nodes}
    # memory: an A100-40GB holds more layers than an L4 (24 GB), an L4 more than a T4 (16 GB)
    a100, l4, t4 = by["a100-0-gpu0"], by["l4-0-gpu0"], by["t4-0-gpu0"]
    assert a100.max_layers > l4.max_layers > t4.max_layers >= 1
    for n in s.problem.nodes:  # more layers per token: fewer tokens per second
        assert all(x >= y for x, y in zip(n.throughput, n.throughput[1:], strict=False))
    # the compute upper bound holds for any placement, e.g. Swarm's
    pl = swarm(s.problem, s.half_vram)
    assert 0 < max_flow(s.problem, pl, True).value <= s.problem.upper_bound()


def test_helix24_time_limited_plan_keeps_the_best_found(h24) -> None:
    g, model, w, opts = h24
    s = setup(g, model, w, opts)
    r = solve_placement(s, opts)
    assert r.flow.value >= max(r.heuristics.values()) - 1e-6
    assert r.flow.value <= s.problem.upper_bound() * (1 + 1e-9)
    plan = plan_helix(g, model, w, SLA(5, 0.5), opts)
    col = plan.colocated
    assert plan.layout == "colocated" and col is not None
    assert col.solver["status"] in ("time-limit", "early-stop", "optimal", "hint")
    if col.solver["status"] == "time-limit":
        assert any("time limit" in n and "best placement found" in n for n in plan.notes)
    gpus = plan.all_gpus()
    assert len(gpus) == len(set(gpus)) == 24
    by = {n.name: n for n in col.nodes}
    through_in: dict[str, float] = {}
    through_out: dict[str, float] = {}
    for f in col.flows:
        assert f.flow <= f.capacity * (1 + 1e-9)
        through_in[f.dst] = through_in.get(f.dst, 0.0) + f.flow
        through_out[f.src] = through_out.get(f.src, 0.0) + f.flow
        if f.src != SOURCE and f.dst != SINK:  # a valid connection: dst continues src
            assert by[f.dst].start <= by[f.src].end < by[f.dst].end
    for n in col.nodes:  # conservation and node capacity
        assert through_in.get(n.name, 0.0) == pytest.approx(through_out.get(n.name, 0.0), abs=1e-6)
        assert through_in.get(n.name, 0.0) <= n.tokens_per_s * (1 + 1e-9)
    assert through_out[SOURCE] == pytest.approx(col.tokens_per_s)
    assert plan.predicted.rate == pytest.approx(col.tokens_per_s / col.params["tokens_per_request"])


def test_helix_baselines_are_plans(h24) -> None:
    g, model, w, opts = h24
    for name in ("swarm", "helix-sp", "helix-petals"):
        p = plan_baseline(name, g, model, w, SLA(5, 0.5), opts)
        assert p.colocated is not None and p.colocated.nodes
    sp = plan_baseline("helix-sp", g, model, w, SLA(5, 0.5), opts)
    # separate pipelines: each pipeline one GPU type, covering every layer in order
    for r in sp.colocated.replicas:
        kinds = {g.nodes[x]["gpu_type"] for n in sp.colocated.nodes if n.name in r.nodes
                 for x in n.gpus}  # fmt: skip
        assert len(kinds) == 1


def test_model_larger_than_all_memory() -> None:
    g = helix24()
    keep = {f"t4-{i}" for i in range(8)}
    g.remove_nodes_from(
        [x for x, d in g.nodes(data=True) if d.get("server") and d["server"] not in keep]
    )  # 8 T4: 128 GB, about 115 GB usable, for 138 GB of weights
    with pytest.raises(InputError, match="larger than the memory"):
        setup(g, model_spec("LLaMA-2-70B"), chatbot(n=500), RelatedOptions(helix_nodes="gpu"))
