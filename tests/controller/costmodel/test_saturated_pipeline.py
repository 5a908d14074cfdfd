"""A saturated pipeline that holds at most a few batches and requests
(``queueing.saturated_departures``), worked by hand, and the prefill queue priced at the
slower of it and the open pipeline (``PrefillTimes.capacity``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.costmodel.prefill_pool import saturated_departures, saturated_rate
from controller.costmodel.queueing import PrefillTimes, pipeline_max_rate
from controller.models.engines import BatchAdmission


def departures(prompts, cost, slots, max_requests=10**6, budget=1):
    out = saturated_departures(
        prompts, np.asarray(cost, dtype=float), BatchAdmission(slots, max_requests, budget)
    )
    return [d for d, _ in out]


# three prompts alone in their batches (a budget of one token), two stages whose times are
# (1, 3), (1, 1) and (2, 1) s: stage 0 takes (k^2 - 3k + 4) / 2 and stage 1 k^2 - 5k + 7 for
# prompts of k = 1, 2, 3 tokens
THREE = ([1.0, 2.0, 3.0], [[2.0, -1.5, 0.5], [7.0, -5.0, 1.0]])


def test_two_slots_hold_the_third_until_the_first_leaves():
    # b0 leaves stage 0 at 1, stage 1 at 4; b1 stage 0 at 2, stage 1 at max(2, 4) + 1 = 5;
    # b2 enters when b0 leaves (4): stage 0 at 6, stage 1 at max(6, 5) + 1 = 7
    assert departures(*THREE, 2) == [4.0, 5.0, 7.0]


def test_three_slots_let_the_third_in_at_once():
    # b2 enters at 0: stage 0 at max(0, 2) + 2 = 4, stage 1 at max(4, 5) + 1 = 6
    assert departures(*THREE, 3) == [4.0, 5.0, 6.0]


def test_one_slot_runs_batches_one_after_another():
    assert departures(*THREE, 1) == [4.0, 6.0, 9.0]
    with pytest.raises(ValueError):
        BatchAdmission(0, 1, 1)
    with pytest.raises(ValueError):
        saturated_departures([1.0], np.ones((2, 2)), BatchAdmission(1, 1, 1))


def test_equal_stages_and_a_slot_per_stage_keep_the_pipeline_full():
    # n one-token prompts of s per stage over K stages, K slots: the first leaves at K s, the
    # last at (n + K - 1) s, so the steady rate is (n - 1) / ((n - 1) s), one per s
    s, k, n = 0.5, 4, 100
    cost = [[0.0, s, 0.0]] * k
    assert departures([1.0] * n, cost, k)[-1] == pytest.approx((n + k - 1) * s)
    rate = saturated_rate([1.0] * n, np.asarray(cost), BatchAdmission(k, 10**6, 1))
    assert rate == pytest.approx(1 / s)
    # one batch of three tokens, 3 s per stage: its three requests over its departure, K 3 s
    assert saturated_rate([1.0] * 3, np.asarray(cost), BatchAdmission(k, 10**6, 100)) == (
        pytest.approx(3 / (k * 3 * s))
    )


def test_unequal_requests_need_more_slots_than_stages():
    # prompts of 1 and 3 tokens alternating, alone in their batches, 1 s a token at each of
    # four stages: the open pipeline serves 1 / E[stage] = 1 / 2 per second. One slot: a pair
    # takes 4 + 12 = 16 s, the first leaves at 4 and the last at 16 n / 2. Four slots: a long
    # prompt holds every stage for 3 s and the short one behind it waits, so the pipeline
    # runs below 1/2; many slots close the gap
    n = 400
    prompts = [1.0, 3.0] * (n // 2)
    cost = np.array([[0.0, 1.0, 0.0]] * 4)
    rates = [saturated_rate(prompts, cost, BatchAdmission(k, 10**6, 1)) for k in (1, 4, 16, 64)]
    assert rates[0] == pytest.approx((n - 1) / (n / 2 * 16 - 4), rel=1e-12)
    assert rates == sorted(rates)
    assert rates[1] < 0.95 * 0.5 < 0.97 * 0.5 < rates[-1] <= 0.5


def test_a_batch_fills_to_the_budget_and_pays_its_fixed_cost_once():
    # 100-token prompts, each of 4 stages takes 0.1 s + 1 ms a token: batches of 3 (a budget
    # of 300) take 0.4 s and 4 slots keep the pipeline full, so a batch of 3 leaves every
    # 0.4 s; a budget of 150 makes each batch one prompt, out every 0.2 s
    n = 300
    prompts, cost = [100.0] * n, np.array([[0.1, 1e-3, 0.0]] * 4)
    out = saturated_departures(prompts, cost, BatchAdmission(4, 10**6, 300))
    assert {size for _, size in out} == {3}
    assert saturated_rate(prompts, cost, BatchAdmission(4, 10**6, 300)) == pytest.approx(3 / 0.4)
    assert saturated_rate(prompts, cost, BatchAdmission(4, 10**6, 150)) == pytest.approx(1 / 0.2)


def test_the_request_limit_starts_a_batch_only_when_requests_leave():
    # six one-token prompts, two stages of 1 s a batch, a budget of 100 tokens, two slots:
    # a limit of 3 requests makes two batches of 3, the second entering when the first
    # leaves (2 s): it leaves at 4. A limit of 2: three batches leaving at 2, 4, 6. A limit
    # of 6: one batch of six, out at 2
    cost = np.array([[1.0, 0.0, 0.0]] * 2)
    six = [1.0] * 6
    assert saturated_departures(six, cost, BatchAdmission(2, 3, 100)) == [(2.0, 3), (4.0, 3)]
    assert departures(six, cost, 2, 2, 100) == [2.0, 4.0, 6.0]
    assert saturated_departures(six, cost, BatchAdmission(2, 6, 100)) == [(2.0, 6)]


def test_a_capacity_below_the_busiest_stage_slows_the_queue_by_their_ratio():
    # one length, busiest stage 0.5 s (open pipeline: 2 requests/s); capacity 1.6/s scales
    # the service time by 2 / 1.6 = 1.25, so the queue saturates at 1.6/s, and a capacity
    # above 2/s changes nothing
    open_ = PrefillTimes(np.array([2.0]), np.array([0.5]), np.ones(1), 0.9)
    slow = PrefillTimes(np.array([2.0]), np.array([0.5]), np.ones(1), 0.9, capacity=1.6)
    fast = PrefillTimes(np.array([2.0]), np.array([0.5]), np.ones(1), 0.9, capacity=3.0)
    assert slow.service_scale == pytest.approx(1.25)
    assert slow.mean_busiest == pytest.approx(0.625)
    assert slow.mean_busiest_sq == pytest.approx(0.625**2)
    assert fast.service_scale == open_.service_scale == 1.0
    assert open_.capacity == math.inf
    bound = 1e9  # every request meets it below saturation: the rate is the queue's limit
    assert pipeline_max_rate(bound, slow) == pytest.approx(1.6, rel=1e-6)
    assert pipeline_max_rate(bound, open_) == pytest.approx(2.0, rel=1e-6)
