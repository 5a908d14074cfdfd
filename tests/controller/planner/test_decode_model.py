"""The planner's decode side against what a continuous-batching decode instance does: a
request takes one decode step per output token after the first (prefill makes the first),
so an instance that runs ``batch`` requests per micro-batch, one step per busiest-stage time,
serves batch / (busiest stage x mean decode steps) requests/s, and the search's capacity
bound stays above it; and the simulator's decode instances, kept saturated in the layout the
planner chose, finish requests at that rate."""

from __future__ import annotations

import numpy as np
import pytest

from controller.models import model_spec
from controller.planner import plan
from controller.planner.bounds import capacity_bound
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import Problem
from controller.sim import Simulator, build_model, make_requests
from controller.topology import testbed as make_testbed
from controller.workload import Workload, default_sla

STAGES = [["srv0-gpu0", "srv0-gpu1"], ["srv0-gpu2", "srv0-gpu3"]]


def evaluator(load: Workload) -> Evaluator:
    g = make_testbed()
    return Evaluator(Problem(g, model_spec("OPT-66B"), load, default_sla("chatbot")), HEROSERVE)


def test_decode_steps_are_the_output_tokens_after_the_first():
    # outputs 2, 4 and 6: 1, 3 and 5 decode steps, 3 on average (not the mean output, 4)
    assert Workload("x", np.array([10, 10, 10]), np.array([2, 4, 6])).mean_decode_steps == 3.0
    # every request ends at its first token: no decode step; priced as one, finitely
    assert Workload("x", np.array([10, 10]), np.array([1, 1])).mean_decode_steps == 1.0


def test_decode_rate_is_batch_over_busiest_stage_times_decode_steps():
    load = Workload("x", np.full(30, 100), np.tile([2, 4, 6], 10))
    ev = evaluator(load)
    inst = ev.decode_instance(STAGES, 0.0)
    assert inst.batch >= 1
    # 3 decode steps per request, one per busiest-stage time for each of the batch's requests
    assert inst.rate == pytest.approx(inst.batch / (inst.bottleneck_s * 3.0), rel=1e-12)
    # the search's bound (compute alone) stays an upper bound on that rate
    bound = capacity_bound(ev, "decode", [g for s in STAGES for g in s], 2, 2)
    assert bound >= inst.rate


@pytest.mark.slow
def test_a_saturated_simulated_decode_instance_finishes_requests_at_the_decode_rate():
    # every request: a 20-token prompt and 11 output tokens, so 10 decode steps each; short
    # prompts keep the KV transfer far from binding
    load = Workload("fixed", np.full(10, 20), np.full(10, 11))
    g = make_testbed()
    p = plan(g, model_spec("OPT-66B"), load, default_sla("chatbot"))
    decode_rate = sum(i.rate for i in p.decode.instances)
    assert decode_rate >= p.predicted.rate
    # offered twice what decode serves: the queue grows and every micro-batch stays full, so
    # completions per second over the middle half of the requests are decode's capacity;
    # counting 11 steps per request (the output length) would predict 10/11 of it
    n = 4000
    reqs = make_requests(load, 2 * decode_rate, n, seed=1)
    r = Simulator(build_model(p, g, load)).run(reqs)
    # the planner prices prefill one prompt a batch (400 req/s here, about decode's rate);
    # the engines batch twenty-token prompts, so prefill makes first tokens faster than decode
    # takes them, and decode is what binds
    first = np.sort(np.asarray(r.per_request["ttft_s"]) + [q.arrival_s for q in reqs])
    assert (n // 2) / (first[3 * n // 4] - first[n // 4]) > 1.1 * decode_rate
    fin = np.sort(np.asarray(r.per_request["finish_s"]))
    # requests of one length finish in bursts (a micro-batch's cohort at one step end, as
    # many as 102 at once here), so the requests between two finish times are not the rate
    # times the time between them: the rate is the least-squares slope of the finished count
    # over time, on the middle half of the requests, to which every burst contributes
    mid = fin[n // 4 : 3 * n // 4]
    served = np.polyfit(mid, np.arange(len(mid)), 1)[0]
    assert served == pytest.approx(decode_rate, rel=0.03)
