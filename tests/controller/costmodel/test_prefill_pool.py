"""The engines' prefill pool as an executable model (``costmodel.prefill_pool``): batches
and routing worked by hand, and the percentile against the M/D/1 queue's closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.costmodel.prefill_pool import (
    ROUTE_ALL_MAX,
    PoolSample,
    pool_max_rate,
    pool_run,
    pool_ttft_quantile,
    saturated_departures,
)
from controller.models.engines import BatchAdmission

TWO_STAGES = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # 1 s a batch at each stage


def test_a_prompt_that_finds_every_slot_taken_waits_for_a_departure():
    # two slots, 1 s stages, one prompt a batch (budget 1 token). Arrivals 0 and 0.5 start at
    # once: out at 2 and max(1.5 + 1, 2) + 1 = 3 (stage 0 frees at 1, stage 1 at 2). The
    # third (at 0.6) waits for the first to leave (2): stages at 3 and 4. The fourth (at 5)
    # finds the pipeline empty: out at 7
    adm = BatchAdmission(2, 100, 1)
    done, batches = pool_run([0.0, 0.5, 0.6, 5.0], [1.0] * 4, [TWO_STAGES], adm)
    assert done.tolist() == [2.0, 3.0, 4.0, 7.0]
    assert batches == [(2.0, 1), (3.0, 1), (4.0, 1), (7.0, 1)]


def test_prompts_that_wait_together_share_a_batch_up_to_the_budget():
    # one slot: the first prompt goes alone (0 to 2); the three behind it (at 0.1-0.3) wait,
    # and at 2 the budget of 2 tokens takes two of them (out at 4) and the last goes at 4
    adm = BatchAdmission(1, 100, 2)
    done, batches = pool_run([0.0, 0.1, 0.2, 0.3], [1.0] * 4, [TWO_STAGES], adm)
    assert done.tolist() == [2.0, 4.0, 4.0, 6.0]
    assert batches == [(2.0, 1), (4.0, 2), (6.0, 1)]


def test_the_router_sends_each_prompt_to_the_least_work():
    # two one-stage instances, the second twice as slow per token. Prompt 0 goes to the first
    # (a tie goes to the lower index); prompt 1 to the second (no work); prompt 2 (at 0.5):
    # the first holds 10 tokens at 1 s per 10 (load 1), the second 10 at 2 s per 10 (load
    # 2), so the first, where it waits for its slot: out at 1 + 1 = 2
    fast = np.array([[0.0, 0.1, 0.0]])
    slow = np.array([[0.0, 0.2, 0.0]])
    adm = BatchAdmission(1, 100, 10)
    done, _ = pool_run([0.0, 0.0, 0.5], [10.0] * 3, [fast, slow], adm)
    assert done.tolist() == pytest.approx([1.0, 2.0, 2.0])


def test_above_route_all_max_the_router_compares_two():
    # ROUTE_ALL_MAX + 1 idle instances and as many prompts at once: comparing all would give
    # each its own; two drawn at random put two on one instance with some probability
    n = ROUTE_ALL_MAX + 1
    one = np.array([[1.0, 0.0, 0.0]])
    adm = BatchAdmission(1, 100, 1)
    arrivals = [0.001 * i for i in range(n)]
    runs = [pool_run(arrivals, [1.0] * n, [one] * n, adm, seed=s)[0] for s in range(20)]
    assert any(d.max() > 1.01 for d in runs)
    only = pool_run(arrivals[:ROUTE_ALL_MAX], [1.0] * ROUTE_ALL_MAX, [one] * ROUTE_ALL_MAX, adm)
    assert only[0] == pytest.approx(1.0 + np.asarray(arrivals[:ROUTE_ALL_MAX]))


def md1_sojourn_quantile(lam: float, d: float, q: float) -> float:
    """The q-quantile of time in system of an M/D/1 queue: wait W plus service d, with
    Erlang's P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/d)} (lam (k d - t))^k / k!
    e^{-lam (k d - t)}, rho = lam d (by bisection on t)."""
    rho = lam * d

    def cdf(t: float) -> float:
        return (1 - rho) * sum(
            (lam * (k * d - t)) ** k / math.factorial(k) * math.exp(-lam * (k * d - t))
            for k in range(int(t // d) + 1)
        )

    lo, hi = 0.0, 50 * d
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return hi + d


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_one_prompt_a_batch_through_one_stage_is_the_md1_queue(rho):
    # equal prompts, one 1 s stage, one slot, one prompt a batch: an M/D/1 queue, whose
    # 90th percentile of time in system is Erlang's closed form (2.19 s at rho 0.5, 4.92 s
    # at rho 0.8); 100,000 arrivals bring the sample's within 3% of it
    sample = PoolSample.draw(np.array([1.0]), np.array([1.0]), 100_000, seed=1)
    adm = BatchAdmission(1, 100, 1)
    got = pool_ttft_quantile(rho, 0.9, sample, [np.array([[1.0, 0.0, 0.0]])], adm)
    assert got == pytest.approx(md1_sojourn_quantile(rho, 1.0, 0.9), rel=0.03)


def test_the_largest_rate_meeting_a_bound_and_a_pool_behind_its_arrivals():
    sample = PoolSample.draw(np.array([1.0]), np.array([1.0]), 50_000, seed=1)
    adm = BatchAdmission(1, 100, 1)
    one = [np.array([[1.0, 0.0, 0.0]])]
    bound = md1_sojourn_quantile(0.8, 1.0, 0.9)
    assert pool_max_rate(bound, 0.9, sample, one, adm, top=2.0) == pytest.approx(0.8, rel=0.02)
    # above one a second the queue grows without bound
    assert pool_ttft_quantile(1.2, 0.9, sample, one, adm) == math.inf
    assert pool_max_rate(0.5, 0.9, sample, one, adm, top=2.0) == 0.0  # 1 s alone misses it


def test_a_stable_pool_whose_run_is_short_beside_its_ttft_is_not_behind():
    # 80 instances of 12 stages of 0.1 s, 5 prompts/s each (every stage half busy): 4,000
    # arrivals span 10 s, and a prompt's pass alone is 1.2 s. The pool keeps up, so its
    # percentile is finite: at least the pass, and a stage's queue at half load adds well
    # under another pass
    sample = PoolSample.draw(np.array([1.0]), np.array([1.0]), 4000, seed=1)
    adm = BatchAdmission(12, 100, 1)
    stages = [np.array([[0.1, 0.0, 0.0]] * 12)] * 80
    got = pool_ttft_quantile(400.0, 0.9, sample, stages, adm)
    assert 1.2 <= got < 2.4


@pytest.mark.parametrize("seed", range(6))
def test_the_one_instance_fast_path_is_pool_run_float_for_float(seed):
    # saturated_departures skips the pool's routing: its batches must be pool_run's to the
    # bit, under every limit binding in turn (slots, requests in flight, token budget)
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 3000, size=500).astype(float).tolist()
    cost = rng.uniform(0.0, 0.01, size=(int(rng.integers(1, 13)), 3)) * [1.0, 1e-4, 1e-8]
    adm = BatchAdmission(int(rng.integers(1, 13)), int(rng.integers(1, 300)), 2048 * (seed + 1))
    want = pool_run([0.0] * len(prompts), prompts, [cost], adm)[1]
    assert saturated_departures(prompts, cost, adm) == want
