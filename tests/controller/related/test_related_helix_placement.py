"""Helix's placement search on small hand-drawn problems: aligned stages built from the nodes'
kinds (``helix_coverage``), the classes of interchangeable nodes and the symmetry cut of the
MILP (``helix_milp``)."""

from __future__ import annotations

import pytest

from controller.related.helix_coverage import aligned_placement, node_kinds
from controller.related.helix_flow import SINK, SOURCE, ComputeNode, HelixProblem, Link, max_flow
from controller.related.helix_milp import SolverOptions, canonical, node_classes, solve

# Solver time limits where a test asserts the optimum: hang guards, so that a loaded machine
# (wall time) cannot turn a millisecond solve into a time-limit status.
GUARD_S = 120.0

FAST = 1e6  # tokens/s: connections that never bind


def uniform(nodes: list[ComputeNode], layers: int) -> HelixProblem:
    links = [Link(SOURCE, n.name, FAST) for n in nodes] + [Link(n.name, SINK, FAST) for n in nodes]
    links += [Link(a.name, b.name, FAST) for a in nodes for b in nodes if a is not b]
    return HelixProblem(layers, nodes, links)


def per_layer(name: str, area: float, most: int) -> ComputeNode:
    """T_j = area / j: the node passes ``area`` layer-tokens per second whatever it holds."""
    return ComputeNode(name, tuple(area / j for j in range(1, most + 1)))


def two_kinds() -> HelixProblem:
    """Two big nodes (12 layer-tokens/s, up to 4 layers) and four small (6, up to 2), a
    4-layer model: the compute bound is (2 x 12 + 4 x 6) / 4 = 12 tokens/s."""
    nodes = [per_layer(f"big{i}", 12.0, 4) for i in range(2)]
    nodes += [per_layer(f"small{i}", 6.0, 2) for i in range(4)]
    return uniform(nodes, 4)


def test_aligned_stages_reach_the_bound_when_the_kinds_tile_it() -> None:
    """For instance both big nodes on layers [0, 2) pass 2 x 12 / 2 = 12, and two small nodes
    on each of layers 2 and 3 pass 2 x 6 = 12 (or each big node alone on one layer, 12):
    every stage at the bound, 12 tokens/s."""
    p = two_kinds()
    assert p.upper_bound() == pytest.approx(12.0)
    pl = aligned_placement(p)
    assert pl is not None and len(pl) == 6
    stages: dict[tuple[int, int], float] = {}
    for name, (s, e) in pl.items():
        stages[(s, e)] = stages.get((s, e), 0.0) + p.names[name].t(e - s)
    spans = sorted(stages)  # aligned: consecutive, non-overlapping, covering every layer
    assert spans[0][0] == 0 and spans[-1][1] == 4
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert min(stages.values()) == pytest.approx(12.0)
    assert max_flow(p, pl, True).value == pytest.approx(12.0)
    assert max_flow(p, pl, False).value == pytest.approx(12.0)


def test_aligned_stages_take_the_best_weakest_stage() -> None:
    """One node of 10 layer-tokens/s (up to 3 layers) and one of 3 (up to 1 layer), a 3-layer
    model: the small node can only hold one layer, at 3 tokens/s, so it is better left out;
    the big node alone on all 3 layers passes 10 / 3 = 3.333 tokens/s, the best aligned
    split (big on 2 layers, 5 tokens/s, then small on 1, 3 tokens/s, is weaker)."""
    p = uniform([per_layer("big", 10.0, 3), per_layer("small", 3.0, 1)], 3)
    pl = aligned_placement(p)
    assert pl == {"big": (0, 3)}
    assert max_flow(p, pl, True).value == pytest.approx(10.0 / 3)


def test_node_kinds_and_interchangeable_classes() -> None:
    p = two_kinds()
    assert node_kinds(p) == [["big0", "big1"], ["small0", "small1", "small2", "small3"]]
    assert node_classes(p, p.links) == node_kinds(p)
    # a slower connection out of small3 makes it unlike the others
    links = [Link(k.src, k.dst, 1.0 if (k.src, k.dst) == ("small3", "big0") else k.capacity)
             for k in p.links]  # fmt: skip
    # ... and big0 unlike big1 (one of big0's incoming connections is slower)
    assert node_classes(p, links) == [["big0"], ["big1"], ["small0", "small1", "small2"],
                                      ["small3"]]  # fmt: skip


def test_canonical_orders_a_class_by_first_layer_and_keeps_the_flow() -> None:
    p = two_kinds()
    pl = {"big0": (2, 4), "big1": (0, 2), "small0": (1, 2), "small1": (0, 1), "small2": (0, 1),
          "small3": (1, 2)}  # fmt: skip
    c = canonical(pl, node_classes(p, p.links))
    assert c == {"big0": (0, 2), "big1": (2, 4), "small0": (0, 1), "small1": (0, 1),
                 "small2": (1, 2), "small3": (1, 2)}  # fmt: skip
    assert max_flow(p, c, True).value == pytest.approx(max_flow(p, pl, True).value)


@pytest.mark.parametrize("cut", [True, False])
def test_milp_optimum_with_and_without_the_symmetry_cut(cut: bool) -> None:
    """The cut removes only permutations: the MILP proves the same optimum, 12 tokens/s."""
    p = two_kinds()
    r = solve(
        p, SolverOptions(time_limit_s=GUARD_S, workers=1, early_stop_gap=0.0, symmetry_cut=cut)
    )
    assert r.status == "optimal"
    assert r.objective == pytest.approx(12.0, rel=1e-5)
    if cut:
        for cl in node_classes(p, p.links):
            starts = [r.placement[x][0] for x in cl]
            assert starts == sorted(starts)
