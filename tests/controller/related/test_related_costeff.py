"""The cost-efficiency planner (002_...): Appendix C's toy example, budget and availability in
seeded random problems, configuration enumeration and its filters, infeasible inputs."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from controller.errors import InputError
from controller.models import model_spec
from controller.related.common import RelatedOptions
from controller.related.costeff import plan_costeff
from controller.related.costeff_configs import (
    Config,
    StageType,
    classes_of,
    prune_dominated,
    split_layers,
    workload_class,
)
from controller.related.costeff_milp import (
    CostProblem,
    bounds,
    makespan,
    solve_binary,
    solve_milp,
)
from controller.topology import testbed as make_testbed
from controller.workload import SLA, chatbot

# Solver time limits where a test asserts the optimum: hang guards, so that a loaded machine
# (wall time) cannot turn a millisecond solve into a time-limit status.
GUARD_S = 120.0


def toy() -> CostProblem:
    """Appendix C: GPU types t1, t2, t3 (4, 2, 2 $/h, two of each), 80 requests of w1 and 20
    of w2, one replica per GPU at C_{t,w} (1.0, 1.2), (0.9, 0.9), (0.3, 0.5) req/s, and TP over
    two t2 at (2.4, 1.5); budget 8 $/h."""
    return CostProblem(
        classes=["w1", "w2"],
        demand=[80.0, 20.0],
        configs=["t1", "t2", "t3", "t2 x2 TP"],
        rate=[[1.0, 1.2], [0.9, 0.9], [0.3, 0.5], [2.4, 1.5]],
        price=[4.0, 2.0, 2.0, 4.0],
        types=["t1", "t2", "t3"],
        gpus=[[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 2, 0]],
        avail=[2, 2, 2],
        budget=8.0,
    )


# Hand-worked optimum: t1 and TP over 2 x t2 (8 $/h). t1 takes all of w2 (20 / 1.2 s) and a
# share a of w1: 20 / 1.2 + 80 a = 80 (1 - a) / 2.4, so a = (100 / 3 - 50 / 3) / (80 + 100 / 3)
# = 0.1471 and T = 28.431 s, below the paper's rounded 28.67 s (its 15% / 85% split).
TOY_T = 20 / 1.2 + 80 * ((100 / 3 - 50 / 3) / (80 + 100 / 3))


@pytest.mark.parametrize("solve", [solve_milp, solve_binary])
def test_appendix_c_toy_example(solve) -> None:
    p = toy()
    s = solve(p, GUARD_S)  # a hang guard: the toy solves in milliseconds
    assert s.status == "optimal"
    assert s.makespan <= 28.67
    assert s.makespan == pytest.approx(TOY_T, abs=1e-3 if s.method == "milp" else 0.03)
    assert s.copies == [1, 0, 0, 1]
    assert s.cost == 8.0
    assert s.x(3, 0) == pytest.approx(1 - 0.1470588, abs=1e-3)  # TP replica: 85% of w1
    assert s.x(0, 1) == pytest.approx(1.0)  # t1: all of w2
    assert s.bound <= s.makespan + 1e-6


def test_toy_bounds() -> None:
    low, high, y = bounds(toy())
    # cheapest per request: w1 on the TP pair (4 / 2.4 $ s), w2 on t2 or t1 (2 / 0.9 vs 4 / 1.2
    # and 2 / 0.5): (80 * 4 / 2.4 + 20 * 2 / 0.9) / 8
    assert low == pytest.approx((80 * 4 / 2.4 + 20 * 2 / 0.9) / 8)
    assert high == pytest.approx(80 / 2.4 + 20 / 1.5)  # the TP pair alone: 46.67 s
    assert y == [0, 0, 0, 1]


def random_problem(rng: random.Random) -> CostProblem:
    W, N, C = rng.randint(1, 3), rng.randint(1, 3), rng.randint(2, 6)
    gpus = [[rng.choice([0, 0, 1, 2]) for _ in range(N)] for _ in range(C)]
    for d in gpus:
        if not any(d):
            d[rng.randrange(N)] = 1
    prices = [rng.choice([0.5, 1.0, 2.0]) for _ in range(N)]
    return CostProblem(
        classes=[f"w{i}" for i in range(W)],
        demand=[float(rng.randint(5, 50)) for _ in range(W)],
        configs=[f"c{i}" for i in range(C)],
        rate=[[rng.choice([0.0, 0.5, 1.0, 2.0, 3.0]) for _ in range(W)] for _ in range(C)],
        price=[sum(p * n for p, n in zip(prices, d, strict=True)) for d in gpus],
        types=[f"n{i}" for i in range(N)],
        gpus=gpus,
        avail=[rng.randint(1, 4) for _ in range(N)],
        budget=float(rng.randint(2, 10)),
    )


def test_budget_and_availability_never_violated() -> None:
    rng = random.Random(20261123)
    solved = 0
    for _ in range(30):
        p = random_problem(rng)
        results = []
        for solve in (solve_milp, solve_binary):
            try:
                s = solve(p, 10.0)
            except InputError:
                continue
            results.append(s)
            assert sum(p.price[c] * y for c, y in enumerate(s.copies)) <= p.budget + 1e-9
            for n in range(len(p.types)):
                used = sum(p.gpus[c][n] * y for c, y in enumerate(s.copies))
                assert used <= p.avail[n]
            for w in range(len(p.classes)):  # every class fully assigned
                assert sum(s.x(c, w) for c in range(len(p.configs))) == pytest.approx(1.0)
            assert makespan(p, s) <= s.makespan * (1 + 1e-6) + 1e-9
            assert all(len(s.assign[c]) == s.copies[c] for c in range(len(p.configs)))
        if len(results) == 2:  # both solved: the exact MILP is never worse
            solved += 1
            milp, binary = results
            assert milp.makespan <= binary.makespan * (1 + 1e-6) + 1e-9
            assert binary.makespan <= milp.makespan * (1 + 2e-3) + 1e-9  # within the tolerance
    assert solved >= 10  # the seeds give feasible problems too


def test_budget_too_small() -> None:
    p = toy()
    p.budget = 1.0
    for solve in (solve_milp, solve_binary):
        with pytest.raises(InputError, match="budget of 1"):
            solve(p, 5.0)


def test_layer_split_follows_memory() -> None:
    assert split_layers(24, [1.0, 2.0]) == (8, 16)  # Appendix D's example
    assert split_layers(80, [1.0, 2.0]) == (27, 53)
    assert split_layers(3, [1.0, 1.0, 1.0, 1.0]) is None
    assert sum(split_layers(7, [5.0, 1.0, 1.0]) or ()) == 7


def test_workload_classes() -> None:
    assert workload_class(512, 128) == "short-in/short-out"
    assert workload_class(513, 129) == "long-in/long-out"
    cls = classes_of([100, 600, 700], [10, 10, 200])
    assert {k: v.count for k, v in cls.items()} == {
        "long-in/long-out": 1,
        "long-in/short-out": 1,
        "short-in/short-out": 1,
    }


def test_dominated_configurations_are_dropped() -> None:
    st = StageType("A", 1, 1e10)
    cheap = Config((st,), (4,), {"A": 1}, 1.0, {"w": 2.0})
    dear = Config((st, st), (2, 2), {"A": 2}, 2.0, {"w": 1.5})
    other = Config((st, st), (2, 2), {"A": 2}, 2.0, {"w": 3.0})
    assert prune_dominated([cheap, dear, other]) == [cheap, other]


def test_plan_on_the_testbed_respects_budget_and_machines() -> None:
    g = make_testbed()
    opts = RelatedOptions(time_limit_s=10, prices={"V100-32GB": 0.9}, budget=10.0)
    plan = plan_costeff(g, model_spec("OPT-66B"), chatbot(n=2000), SLA(2.5, 0.15), opts)
    col = plan.colocated
    assert col is not None and col.replicas
    assert col.params["cost_per_h"] <= 10.0 + 1e-9
    gpus = plan.all_gpus()
    assert len(gpus) == len(set(gpus))
    for n in col.nodes:  # every stage a TP group inside one machine
        assert len({g.nodes[x]["server"] for x in n.gpus}) == 1
    for r in col.replicas:  # stages cover the 64 layers in order
        ends = [next(n for n in col.nodes if n.name == x) for x in r.nodes]
        assert ends[0].start == 0 and ends[-1].end == 64
        assert all(a.end == b.start for a, b in zip(ends, ends[1:], strict=False))
    for w in col.params["classes"]:
        assert sum(r.share.get(w, 0.0) for r in col.replicas) == pytest.approx(1.0)


def test_plan_without_priced_gpus_says_so() -> None:
    g = make_testbed()
    for n in [x for x, d in g.nodes(data=True) if d.get("gpu_type") == "A100-40GB"]:
        g.remove_node(n)
    with pytest.raises(InputError, match="no price for V100-32GB"):
        plan_costeff(g, model_spec("OPT-66B"), chatbot(n=500), SLA(2.5, 0.15), RelatedOptions())


def test_milp_out_of_time_returns_the_best_single_configuration(monkeypatch) -> None:
    """HiGHS stopped by the time limit before any solution (status 1, no x): the MILP
    returns the upper bound's plan (the TP pair alone, 80 / 2.4 + 20 / 1.5 = 46.67 s), said
    to be a time-limit result, instead of failing."""
    import controller.related.costeff_milp as cm

    real = cm.milp

    def out_of_time(c, **kw):
        if kw.get("options", {}).get("time_limit") is not None:  # the MILP, not the LP after
            return SimpleNamespace(x=None, status=1, message="time limit reached")
        return real(c, **kw)

    monkeypatch.setattr(cm, "milp", out_of_time)
    s = solve_milp(toy(), 1.0)
    assert s.status == "time-limit"
    assert s.copies == [0, 0, 0, 1] and s.cost == 4.0
    assert s.makespan == pytest.approx(80 / 2.4 + 20 / 1.5)
    assert s.bound == pytest.approx(bounds(toy())[0])
