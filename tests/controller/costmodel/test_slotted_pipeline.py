"""A pipeline that holds at most ``slots`` requests (``queueing.slotted_departures``), worked
by hand, and its saturated rate against the open pipeline's."""

from __future__ import annotations

import numpy as np
import pytest

from controller.costmodel.queueing import (
    slotted_batch_rate,
    slotted_departures,
    slotted_pipeline_rate,
)

# three requests, two stages: (1, 3), (1, 1), (2, 1) seconds
THREE = np.array([[1.0, 3.0], [1.0, 1.0], [2.0, 1.0]])


def test_two_slots_hold_the_third_until_the_first_leaves():
    # r0 leaves stage 0 at 1, stage 1 at 4; r1 stage 0 at 2, stage 1 at max(2, 4) + 1 = 5;
    # r2 enters when r0 leaves (4): stage 0 at 6, stage 1 at max(6, 5) + 1 = 7
    assert slotted_departures(THREE, 2).tolist() == [4.0, 5.0, 7.0]


def test_three_slots_let_the_third_in_at_once():
    # r2 enters at 0: stage 0 at max(0, 2) + 2 = 4, stage 1 at max(4, 5) + 1 = 6
    assert slotted_departures(THREE, 3).tolist() == [4.0, 5.0, 6.0]


def test_one_slot_runs_requests_one_after_another():
    assert slotted_departures(THREE, 1).tolist() == [4.0, 6.0, 9.0]


def test_equal_stages_and_a_slot_per_stage_keep_the_pipeline_full():
    # n requests of s per stage over K stages, K slots: the last leaves at (n + K - 1) s
    s, k, n = 0.5, 4, 100
    out = slotted_departures(np.full((n, k), s), k)
    assert out[-1] == pytest.approx((n + k - 1) * s)
    assert slotted_pipeline_rate(np.full((k, 1), s), np.ones(1), k, requests=n) == (
        pytest.approx(n / ((n + k - 1) * s))
    )


def test_unequal_requests_need_more_slots_than_stages():
    # lengths 1 and 3 (half each), four equal stages: the open pipeline serves
    # 1 / E[stage time] = 1 / 2 per second; four slots leave stages idle behind long
    # requests, and more slots close the gap
    stage_s = np.array([[1.0, 3.0]] * 4)
    w = np.array([0.5, 0.5])
    rates = [slotted_pipeline_rate(stage_s, w, n) for n in (1, 4, 16, 64)]
    assert rates[0] == pytest.approx(1 / 8, rel=0.05)  # one at a time: 4 x E[length]
    assert rates == sorted(rates)
    assert rates[1] < 0.95 * 0.5 and rates[-1] > 0.97 * 0.5
    with pytest.raises(ValueError):
        slotted_departures(THREE, 0)


def test_batches_fill_to_the_budget_and_pay_their_fixed_cost_once():
    # prompts of 100 tokens, a budget of 300: batches of 3; each of 4 stages takes
    # 0.1 s + 1 ms a token = 0.4 s a batch; 4 slots keep the pipeline full, so n batches
    # leave by (n + 3) x 0.4 s, 3 requests each
    def stage_s_of(k: float, k2: float) -> np.ndarray:
        return np.full(4, 0.1 + 1e-3 * k)

    n = 300  # requests: 100 batches
    rate = slotted_batch_rate(np.array([100.0]), np.ones(1), stage_s_of, 4, 300, requests=n)
    assert rate == pytest.approx(n / ((100 + 3) * 0.4))
    # one request a batch (a budget below two prompts) pays the 0.1 s for each: 0.2 s a batch
    one = slotted_batch_rate(np.array([100.0]), np.ones(1), stage_s_of, 4, 150, requests=n)
    assert one == pytest.approx(n / ((n + 3) * 0.2))
    assert rate > one
