"""The cost-efficiency MILP (``002_...`` §4.3) and its binary-search variant (Appendix F),
solved with SciPy's ``milp`` (HiGHS).

The paper's model: minimise the makespan T subject to
  (2) sum_c x_{c,w} = 1 for every workload class w           (assignment)
  (3) sum_w x_{c,w} f_w / (y_c h_{c,w}) <= T for every c       (makespan)
  (4) x_{c,w} <= y_c                                           (activation)
  (5) sum_c o_c y_c <= B                                       (budget)
  (6) sum_c d_n(c) y_c <= a_n for every GPU type n             (availability)
  (7) y_c in {0, 1, 2, ...}

(3) divides by the integer y_c, which is not linear. The exact linearisation used here gives
every potential copy k = 1..Y_c of a configuration its own activation binary z_{c,k} and its
own fractions x_{c,k,w}: each copy's load ``sum_w x_{c,k,w} f_w / h_{c,w} <= T`` is linear,
``x_{c,k,w} <= z_{c,k}`` couples it, ``z_{c,k} >= z_{c,k+1}`` removes the copies' symmetry, and
y_c = sum_k z_{c,k}. It is equivalent: from a solution of the paper's model, give each of the
y_c copies x_{c,w} / y_c, so each copy's load is the left side of (3); from one of this model,
x_{c,w} = sum_k x_{c,k,w} makes the left side of (3) the copies' average load, at most T.
Y_c is the most copies availability and budget allow.

Binary search (Appendix F): for a fixed T^ the makespan constraint
``sum_w x_{c,w} f_w / h_{c,w} <= T^ y_c`` is linear, so feasibility is one MILP (here it
minimises the cost, so each feasible step also says what the plan costs). Bounds: the lower
bound sum_w f_w min_c (o_c / h_{c,w}) / B (every request served by the configuration that
costs least per request, the whole budget spent), the upper bound the best single affordable
configuration. At the end the assignment of the copies found is re-optimised exactly (an LP
in x and T), so the result is the best makespan of that composition.

Infeasible inputs (no configuration within budget and availability) raise InputError; a time
limit returns the best solution found, said so in ``status``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix

from controller.errors import InputError


@dataclass
class CostProblem:
    """The MILP's data. ``rate[c][w]`` is h_{c,w} (0: c cannot serve w)."""

    classes: list[str]
    demand: list[float]  # f_w, requests
    configs: list[str]
    rate: list[list[float]]
    price: list[float]  # o_c, $/h
    types: list[str]
    gpus: list[list[int]]  # d_n(c)
    avail: list[int]  # a_n
    budget: float

    def __post_init__(self) -> None:
        C, W, N = len(self.configs), len(self.classes), len(self.types)
        if len(self.demand) != W or len(self.rate) != C or len(self.price) != C:
            raise ValueError("cost problem: inconsistent sizes")
        if any(len(r) != W for r in self.rate) or any(len(d) != N for d in self.gpus):
            raise ValueError("cost problem: inconsistent sizes")
        if len(self.avail) != N or len(self.gpus) != C:
            raise ValueError("cost problem: inconsistent sizes")

    def max_copies(self, c: int) -> int:
        """Y_c: the most copies of configuration c availability and budget allow."""
        y = math.inf if self.price[c] <= 0 else math.floor(self.budget / self.price[c] + 1e-9)
        for n, d in enumerate(self.gpus[c]):
            if d > 0:
                y = min(y, self.avail[n] // d)
        return int(y) if math.isfinite(y) else 0

    def serves(self, c: int) -> bool:
        return any(h > 0 for h in self.rate[c])

    def work(self, c: int, w: int) -> float:
        """f_w / h_{c,w}: seconds one copy of c needs for all of class w (inf if it cannot)."""
        h = self.rate[c][w]
        return self.demand[w] / h if h > 0 else math.inf


@dataclass
class CostSolution:
    copies: list[int]  # y_c
    assign: list[list[list[float]]]  # [c][k][w]: fraction of class w on copy k of c
    makespan: float  # T, s
    bound: float  # a lower bound on the optimal T, s
    status: str  # optimal | time-limit
    method: str  # milp | binary
    time_s: float
    cost: float  # $/h of the copies
    steps: list[tuple[float, bool]] = field(default_factory=list)  # binary search: (T^, feasible)

    def x(self, c: int, w: int) -> float:
        return sum(copy[w] for copy in self.assign[c])


def _check_feasible(p: CostProblem) -> None:
    if not p.classes:
        raise InputError("no workload class to serve")
    for w, name in enumerate(p.classes):
        if p.demand[w] > 0 and not any(
            p.rate[c][w] > 0 and p.max_copies(c) > 0 for c in range(len(p.configs))
        ):
            raise InputError(
                f"no configuration within the budget of {p.budget:g} $/h and the available GPUs "
                f"serves workload class {name}"
            )


class _Rows:
    """Sparse constraint rows ``lo <= sum(v * x[col]) <= hi``, added one at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(self.lo)
        for col, v in entries:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(v)
        self.lo.append(low)
        self.hi.append(high)

    def matrix(self, n: int) -> csr_matrix:
        """The rows as an ``len(lo) x n`` CSR matrix."""
        return coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), n)).tocsr()


def solve_milp(p: CostProblem, time_limit_s: float = 60.0) -> CostSolution:
    """The exact MILP (copy-wise linearisation, see module docstring)."""
    t0 = time.perf_counter()
    _check_feasible(p)
    C, W = len(p.configs), len(p.classes)
    copies = [(c, k) for c in range(C) if p.serves(c) for k in range(p.max_copies(c))]
    nz = len(copies)
    n = 1 + nz + nz * W  # T, z, x
    xi = lambda j, w: 1 + nz + j * W + w  # noqa: E731
    rows = _Rows()
    add = rows.add

    for w in range(W):  # assignment
        add([(xi(j, w), 1.0) for j, (c, _) in enumerate(copies) if p.rate[c][w] > 0], 1.0, 1.0)
    for j, (c, k) in enumerate(copies):
        # makespan per copy: sum_w x f_w / h - T <= 0
        add([(xi(j, w), p.work(c, w)) for w in range(W) if p.rate[c][w] > 0] + [(0, -1.0)],
            -np.inf, 0.0)  # fmt: skip
        for w in range(W):  # activation coupling x <= z
            if p.rate[c][w] > 0:
                add([(xi(j, w), 1.0), (1 + j, -1.0)], -np.inf, 0.0)
        if k > 0:  # copies in order: z_{c,k} <= z_{c,k-1}
            add([(1 + j, 1.0), (1 + j - 1, -1.0)], -np.inf, 0.0)
    add([(1 + j, p.price[c]) for j, (c, _) in enumerate(copies)], -np.inf, p.budget)
    for t in range(len(p.types)):
        entries = [(1 + j, float(p.gpus[c][t])) for j, (c, _) in enumerate(copies)]
        add([e for e in entries if e[1] > 0], -np.inf, float(p.avail[t]))
    A = rows.matrix(n)
    upper = np.ones(n)
    upper[0] = np.inf
    for j, (c, _) in enumerate(copies):
        for w in range(W):
            if p.rate[c][w] <= 0:
                upper[xi(j, w)] = 0.0
    integrality = np.zeros(n)
    integrality[1 : 1 + nz] = 1
    cost = np.zeros(n)
    cost[0] = 1.0
    res = milp(
        cost,
        constraints=LinearConstraint(A, rows.lo, rows.hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(n), upper),
        options={"time_limit": max(0.01, time_limit_s), "mip_rel_gap": 1e-9},
    )
    if res.x is None:
        if res.status == 1:  # out of time before any solution: the best single configuration
            low, _, y = bounds(p)
            T, assign = best_assignment(p, y)
            return CostSolution(
                y, assign, T, low, "time-limit", "milp", time.perf_counter() - t0,
                sum(p.price[c] * y[c] for c in range(C)),
            )  # fmt: skip
        raise InputError(
            f"no plan within the budget of {p.budget:g} $/h and the available GPUs ({res.message})"
        )
    x = res.x
    y = [0] * C
    assign: list[list[list[float]]] = [[] for _ in range(C)]
    for j, (c, _) in enumerate(copies):
        if x[1 + j] > 0.5:
            y[c] += 1
            assign[c].append([float(max(0.0, x[xi(j, w)])) for w in range(W)])
    status = "optimal" if res.status == 0 else "time-limit"
    bound = float(getattr(res, "mip_dual_bound", None) or res.fun)
    sol = CostSolution(
        y, assign, float(x[0]), bound, status, "milp", time.perf_counter() - t0,
        sum(p.price[c] * y[c] for c in range(C)),
    )  # fmt: skip
    sol.makespan = makespan(p, sol)
    return sol


def makespan(p: CostProblem, sol: CostSolution) -> float:
    """The largest copy load of a solution, s."""
    worst = 0.0
    for c, copies in enumerate(sol.assign):
        for copy in copies:
            load = sum(copy[w] * p.work(c, w) for w in range(len(p.classes)) if copy[w] > 0)
            worst = max(worst, load)
    return worst


def _feasible(p: CostProblem, T: float, time_limit_s: float) -> tuple[list[int] | None, bool]:
    """Binary-search step: (copies y with a plan of makespan <= T at the least cost, or None;
    whether the step ran out of time before it could tell)."""
    C, W = len(p.configs), len(p.classes)
    cs = [c for c in range(C) if p.serves(c) and p.max_copies(c) > 0]
    m = len(cs)
    n = m + m * W  # y, x
    xi = lambda j, w: m + j * W + w  # noqa: E731
    rows = _Rows()
    add = rows.add

    for w in range(W):
        add([(xi(j, w), 1.0) for j, c in enumerate(cs) if p.rate[c][w] > 0], 1.0, 1.0)
    for j, c in enumerate(cs):
        add([(xi(j, w), p.work(c, w)) for w in range(W) if p.rate[c][w] > 0] + [(j, -T)],
            -np.inf, 0.0)  # fmt: skip
        for w in range(W):
            if p.rate[c][w] > 0:
                add([(xi(j, w), 1.0), (j, -1.0)], -np.inf, 0.0)
    add([(j, p.price[c]) for j, c in enumerate(cs)], -np.inf, p.budget)
    for t in range(len(p.types)):
        add([(j, float(p.gpus[c][t])) for j, c in enumerate(cs) if p.gpus[c][t] > 0],
            -np.inf, float(p.avail[t]))  # fmt: skip
    A = rows.matrix(n)
    upper = np.ones(n)
    for j, c in enumerate(cs):
        upper[j] = p.max_copies(c)
        for w in range(W):
            if p.rate[c][w] <= 0:
                upper[xi(j, w)] = 0.0
    integrality = np.zeros(n)
    integrality[:m] = 1
    cost = np.zeros(n)
    for j, c in enumerate(cs):
        cost[j] = p.price[c]
    res = milp(
        cost,
        constraints=LinearConstraint(A, rows.lo, rows.hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(n), upper),
        options={"time_limit": max(0.01, time_limit_s)},
    )
    if res.x is None:
        return None, res.status == 1
    y = [0] * C
    for j, c in enumerate(cs):
        y[c] = int(round(res.x[j]))
    return y, False


def best_assignment(p: CostProblem, y: list[int]) -> tuple[float, list[list[list[float]]]]:
    """For fixed copies y: the assignment of least makespan (an LP; copies of one
    configuration share their configuration's fractions equally)."""
    C, W = len(p.configs), len(p.classes)
    cs = [c for c in range(C) if y[c] > 0]
    m = len(cs)
    n = 1 + m * W
    xi = lambda j, w: 1 + j * W + w  # noqa: E731
    A_rows, lo, hi = [], [], []
    for w in range(W):
        row = np.zeros(n)
        for j, c in enumerate(cs):
            if p.rate[c][w] > 0:
                row[xi(j, w)] = 1.0
        A_rows.append(row)
        lo.append(1.0)
        hi.append(1.0)
    for j, c in enumerate(cs):
        row = np.zeros(n)
        for w in range(W):
            if p.rate[c][w] > 0:
                row[xi(j, w)] = p.work(c, w) / y[c]
        row[0] = -1.0
        A_rows.append(row)
        lo.append(-np.inf)
        hi.append(0.0)
    upper = np.ones(n)
    upper[0] = np.inf
    for j, c in enumerate(cs):
        for w in range(W):
            if p.rate[c][w] <= 0:
                upper[xi(j, w)] = 0.0
    cost = np.zeros(n)
    cost[0] = 1.0
    res = milp(
        cost,
        constraints=LinearConstraint(np.array(A_rows), lo, hi),
        integrality=np.zeros(n),
        bounds=Bounds(np.zeros(n), upper),
    )
    if res.x is None:
        raise InputError(f"no assignment serves every class on the chosen copies ({res.message})")
    assign: list[list[list[float]]] = [[] for _ in range(C)]
    for j, c in enumerate(cs):
        share = [float(max(0.0, res.x[xi(j, w)])) / y[c] for w in range(W)]
        assign[c] = [list(share) for _ in range(y[c])]
    return float(res.x[0]), assign


def bounds(p: CostProblem) -> tuple[float, float, list[int]]:
    """(lower, upper bound on T, copies of the upper bound's single configuration)."""
    C, W = len(p.configs), len(p.classes)
    low = 0.0
    for w in range(W):
        per = [p.price[c] / p.rate[c][w] for c in range(C) if p.rate[c][w] > 0 and p.max_copies(c)]
        if per and p.budget > 0:
            low += p.demand[w] * min(per) / p.budget
    best, y_best = math.inf, [0] * C
    for c in range(C):
        if p.max_copies(c) < 1 or any(p.demand[w] > 0 and p.rate[c][w] <= 0 for w in range(W)):
            continue
        t = sum(p.work(c, w) for w in range(W) if p.demand[w] > 0)
        if t < best:
            best, y_best = t, [int(i == c) for i in range(C)]
    if not math.isfinite(best):
        # no single configuration serves everything: the copies of every affordable one
        y = [0] * C
        spent = 0.0
        used = [0] * len(p.types)
        for c in sorted(range(C), key=lambda c: p.price[c]):
            while (
                y[c] < p.max_copies(c)
                and spent + p.price[c] <= p.budget + 1e-9
                and all(used[t] + p.gpus[c][t] <= p.avail[t] for t in range(len(p.types)))
            ):
                y[c] += 1
                spent += p.price[c]
                used = [used[t] + p.gpus[c][t] for t in range(len(p.types))]
        try:
            best, _ = best_assignment(p, y)
            y_best = y
        except InputError:
            raise InputError(
                f"no set of configurations within the budget of {p.budget:g} $/h serves every "
                "workload class"
            ) from None
    return low, best, y_best


def solve_binary(
    p: CostProblem, time_limit_s: float = 60.0, tolerance: float = 1e-3
) -> CostSolution:
    """Binary search on T (Appendix F) to a relative ``tolerance`` of the upper bound."""
    t0 = time.perf_counter()
    _check_feasible(p)
    low, high, y = bounds(p)
    steps: list[tuple[float, bool]] = []
    status = "optimal"
    while high - low > tolerance * high:
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            status = "time-limit"
            break
        mid = (low + high) / 2
        found, timed_out = _feasible(p, mid, left)
        if timed_out:
            status = "time-limit"
            break
        steps.append((mid, found is not None))
        if found is not None:
            high, y = mid, found
        else:
            low = mid
    T, assign = best_assignment(p, y)
    return CostSolution(
        y, assign, T, low, status, "binary", time.perf_counter() - t0,
        sum(p.price[c] * y[c] for c in range(len(p.configs))), steps,
    )  # fmt: skip
