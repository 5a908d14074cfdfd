"""Aligned stages: a placement for Helix's MILP built from the nodes' kinds, not their names.

Tokens cross every layer of the model, each on one node; a node holding [s, e) passes at most
T_{e-s} tokens/s whatever part of its block a token uses, so for every layer l the throughput
of the nodes that hold l bounds the max flow (``min_l sum_{i holds l} T_i``). This module
builds placements whose stages are aligned: the layers are cut into consecutive stages, every
node of a stage holds exactly the stage's layers, and tokens pass from any node of one stage
to any node of the next (``s_j == e_i``, valid with or without partial inference). With
connections fast enough, such a placement's max flow is its weakest stage's throughput.

Nodes with the same T_j are interchangeable, so a stage is a vector of counts per kind and a
width. For a target throughput F, the widest stage a count vector v can form is the largest
w with ``sum_k v_k T_k(w) >= F`` (no node holding more than it can); the best split of the
cluster's counts into stages is a dynamic program over the count vectors (each state: the
nodes not yet used, its value: the most layers they cover at F):

    cover(r) = max over 0 < v <= r of  width(v, F) + cover(r - v)

F is feasible when ``cover(N) >= L``; the largest feasible F is found by bisection over the
finitely many values ``sum_k v_k T_k(w)`` it can take. Cost: O(S^2) per F for S count vectors
(S = prod_k (N_k + 1): 585 on Helix's 24-node cluster), times O(log(S W)) values of F; the
search gives up (None) when S exceeds ``MAX_STATES``.

It is a restriction of Helix's MILP (stages aligned, each node at one stage), so its result is
a warm start that the MILP may improve, and its max flow is recomputed exactly
(``helix_flow.max_flow``) before it is compared with anything.
"""

from __future__ import annotations

import itertools

import numpy as np

from controller.related.helix_flow import HelixProblem, Placement

MAX_STATES = 20_000  # count vectors the dynamic program may visit (S above)


def node_kinds(problem: HelixProblem) -> list[list[str]]:
    """The nodes grouped by throughput profile (the same T_j for every j), in problem order."""
    kinds: dict[tuple[float, ...], list[str]] = {}
    for n in problem.nodes:
        kinds.setdefault(n.throughput, []).append(n.name)
    return list(kinds.values())


class _Stages:
    """The count vectors of a cluster and, per vector and width, the stage's throughput."""

    def __init__(self, problem: HelixProblem, kinds: list[list[str]]) -> None:
        self.counts = [len(k) for k in kinds]
        self.vecs = np.array(list(itertools.product(*[range(n + 1) for n in self.counts])))
        nodes = [problem.names[k[0]] for k in kinds]
        self.width_max = min(problem.layers, max(n.max_layers for n in nodes))
        # t[k, w - 1]: T_k(w), 0 beyond what kind k can hold
        t = np.array([[n.t(w) for w in range(1, self.width_max + 1)] for n in nodes])
        holds = t > 0
        # throughput of every vector at every width; -inf where a used kind cannot hold w
        self.tput = self.vecs @ t
        used = self.vecs > 0
        self.tput[(used[:, :, None] & ~holds[None, :, :]).any(axis=1)] = -np.inf
        self.tput[~used.any(axis=1)] = -np.inf
        # ``vecs`` is in row-major order, so a vector's row is linear in its counts: the row
        # of r - v is row(r) - row(v), which ``cover`` relies on

    def cover(self, f: float) -> tuple[int, list[tuple[np.ndarray, int]]]:
        """The most layers the whole cluster covers at throughput ``f``, and its stages."""
        ok = self.tput >= f
        # the widest width each vector reaches at f (0: none)
        width = np.where(ok.any(axis=1), self.width_max - np.argmax(ok[:, ::-1], axis=1), 0)
        n = len(self.vecs)
        best = np.zeros(n, dtype=np.int64)
        pick = np.zeros(n, dtype=np.int64)
        for r in range(1, n):  # every sub-vector of r precedes it in row-major order
            subs = np.nonzero((self.vecs <= self.vecs[r]).all(axis=1) & (width > 0))[0]
            if subs.size == 0:
                continue
            vals = width[subs] + best[r - subs]
            j = int(np.argmax(vals))
            best[r], pick[r] = int(vals[j]), int(subs[j])
        out, r = [], n - 1
        while r > 0 and pick[r] > 0:
            v = int(pick[r])
            out.append((self.vecs[v], int(width[v])))
            r -= v
        return int(best[n - 1]), out


def aligned_placement(problem: HelixProblem) -> Placement | None:
    """The aligned-stage placement of the highest weakest-stage throughput (module
    docstring), or None when the cluster has more count vectors than ``MAX_STATES`` or no
    split covers the model. Nodes it leaves out are absent from the placement."""
    kinds = node_kinds(problem)
    if int(np.prod([len(k) + 1 for k in kinds])) > MAX_STATES:
        return None
    st = _Stages(problem, kinds)
    values = np.unique(st.tput[np.isfinite(st.tput) & (st.tput > 0)])
    lo, hi = -1, len(values)  # values[lo] feasible, values[hi] not (sentinels)
    stages: list[tuple[np.ndarray, int]] = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        covered, split = st.cover(float(values[mid]))
        if covered >= problem.layers:
            lo, stages = mid, split
        else:
            hi = mid
    if lo < 0:
        return None
    # cut the stages down to the model's layers, keeping each at least one layer wide (a node
    # holding fewer layers keeps more memory for its KV cache: the perf model's T_j does not
    # rise with j, and the max flow is recomputed anyway)
    extra = sum(w for _, w in stages) - problem.layers
    placement: Placement = {}
    free = [list(k) for k in kinds]
    start = 0
    for v, w in stages:
        cut = min(extra, w - 1)
        w, extra = w - cut, extra - cut
        for k, count in enumerate(v):
            for _ in range(int(count)):
                placement[free[k].pop(0)] = (start, start + w)
        start += w
    return placement
