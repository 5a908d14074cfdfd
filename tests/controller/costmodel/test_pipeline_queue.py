"""The FIFO prefill pipeline's TTFT model (``costmodel.queueing``): its distribution worked by
hand on one and two request lengths, its percentile and largest rate in closed form, and the
closed form against the exact FIFO pipeline (each request's stage time the same at every
stage, no overtaking) computed request by request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.costmodel.queueing import (
    PrefillTimes,
    pipeline_max_rate,
    pipeline_ttft_cdf,
    pipeline_ttft_quantile,
)


def one_length(q: float = 0.9) -> PrefillTimes:
    # every request: 1 s through the pipeline, 0.25 s at its busiest stage
    return PrefillTimes(np.array([1.0]), np.array([0.25]), np.array([1.0]), q)


def test_cdf_one_length_by_hand():
    # rate 0.5: rho = 0.125, W = 0.5 * 0.25^2 / (2 * 0.875) = 0.017857...
    # bound 1.2: an earlier request shadows when u < (1 + 0.25 + W - 1.2) / (1 - rho);
    # P(none) = exp(-0.5 * 0.067857 / 0.875) = exp(-0.0387755) = 0.961966
    w = 0.5 * 0.0625 / 1.75
    assert w == pytest.approx(0.017857142857)
    want = math.exp(-0.5 * (1.25 + w - 1.2) / 0.875)
    assert want == pytest.approx(0.961966, abs=1e-6)
    assert pipeline_ttft_cdf(1.2, 0.5, one_length()) == pytest.approx(want, rel=1e-12)
    # below alone + W nobody meets it; alone + busiest + W and above everybody does
    assert pipeline_ttft_cdf(1.0 + w - 1e-9, 0.5, one_length()) == 0.0
    assert pipeline_ttft_cdf(1.25 + w, 0.5, one_length()) == pytest.approx(1.0)
    # an empty pipeline: the alone time decides
    assert pipeline_ttft_cdf(1.0, 0.0, one_length()) == 1.0
    # saturated busiest stage (rate >= 1 / 0.25)
    assert pipeline_ttft_cdf(100.0, 4.0, one_length()) == 0.0


def test_cdf_two_lengths_by_hand():
    # half the requests 1 s alone (0.1 s busiest), half 3 s (0.3 s); rate 1:
    # rho = 0.2, E[b^2] = 0.05, W = 0.05 / 1.6 = 0.03125. Bound 2 s: the 3 s requests miss;
    # a 1 s request is shadowed by a 3 s one that came within (3 + 0.1 + W - 2) / 0.8 s, so
    # P = 0.5 * exp(-0.5 * 1.13125 / 0.8) = 0.5 * exp(-0.70703125) = 0.246553
    t = PrefillTimes(np.array([1.0, 3.0]), np.array([0.1, 0.3]), np.array([1.0, 1.0]), 0.9)
    assert pipeline_ttft_cdf(2.0, 1.0, t) == pytest.approx(0.5 * math.exp(-0.70703125))
    assert pipeline_ttft_cdf(2.0, 1.0, t) == pytest.approx(0.246553, abs=1e-6)


def test_quantile_and_max_rate_closed_form():
    t = one_length(0.9)
    # exp(-0.5 (1.25 + W - x) / 0.875) = 0.9  =>  x = 1.25 + W + 0.875 ln(0.9) / 0.5
    w = 0.5 * 0.0625 / 1.75
    x = 1.25 + w + 0.875 * math.log(0.9) / 0.5
    assert x == pytest.approx(1.083476, abs=1e-6)
    assert pipeline_ttft_quantile(0.5, t) == pytest.approx(x, abs=1e-9)
    assert pipeline_ttft_quantile(4.0, t) == math.inf
    # the largest rate meeting 1.2 s for 90%: its percentile is the bound, and a hair more
    # rate misses it
    lam = pipeline_max_rate(1.2, t)
    assert 0.0 < lam < 4.0
    assert pipeline_ttft_quantile(lam, t) == pytest.approx(1.2, abs=1e-6)
    assert pipeline_ttft_cdf(1.2, lam * 1.001, t) < 0.9
    # a bound that even a lone request misses admits no rate
    assert pipeline_max_rate(0.99, t) == 0.0


def fifo_pipeline_ttft(arrivals: np.ndarray, stage_s: np.ndarray, stages: int) -> np.ndarray:
    """The exact FIFO pipeline: request j spends stage_s[j] at each of ``stages`` stages and
    a stage takes requests in arrival order, one at a time."""
    free = np.zeros(stages)  # when each stage finishes its last request
    out = np.empty(len(arrivals))
    for j, (a, s) in enumerate(zip(arrivals, stage_s, strict=True)):
        t = a
        for k in range(stages):
            t = max(t, free[k]) + s
            free[k] = t
        out[j] = t - a
    return out


def test_closed_form_tracks_the_exact_fifo_pipeline():
    # 8 stages; 90% of requests 10 ms per stage, 10% 100 ms (long prompts): at 40% load on
    # the busiest stage, a short request behind a long one waits out its whole pipeline
    stages, short, long_ = 8, 0.01, 0.1
    lengths = np.array([short, long_])
    share = np.array([0.9, 0.1])
    t = PrefillTimes(stages * lengths, lengths, share, 0.9)
    rate = 0.4 / float(share @ lengths)
    rng = np.random.default_rng(0)
    n = 60_000
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    per_stage = rng.choice(lengths, size=n, p=share)
    sim = fifo_pipeline_ttft(arrivals, per_stage, stages)[n // 10 :]  # past the warm-up
    for q in (0.5, 0.9):
        model = pipeline_ttft_quantile(rate, PrefillTimes(t.alone, t.busiest, share, q))
        assert model == pytest.approx(float(np.quantile(sim, q)), rel=0.15)
    # the mean-length M/D/1 figure the planner used before misses the 90th percentile by far
    mean_s = float(share @ lengths)
    pk = stages * mean_s + rate * mean_s**2 / (2 * (1 - rate * mean_s))
    assert pk < 0.5 * float(np.quantile(sim, 0.9))
