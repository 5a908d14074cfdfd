"""Validation of the simulator: at very low load it reproduces the
cost model; every request finishes; Little's law holds; more bandwidth never lowers the max
rate."""

import numpy as np
import pytest
from support.plans import HIER_DECODE, hier_plan

from controller.costmodel.netparams import NetParams
from controller.evaluation.sweep import max_rates
from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.planner.grouping import PodGroups
from controller.sim import SimOptions, Simulator, build_model, make_requests
from controller.topology import testbed as make_testbed
from controller.topology.graph import scale_bandwidth
from controller.workload import Request, Workload, chatbot, default_sla, summarization

IN, OUT = 161, 338


@pytest.fixture(scope="module")
def tb():
    g = make_testbed(fixed_roles=True)
    return g, plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"))


def _one_pod(stages_list):
    groups = [s for inst in stages_list for s in inst]
    return [PodGroups(None, [x for grp in groups for x in grp], groups)]


@pytest.mark.parametrize(
    "mode,kind,n_in,n_out",
    [
        ("pipelined", "chatbot", IN, OUT),
        ("paper", "chatbot", IN, OUT),
        ("pipelined", "summarization", 1641, 65),
        ("paper", "summarization", 1641, 65),
    ],
)
def test_low_load_matches_the_cost_model(mode, kind, n_in, n_out):
    """Requests 1000 s apart (each alone in the cluster), all of the mean length: TTFT is the
    prefill instance's serve time (Eqs. 3, 5-12), the KV transfer T_f (Eqs. 14-15), each
    decode step Eq. 13 plus its all-reduces at batch 1, all within 5% of the evaluator's own
    figures, in either cost mode (the plan records it; the simulator prices as it says) and
    for both workloads' mean requests; TPOT = step + T_f / (out - 1) (the transfer spread
    over the tokens)."""
    g = make_testbed(fixed_roles=True)
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    load = chatbot() if kind == "chatbot" else summarization()
    p = plan(g, model_spec("OPT-66B"), load, default_sla(kind), opts)
    assert p.options["cost_mode"] == mode
    fixed = Workload("fixed", np.full(10, n_in), np.full(10, n_out))
    m = build_model(p, g, fixed)
    assert m.pipelined == (mode == "pipelined") and m.evaluator.net.cost_mode == mode
    ev = m.evaluator
    reqs = [Request(1000.0 * i, n_in, n_out) for i in range(4)]
    r = Simulator(m).run(reqs)
    assert r.finished == 4
    pre_stages = [s.gpus for s in m.prefill[0].stages]
    dec_stages = [s.gpus for s in m.decode[0].stages]
    want_ttft = ev.prefill_instance(pre_stages).serve_s
    pre = ev.prefill_phase(p.prefill.tp, p.prefill.pp, _one_pod([pre_stages]))
    dec = ev.decode_phase(p.decode.tp, p.decode.pp, _one_pod([dec_stages]), 0.0)
    want_tf, _ = ev.kv_transfer(pre, dec, 1, 1)
    want_step = ev.decode_step(dec_stages, 1).step_s
    pr = r.per_request
    ttft = np.array(pr["ttft_s"])
    tf = np.array(pr["kv_done_s"]) - np.array(pr["first_token_s"])
    step = (np.array(pr["finish_s"]) - np.array(pr["kv_done_s"])) / (n_out - 1)
    tpot = np.array(pr["tpot_s"])
    print(f"{mode} {kind}: TTFT sim {ttft.mean() * 1e3:.2f} ms vs model {want_ttft * 1e3:.2f} ms; "
          f"T_f {tf.mean() * 1e3:.2f} vs {want_tf * 1e3:.2f} ms; decode step "
          f"{step.mean() * 1e3:.2f} vs {want_step * 1e3:.2f} ms; TPOT {tpot.mean() * 1e3:.2f} vs "
          f"{(want_step + want_tf / (n_out - 1)) * 1e3:.2f} ms")  # fmt: skip
    assert ttft == pytest.approx(want_ttft, rel=0.05)
    assert tf == pytest.approx(want_tf, rel=0.05)
    assert step == pytest.approx(want_step, rel=0.05)
    assert tpot == pytest.approx(want_step + want_tf / (n_out - 1), rel=0.05)


@pytest.mark.parametrize("rate,cv", [(2.0, 1.0), (8.0, 1.0), (3.0, 4.0)])
def test_every_request_that_arrives_finishes(tb, rate, cv):
    g, p = tb
    w = chatbot()
    m = build_model(p, g, w)
    reqs = make_requests(w, rate, 400, seed=3, cv=cv)
    r = Simulator(m).run(reqs)
    assert r.finished == r.requests == 400
    pr = r.per_request
    assert all(f >= a for f, a in zip(pr["finish_s"], pr["arrival_s"], strict=True))
    assert all(t >= 0 for t in pr["ttft_s"])


@pytest.mark.parametrize("rate", [2.0, 3.5])
def test_littles_law_on_the_simulated_queue(tb, rate):
    """L (time average of the queue length, integrated event by event) = lambda W (per-request
    waits), for the prefill queue and for the whole system, within 5%."""
    g, p = tb
    w = chatbot()
    r = Simulator(build_model(p, g, w)).run(make_requests(w, rate, 800, seed=5, cv=2.0))
    lit = r.little
    print(lit)
    assert lit["ratio"] == pytest.approx(1.0, abs=0.05)
    assert lit["ratio_system"] == pytest.approx(1.0, abs=0.05)
    assert lit["L_system"] > 1.0  # a real queue, not an empty system


class _LocalRunner:
    """The sweep's runner interface, simulating in this process on a given cluster."""

    workers = 1

    def __init__(self, models):
        self.models = models

    def map(self, points, what=""):
        out = []
        for key, rate in points:
            m, w = self.models[key]
            reqs = make_requests(w, rate, 1500, seed=7)  # long enough to reach steady state
            out.append({"attainment": Simulator(m, SimOptions()).run(reqs).attainment})
        return out


def test_doubling_every_link_never_lowers_the_max_rate(tb):
    g, p = tb
    w = chatbot()
    models = {
        "1x": (build_model(p, g, w), w),
        "2x": (build_model(p, scale_bandwidth(g, 2.0), w), w),
    }

    class Point(tuple):
        def __getitem__(self, i):
            return tuple.__getitem__(self, 1 if i == 4 else i)

    br = max_rates(_LocalRunner(models), lambda k, rate: Point((k, rate)),
                   {"1x": 3.0, "2x": 3.0}, target=0.9, rel_tol=0.02)  # fmt: skip
    print({k: (b.lo, b.hi) for k, b in br.items()})
    assert br["1x"].lo > 0
    assert br["2x"].lo >= br["1x"].lo


@pytest.mark.parametrize(
    "mode,lanes,phases",
    [("pipelined", "int32", 3), ("paper", "int32", 3), ("pipelined", "bfp16", 4),
     ("paper", "bfp16", 3)],
)  # fmt: skip
def test_low_load_hier_plan_matches_the_cost_model(mode, lanes, phases):
    """A hierarchical-INA decode group: each decode step's all-reduces are the phases of
    ``hier_pattern`` (reduce-scatter, bfp16's proposal round when pipelined, INA per rail,
    all-gather); alone, the simulator's step is the evaluator's with that pattern, in both
    cost modes and both lane formats the switch runs."""
    g = make_testbed()
    p = hier_plan(g, mode, lanes)
    assert p.options["ina_lanes"] == lanes
    fixed = Workload("fixed", np.full(10, IN), np.full(10, OUT))
    m = build_model(p, g, fixed)
    st = m.decode[0].stages[0]
    assert st.options[0].scheme == "hier" and len(st.options[0].phases) == phases
    r = Simulator(m).run([Request(1000.0 * i, IN, OUT) for i in range(3)])
    assert r.finished == 3 and set(r.policy_use) >= {"hier"}
    want_step = m.evaluator.decode_step([HIER_DECODE], 1).step_s
    pr = r.per_request
    step = (np.array(pr["finish_s"]) - np.array(pr["kv_done_s"])) / (OUT - 1)
    print(f"{mode}: hier decode step sim {step.mean() * 1e3:.3f} vs model {want_step * 1e3:.3f} ms")
    assert step == pytest.approx(want_step, rel=1e-6)
    assert r.ina_throughput_Bps > 0  # hierarchical INA aggregates in switches
