"""Helix §4.4-4.5: the MILP that finds the model placement with the highest max flow, solved
with OR-Tools CP-SAT.

Variables (Table 5): per compute node c_i an integer s_i (first layer) and binaries b_i^j
(c_i holds j layers, j <= k_i), so e_i = s_i + sum_j j b_i^j; per connection a flow f and a
validity binary d; per node-to-node connection two binaries cond1, cond2 (with partial
inference). Constraints (Table 6), written as the paper linearises them:

  placement     sum_j b_i^j = 1;  0 <= s_i < L;  e_i <= L
  conservation  sum_u f_{u,i} = sum_v f_{i,v}
  throughput    sum_u f_{u,i} <= sum_j b_i^j T_i^j
  validity      s_i <= L (1 - d_{src,i});  L d_{i,sink} <= e_i;
                partial: (L + 1)(1 - cond1) >= s_j - e_i,  e_j - e_i >= 1 - (L + 1)(1 - cond2),
                         d <= cond1 / 2 + cond2 / 2
                whole:   L d <= L + s_j - e_i,  L d <= L - s_j + e_i
  transmission  f_{i,j} <= d_{i,j} S_{i,j}
  objective     max sum_i f_{src,i}

CP-SAT is an integer solver: flows and capacities are counted in units of ``1 / scale``
tokens/s, with ``scale`` chosen so the compute upper bound is 10^6 units (a resolution of
10^-6 of the bound); capacities are rounded down, so the solved placement is never credited
with flow it cannot carry, and its max flow is recomputed exactly afterwards. Speed-ups of
§4.5: a heuristic placement as a complete hint (warm start), interchangeable nodes ordered by
first layer (a symmetry cut: on a cluster of uniform links, nodes of one type are
interchangeable, and without the cut every permutation of a placement is a separate solution
to the search), a solution callback that stops
once a solution is within ``early_stop_gap`` of the upper bound sum_i max_j (j T_i^j) / L,
and a time limit after which the best placement found is returned, said so in ``status``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
from ortools.sat.python import cp_model

from controller.errors import InputError
from controller.related.helix_flow import SINK, SOURCE, HelixProblem, Link, Placement, valid

UNITS = 1_000_000  # integer units of the upper bound
# node_classes compares each node with its bucket's classes, O(N) a comparison: past this
# many nodes (where the MILP itself is out of reach) the symmetry cut is not looked for
MAX_SYMMETRY_NODES = 256


@dataclass(frozen=True)
class SolverOptions:
    time_limit_s: float = 60.0  # CP-SAT's wall-clock limit
    partial_inference: bool = True  # Constraint-4 with or without partial inference
    early_stop_gap: float = 0.01  # stop when within this fraction of the upper bound
    workers: int = 2  # CP-SAT search workers (this machine has 2 cores)
    seed: int = 0  # CP-SAT's random seed (reproducible runs with one worker)
    bound_cut: bool = True  # add the layer-work inequality (see ``solve``)
    symmetry_cut: bool = True  # order interchangeable nodes by first layer (``node_classes``)


@dataclass
class MilpResult:
    placement: Placement
    objective: float  # the MILP's max flow of ``placement``, tokens/s (rounded capacities)
    bound: float  # CP-SAT's best bound on the objective, tokens/s
    upper_bound: float  # Helix's compute upper bound, tokens/s
    status: str  # optimal | early-stop | time-limit | hint (no solution beat the hint)
    time_s: float
    variables: int
    constraints: int


class _EarlyStop(cp_model.CpSolverSolutionCallback):
    """Stops the search once a solution reaches ``target`` (the early-stop criterion)."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.stopped = False

    def on_solution_callback(self) -> None:
        if self.ObjectiveValue() >= self.target:
            self.stopped = True
            self.StopSearch()


def node_classes(problem: HelixProblem, links: Sequence[Link]) -> list[list[str]]:
    """The compute nodes in classes of interchangeable ones: a and b are interchangeable when
    swapping them maps the problem onto itself (the same throughput per layer count, the same
    connection capacities from the source and to the sink, to and from every other node, and
    between themselves both ways). Classes keep the problem's node order. O(N^2) capacity
    look-ups at worst (every node against its bucket's class representatives)."""
    cap = {(k.src, k.dst): k.capacity for k in links}
    names = [n.name for n in problem.nodes]
    outs: dict[str, list[float]] = {x: [] for x in names}
    ins: dict[str, list[float]] = {x: [] for x in names}
    for (u, v), c in cap.items():
        if u in outs:
            outs[u].append(c)
        if v in ins:
            ins[v].append(c)

    def swappable(a: str, b: str) -> bool:
        if cap.get((a, b)) != cap.get((b, a)):
            return False
        return all(
            cap.get((a, x)) == cap.get((b, x)) and cap.get((x, a)) == cap.get((x, b))
            for x in names
            if x != a and x != b
        )

    buckets: dict[tuple, list[list[str]]] = {}
    out: list[list[str]] = []
    for n in problem.nodes:
        key = (n.throughput, n.max_layers, cap.get((SOURCE, n.name)), cap.get((n.name, SINK)),
               tuple(sorted(outs[n.name])), tuple(sorted(ins[n.name])))  # fmt: skip
        for cl in buckets.setdefault(key, []):
            if swappable(cl[0], n.name):
                cl.append(n.name)
                break
        else:
            cl = [n.name]
            buckets[key].append(cl)
            out.append(cl)
    return out


def canonical(placement: Placement, classes: Sequence[Sequence[str]]) -> Placement:
    """``placement`` with each class's (first, end) layers handed out to the class's nodes in
    order of first layer: the same max flow (the nodes are interchangeable), and it meets the
    symmetry cut."""
    out = dict(placement)
    for cl in classes:
        for name, span in zip(cl, sorted(placement[x] for x in cl), strict=True):
            out[name] = span
    return out


def _integer_flow(
    problem: HelixProblem,
    placement: Placement,
    links: Sequence[Link],
    cap: dict[int, int],
    tcap: dict[str, list[int]],
    partial: bool,
) -> dict[int, int]:
    """Max flow of ``placement`` on the rounded integer capacities (a feasible hint)."""
    g = nx.DiGraph()
    for name, (s, e) in placement.items():
        g.add_edge(f"{name}.in", f"{name}.out", capacity=tcap[name][e - s - 1])
    idx = {}
    for k, link in enumerate(links):
        if valid(link, placement, problem.layers, partial):
            u = SOURCE if link.src == SOURCE else f"{link.src}.out"
            v = SINK if link.dst == SINK else f"{link.dst}.in"
            g.add_edge(u, v, capacity=cap[k])
            idx[(u, v)] = k
    if SOURCE not in g or SINK not in g:
        return {}
    _, flow = nx.maximum_flow(g, SOURCE, SINK)
    return {k: int(flow[u][v]) for (u, v), k in idx.items()}


def solve(
    problem: HelixProblem,
    options: SolverOptions,
    hint: Placement | None = None,
    links: Sequence[Link] | None = None,
    fixed: Placement | None = None,
) -> MilpResult:
    """Solve the placement MILP over ``links`` (default: all of the problem's). ``hint`` is
    a warm start; ``fixed`` pins the placement (the MILP is then Fig. 2's max flow)."""
    t0 = time.perf_counter()
    links = list(problem.links if links is None else links)
    L = problem.layers
    ub = problem.upper_bound()
    if ub <= 0:
        raise InputError("no compute node can serve any layer: nothing to place")
    scale = UNITS / ub
    top = UNITS + 1  # no flow exceeds the bound
    tcap = {n.name: [min(top, math.floor(t * scale)) for t in n.throughput] for n in problem.nodes}
    cap = {k: min(top, math.floor(link.capacity * scale)) for k, link in enumerate(links)}
    partial = options.partial_inference

    m = cp_model.CpModel()
    s, b, e = {}, {}, {}
    for n in problem.nodes:
        if n.max_layers < 1:
            raise InputError(f"node {n.name} cannot hold a layer")
        s[n.name] = m.NewIntVar(0, L - 1, f"s[{n.name}]")
        b[n.name] = [m.NewBoolVar(f"b[{n.name},{j}]") for j in range(1, n.max_layers + 1)]
        m.AddExactlyOne(b[n.name])
        e[n.name] = s[n.name] + sum(j * v for j, v in enumerate(b[n.name], start=1))
        m.Add(e[n.name] <= L)
        if fixed is not None:
            fs, fe = fixed[n.name]
            m.Add(s[n.name] == fs)
            m.Add(b[n.name][fe - fs - 1] == 1)
    f, d, conds = {}, {}, {}
    inflow: dict[str, list] = {n.name: [] for n in problem.nodes}
    outflow: dict[str, list] = {n.name: [] for n in problem.nodes}
    source_flows = []
    for k, link in enumerate(links):
        f[k] = m.NewIntVar(0, cap[k], f"f[{link.src},{link.dst}]")
        d[k] = m.NewBoolVar(f"d[{link.src},{link.dst}]")
        m.Add(f[k] <= cap[k] * d[k])  # transmission throughput
        if link.src == SOURCE:
            m.Add(s[link.dst] <= L * (1 - d[k]))
            source_flows.append(f[k])
            inflow[link.dst].append(f[k])
        elif link.dst == SINK:
            m.Add(L * d[k] <= e[link.src])
            outflow[link.src].append(f[k])
        else:
            i, j = link.src, link.dst
            if partial:
                c1, c2 = m.NewBoolVar(f"c1[{i},{j}]"), m.NewBoolVar(f"c2[{i},{j}]")
                m.Add((L + 1) * (1 - c1) >= s[j] - e[i])
                m.Add(e[j] - e[i] >= 1 - (L + 1) * (1 - c2))
                m.Add(2 * d[k] <= c1 + c2)
                conds[k] = (c1, c2)
            else:
                m.Add(L * d[k] <= L + s[j] - e[i])
                m.Add(L * d[k] <= L - s[j] + e[i])
            outflow[i].append(f[k])
            inflow[j].append(f[k])
    layer_work = []
    for n in problem.nodes:
        through = sum(inflow[n.name])
        m.Add(through == sum(outflow[n.name]))  # conservation
        # inference throughput, with the flow split by layer count: g_j <= b_j T_j
        parts = [m.NewIntVar(0, c, f"g[{n.name},{j}]") for j, c in enumerate(tcap[n.name], 1)]
        for part, c, v in zip(parts, tcap[n.name], b[n.name], strict=True):
            m.Add(part <= c * v)
        m.Add(through == sum(parts))
        layer_work += [j * part for j, part in enumerate(parts, start=1)]
    total = sum(source_flows)
    symmetric = options.symmetry_cut and fixed is None and len(problem.nodes) <= MAX_SYMMETRY_NODES
    classes = node_classes(problem, links) if symmetric else []
    for cl in classes:
        # any solution, its nodes permuted within their classes, is a solution of the same
        # flow: keep only the one whose first layers rise along the class
        for a, b2 in zip(cl, cl[1:], strict=False):
            m.Add(s[a] <= s[b2])
    if hint is not None and classes:
        hint = canonical(hint, classes)
    if options.bound_cut:
        # every token is inferred on all L layers, a node inferring at most the layers it
        # holds: sum_i sum_j j g_ij >= L * flow. Valid for every placement (it removes no
        # solution) and it brings the relaxation down to Helix's upper bound.
        m.Add(sum(layer_work) >= L * total)
    m.Maximize(total)

    if hint is not None:
        flows = _integer_flow(problem, hint, links, cap, tcap, partial)
        for n in problem.nodes:
            hs, he = hint[n.name]
            m.AddHint(s[n.name], hs)
            for j, v in enumerate(b[n.name], start=1):
                m.AddHint(v, int(he - hs == j))
        for k, link in enumerate(links):
            ok = valid(link, hint, L, partial)
            m.AddHint(d[k], int(ok))
            m.AddHint(f[k], flows.get(k, 0))
            if k in conds:
                (_, e_i), (s_j, e_j) = hint[link.src], hint[link.dst]
                m.AddHint(conds[k][0], int(s_j <= e_i))
                m.AddHint(conds[k][1], int(e_i < e_j))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, options.time_limit_s)
    solver.parameters.num_workers = max(1, options.workers)
    solver.parameters.random_seed = options.seed
    target = math.ceil((1.0 - options.early_stop_gap) * UNITS)
    cb = _EarlyStop(target)
    code = solver.Solve(m, cb)
    elapsed = time.perf_counter() - t0
    proto = m.Proto()
    nvars, ncons = len(proto.variables), len(proto.constraints)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if code == cp_model.INFEASIBLE:
            raise InputError("the placement MILP is infeasible (a fixed placement out of range?)")
        if hint is None:
            raise InputError(
                f"CP-SAT found no placement within {options.time_limit_s:g} s "
                "and no heuristic hint was given"
            )
        return MilpResult(
            dict(hint), 0.0, solver.BestObjectiveBound() / scale, ub, "hint", elapsed, nvars, ncons
        )
    placement = {
        n.name: (
            solver.Value(s[n.name]),
            solver.Value(s[n.name])
            + sum(j * solver.Value(v) for j, v in enumerate(b[n.name], start=1)),
        )
        for n in problem.nodes
    }
    if code == cp_model.OPTIMAL:
        status = "optimal"
    elif cb.stopped:
        status = "early-stop"
    else:
        status = "time-limit"
    return MilpResult(
        placement,
        solver.ObjectiveValue() / scale,
        solver.BestObjectiveBound() / scale,
        ub,
        status,
        elapsed,
        nvars,
        ncons,
    )
