"""The planner's predictions against the simulator at low load: the
plan ``heroserve plan`` makes for the testbed (its own role split, schemes and batches),
simulated with the workload's own request lengths at a small fraction of its predicted rate,
so that requests rarely meet. The cost model's lone-request figures for that plan, averaged
over the workload as the planner averages (mean length, mean squared length for attention),
must be within 10% of the simulated means: TTFT, and TPOT, which spreads the KV transfer over
each request's output tokens."""

from __future__ import annotations

import numpy as np
import pytest

from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.sim import Simulator, build_model, make_requests
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla, summarization


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "decode_par"),
    [
        ("chatbot", None),  # decode TP 8 over two servers, a ring chosen at the plan's batch
        ("chatbot", (4, 2)),  # the layout it chose before the boards, inside one server
        ("summarization", None),
    ],
)
def test_prediction_within_10_percent_of_the_simulator_at_low_load(kind, decode_par):
    g = make_testbed()
    load = chatbot() if kind == "chatbot" else summarization()
    opts = PlannerOptions(decode_par=decode_par)
    p = plan(g, model_spec("OPT-66B"), load, default_sla(kind), opts)
    m = build_model(p, g, load)
    ev = m.evaluator
    rate = 0.02 * p.predicted.rate  # about one request in the cluster at a time
    reqs = make_requests(load, rate, 300, seed=1)
    r = Simulator(m).run(reqs)
    assert r.finished == 300
    pr = r.per_request
    out = np.array([q.output_tokens for q in reqs])
    # the planner's lone-request figures for this plan: its prefill instances' serve time,
    # its decode instances' step at a batch of one plus the KV transfer spread over each
    # request's tokens after the first (T_f of a mean-length request, as the plan prices it);
    # every group runs the scheme the plan chose for it (the chatbot decode group: the ring
    # chosen at its batch of 146, though hierarchical INA would be faster at a batch of 1)
    ttft = np.mean([ev.prefill_instance([s.gpus for s in i.stages]).serve_s for i in m.prefill])
    step = np.mean([ev.decode_step([s.gpus for s in i.stages], 1).step_s for i in m.decode])
    t_f = p.predicted.kv_transfer_s
    sim_ttft = float(np.mean(pr["ttft_s"]))
    many = np.array(pr["tpot_s"]) > 0  # requests of one token have no TPOT
    sim_tpot = float(np.mean(np.array(pr["tpot_s"])[many]))
    want_tpot = step + t_f * float(np.mean(1.0 / np.maximum(1, out[many] - 1)))
    print(
        f"\n{kind}: TTFT sim {sim_ttft * 1e3:.1f} ms, planner {ttft * 1e3:.1f} ms; TPOT sim "
        f"{sim_tpot * 1e3:.2f} ms, planner {want_tpot * 1e3:.2f} ms (step {step * 1e3:.2f} ms, "
        f"T_f {t_f * 1e3:.1f} ms); plan {p.prefill.tp}x{p.prefill.pp} / "
        f"{p.decode.tp}x{p.decode.pp}, predicted H {p.predicted.rate:.3f} req/s"
    )
    assert sim_ttft == pytest.approx(ttft, rel=0.10)
    assert sim_tpot == pytest.approx(want_tpot, rel=0.10)
