"""The GPUs a plan leaves idle, accounted by hand (``planner.idle``), and the planner's time
limit: a search stopped by it returns a valid plan marked as such."""

from __future__ import annotations

from controller.inputs.plan_checks import parse_plan
from controller.models import model_spec
from controller.plan import IdleGPUs
from controller.planner import PlannerOptions, plan
from controller.planner.combine import Combination
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY
from controller.planner.idle import idle_gpus
from controller.planner.options import Problem
from controller.planner.results import InstanceEval, PhaseResult
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla


def _ev(model: str, opts: PlannerOptions | None = None) -> Evaluator:
    problem = Problem(
        make_testbed(),
        model_spec(model),
        chatbot(n=500),
        default_sla("chatbot"),
        opts or PlannerOptions(),
    )
    return Evaluator(problem, POLICY)


def _srv(s: int, *idx: int) -> list[str]:
    return [f"srv{s}-gpu{i}" for i in idx]


def _phase(role: str, tp: int, insts: list[tuple[list[str], float]]) -> PhaseResult:
    evals = [InstanceEval([m], [], [], 0.0, 0.0, 0.01, 0.01, r, 1, 0.01) for m, r in insts]
    return PhaseResult(role, tp, 1, [e.stages for e in evals], evals)


def test_idle_gpus_by_hand():
    """OPT-13B (every testbed GPU holds a 1/2 shard). Prefill pool: srv0 and srv1 (8 A100s)
    as 2x1 instances of 3, 2 and 0 req/s, the first deployed; srv1's last two GPUs in no
    instance. Decode pool: srv2 and srv3 (8 V100s), one 4x1 instance of 2.5 req/s on srv2,
    deployed. H = min(3, 2.5) = 2.5 on 6 GPUs, so the 10 others are idle: 2 in the 2 req/s
    instance (decode's 2.5 req/s bounds H), 2 in the one at no rate, 2 left over in the
    prefill pool, and srv3's 4 in no decode instance."""
    ev = _ev("OPT-13B")
    pre = _phase("prefill", 2, [(_srv(0, 0, 1), 3.0), (_srv(0, 2, 3), 2.0), (_srv(1, 0, 1), 0.0)])
    dec = _phase("decode", 4, [(_srv(2, 0, 1, 2, 3), 2.5)])
    comb = Combination(1, 1, 2.5, 2.5 / 6, 6, 0.1, 0.05)
    pool_p = _srv(0, 0, 1, 2, 3) + _srv(1, 0, 1, 2, 3)
    pool_d = _srv(2, 0, 1, 2, 3) + _srv(3, 0, 1, 2, 3)
    got = idle_gpus(ev, [(pre, 1, pool_p), (dec, 1, pool_d)], comb)
    assert got == [
        IdleGPUs(
            "prefill",
            2,
            "1 2x1 instance(s) not deployed: more prefill adds no rate, H is bounded by the "
            "decode instances' capacity (2.500 req/s)",
        ),
        IdleGPUs("prefill", 2, "1 2x1 instance(s) meet the SLA at no rate"),
        IdleGPUs("prefill", 2, "in no 2x1 instance: left over after grouping the pool"),
        IdleGPUs("decode", 4, "in no 4x1 instance: left over after grouping the pool"),
    ]
    assert sum(e.gpus for e in got) == 16 - comb.gpus_used
    # the KV transfer bounds H below both phases' capacity
    kv = Combination(1, 1, 2.0, 2.0 / 6, 6, 0.1, 0.05)
    got = idle_gpus(ev, [(pre, 1, pool_p), (dec, 1, pool_d)], kv)
    assert got[0].reason.endswith(
        "H is bounded by the KV transfer (its time at H, under the links' load, in the decode TPOT)"
    )
    # with --gpus 7, a third prefill instance (6 + 2 GPUs) would not fit
    capped = _ev("OPT-13B", PlannerOptions(max_gpus=7))
    got = idle_gpus(capped, [(pre, 1, pool_p), (dec, 1, pool_d)], comb)
    assert (
        got[0].reason == "1 2x1 instance(s) not deployed: one more would pass the --gpus limit of 7"
    )


def test_idle_gpus_short_of_memory():
    """OPT-66B's 131.4 GB of weights at 4x1 need 131.4 / 4 / 0.9 = 36.5 GB per GPU: an
    A100-40GB holds it, a V100-32GB does not, so each pool's V100 server is idle for memory."""
    ev = _ev("OPT-66B")
    pre = _phase("prefill", 4, [(_srv(0, 0, 1, 2, 3), 3.0)])
    dec = _phase("decode", 4, [(_srv(1, 0, 1, 2, 3), 2.5)])
    comb = Combination(1, 1, 2.5, 2.5 / 8, 8, 0.1, 0.05)
    pool_p = _srv(0, 0, 1, 2, 3) + _srv(2, 0, 1, 2, 3)
    pool_d = _srv(1, 0, 1, 2, 3) + _srv(3, 0, 1, 2, 3)
    why = "too little memory for a 1/4 shard of the weights (4x1)"
    assert idle_gpus(ev, [(pre, 1, pool_p), (dec, 1, pool_d)], comb) == [
        IdleGPUs("prefill", 4, why),
        IdleGPUs("decode", 4, why),
    ]


def test_plan_accounts_for_every_idle_gpu():
    """A plan capped at 12 of the testbed's 16 GPUs reports the others idle, the sum exact,
    and a plan that uses every GPU reports none."""
    model, w, sla = model_spec("OPT-66B"), chatbot(n=2000), default_sla("chatbot")
    capped = plan(make_testbed(), model, w, sla, PlannerOptions(max_gpus=12))
    assert sum(e.gpus for e in capped.idle) == 16 - capped.predicted.gpus_used > 0
    assert parse_plan(capped.to_json()) == capped  # the new fields load back
    full = plan(make_testbed(), model, w, sla)
    assert sum(e.gpus for e in full.idle) == 16 - full.predicted.gpus_used


def test_time_limit_returns_the_best_plan_found_marked():
    """A limit already spent stops the search at its first check that has a plan in hand:
    the first pass's (decode priced without the KV load on its groups' links), which the
    second pass has not settled again: the plan is valid, marked in its field and its notes,
    its H an upper bound on the full search's (that load only lowers H), and says so;
    without a limit the search runs to its end, unmarked. (test_time_limit_steps.py stops it
    at every later check.)"""
    # chatbot: the testbed's search prices several (prefill, decode) pairs (6; summarization's
    # prefill bound leaves it 2)
    model, w, sla = model_spec("OPT-66B"), chatbot(), default_sla("chatbot")
    full = plan(make_testbed(), model, w, sla, PlannerOptions(time_limit_s=None))
    cut = plan(make_testbed(), model, w, sla, PlannerOptions(time_limit_s=1e-9))
    assert not full.time_limit_reached
    assert not any("time limit" in n for n in full.notes)
    assert cut.time_limit_reached
    assert any(n.startswith("time limit reached (1e-09 s)") for n in cut.notes)
    assert cut.predicted.rate >= full.predicted.rate * (1 - 1e-9)
    assert any(n.endswith("H is an upper bound on what this deployment serves") for n in cut.notes)
    assert not any("upper bound" in n for n in full.notes)
    assert parse_plan(cut.to_json()) == cut
    # the testbed's search prices several pairs; the cut one stops after the first plan
    assert _pairs_priced(cut) < _pairs_priced(full)


def _pairs_priced(p) -> int:
    (note,) = [n for n in p.notes if n.endswith("candidate pair(s) priced with KV transfer")]
    return int(note.split()[0])
