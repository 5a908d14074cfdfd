"""Heuristic model placements Helix compares with (§6.2, §6.6) and hints its MILP with (§4.5).

- **Swarm** (SWARM, as Helix builds it): the model split evenly into the fewest pipeline
  stages that let the weakest node hold one stage with half its VRAM; every node serves one
  stage, nodes joining in order of decreasing throughput to the stage with the least total
  throughput.
- **Petals**: nodes join in turn and each serves the contiguous block of layers (as many as
  half its VRAM holds) where the cluster's throughput is lowest.
- **Separate pipelines** (SP): every GPU type forms its own pipelines, each of the fewest nodes
  of that type that hold the model with room for one longest request; a type that cannot
  form one pipeline is left out, as are the nodes left over.

Each returns a :data:`Placement` (node -> [s, e)); SP also returns its pipelines, which it
serves as fixed replicas.
"""

from __future__ import annotations

import math
from collections import defaultdict

from controller.related.helix_flow import HelixProblem, Placement


def even_split(layers: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``layers`` layers, sizes differing by at most 1."""
    out, start = [], 0
    for k in range(parts):
        size = layers // parts + (1 if k < layers % parts else 0)
        out.append((start, start + size))
        start += size
    return out


def swarm(problem: HelixProblem, half_vram_layers: dict[str, int]) -> Placement:
    """SWARM's placement (see module docstring)."""
    L = problem.layers
    weakest = max(1, min(half_vram_layers[n.name] for n in problem.nodes))
    stages = even_split(L, math.ceil(L / weakest))
    total = [0.0] * len(stages)
    out: Placement = {}
    order = sorted(
        problem.nodes,
        key=lambda n: (-n.t(min(n.max_layers, stages[0][1] - stages[0][0])), n.name),
    )
    for n in order:
        fits = [k for k, (s, e) in enumerate(stages) if e - s <= n.max_layers]
        if not fits:
            continue
        k = min(fits, key=lambda i: (total[i], i))
        s, e = stages[k]
        out[n.name] = (s, e)
        total[k] += n.t(e - s)
    return out


def petals(problem: HelixProblem, half_vram_layers: dict[str, int]) -> Placement:
    """Petals' placement (see module docstring): each node in turn takes the block whose
    least-served layer has the lowest throughput (ties: the lower sum, then the lower start)."""
    L = problem.layers
    cover = [0.0] * L
    out: Placement = {}
    for n in problem.nodes:
        k = max(1, min(half_vram_layers[n.name], n.max_layers, L))
        best = min(
            range(L - k + 1),
            key=lambda s: (min(cover[s : s + k]), sum(cover[s : s + k]), s),
        )
        out[n.name] = (best, best + k)
        for x in range(best, best + k):
            cover[x] += n.t(k)
    return out


def separate_pipelines(
    problem: HelixProblem, kinds: dict[str, str]
) -> tuple[Placement, list[list[str]]]:
    """SP's placement and pipelines (node names in layer order). ``kinds`` maps a node to
    its GPU type (nodes of a type are used in name order)."""
    L = problem.layers
    by_kind: dict[str, list] = defaultdict(list)
    for n in problem.nodes:
        by_kind[kinds[n.name]].append(n)
    out: Placement = {}
    pipes: list[list[str]] = []
    for kind in sorted(by_kind):
        nodes = sorted(by_kind[kind], key=lambda n: n.name)
        most = min(n.max_layers for n in nodes)
        if most < 1:
            continue
        depth = math.ceil(L / most)
        split = even_split(L, depth)
        for p in range(len(nodes) // depth):
            members = nodes[p * depth : (p + 1) * depth]
            for n, rng in zip(members, split, strict=True):
                out[n.name] = rng
            pipes.append([n.name for n in members])
    return out, pipes


def complete(problem: HelixProblem, placement: Placement) -> Placement:
    """A placement of every node (the MILP places them all): nodes a heuristic left out
    hold the first layer, which only adds capacity."""
    return {n.name: placement.get(n.name, (0, 1)) for n in problem.nodes}
