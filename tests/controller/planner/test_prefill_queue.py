"""The planner's prefill side on the FIFO pipeline model: a prefill instance's times per
request length (``InstancePricer.prefill_times``) against its mean-length figures, its rate
at the TTFT bound's percentile; and the plan's predicted TTFT, the prefill pool's percentile
as the engines admit prompts (``planner.ttft``)."""

from __future__ import annotations

import numpy as np
import pytest

from controller.costmodel.queueing import pipeline_ttft_quantile
from controller.models import model_spec
from controller.planner import plan
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import Problem
from controller.planner.ttft import pool_ttft
from controller.topology import testbed as make_testbed
from controller.workload import Workload, chatbot, default_sla, summarization


def evaluator(load: Workload) -> Evaluator:
    g = make_testbed()
    return Evaluator(Problem(g, model_spec("OPT-66B"), load, default_sla("chatbot")), HEROSERVE)


STAGES = [["srv0-gpu0", "srv0-gpu1"], ["srv0-gpu2", "srv0-gpu3"]]


def test_one_length_times_are_the_mean_request_figures():
    # every prompt 300 tokens: the per-length times are the mean request's serve time and
    # busiest stage exactly (the all-reduce and hop lines pass through the mean's prices)
    load = Workload("fixed", np.full(50, 300), np.full(50, 20))
    ev = evaluator(load)
    inst = ev.prefill_instance(STAGES)
    t = ev.prefill_times(STAGES)
    assert t.alone.tolist() == pytest.approx([inst.serve_s], rel=1e-12)
    assert t.busiest.tolist() == pytest.approx([inst.bottleneck_s], rel=1e-12)
    assert t.q == 0.9


def test_times_grow_with_the_prompt_and_the_rate_sits_at_the_bound():
    load = chatbot()
    ev = evaluator(load)
    inst = ev.prefill_instance(STAGES)
    t = inst.ttft
    assert t is not None
    assert np.all(np.diff(t.alone) > 0) and np.all(np.diff(t.busiest) > 0)
    # the lengths' weights are the workload's shares
    x, share = ev.input_lengths
    assert float(share @ x) == pytest.approx(load.mean_input)
    # 90% of requests meet the TTFT bound at the instance's rate, and no more rate fits
    assert pipeline_ttft_quantile(inst.rate, t) == pytest.approx(ev.problem.sla.ttft_s, rel=1e-6)
    assert pipeline_ttft_quantile(inst.rate * 1.01, t) > ev.problem.sla.ttft_s
    # the search's capacity bound (compute alone, even stages) stays above the real rate
    assert ev.ideal_prefill_rate("A100-40GB", 2, 2) >= inst.rate


def test_plan_predicts_the_ttft_percentile_at_its_rate():
    # the plan's TTFT is the prefill pool's as the engines admit prompts (planner.ttft), at
    # H; the search's closed form prices it lower here (one request a batch, no wait for a
    # slot), and the SLA holds by either
    g = make_testbed()
    load = chatbot()
    p = plan(g, model_spec("OPT-66B"), load, default_sla("chatbot"))
    ev = evaluator(load)
    stages = [i.stages for i in p.prefill.instances]
    want = pool_ttft(ev, stages, p.predicted.rate)
    assert p.predicted.ttft_s == want
    insts = [ev.prefill_instance(s) for s in stages]
    total = sum(i.rate for i in insts)
    closed = max(pipeline_ttft_quantile(p.predicted.rate * i.rate / total, i.ttft) for i in insts)
    assert closed < 0.8 * p.predicted.ttft_s
    assert p.predicted.ttft_s <= p.sla.ttft_s


def test_kv_bound_plan_predicts_the_ttft_at_the_rate_it_serves():
    # the testbed with every Ethernet link at a tenth of its speed: the KV transfer bounds H
    # below what the prefill instances serve, so they run below their TTFT bound, and the
    # predicted TTFT is the pool's percentile at H (not at the rate the phases serve before
    # the KV bound, where the closed form sits at the SLA)
    g = make_testbed()
    for _, _, d in g.edges(data=True):
        if d["link"] == "ethernet":
            d["capacity"] /= 10
            d["available"] /= 10
    load = summarization()
    sla = default_sla("summarization")
    p = plan(g, model_spec("OPT-66B"), load, sla)
    ev = Evaluator(Problem(g, model_spec("OPT-66B"), load, sla), HEROSERVE)
    insts = [ev.prefill_instance(i.stages) for i in p.prefill.instances]
    total = sum(i.rate for i in insts)
    assert p.predicted.rate < 0.9 * total  # the KV transfer binds
    stages = [i.stages for i in p.prefill.instances]
    assert p.predicted.ttft_s == pool_ttft(ev, stages, p.predicted.rate)
    assert p.predicted.ttft_s < 0.5 * sla.ttft_s
