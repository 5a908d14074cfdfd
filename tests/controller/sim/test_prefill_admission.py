"""How a prefill instance admits requests (``Simulator._admit``). ``"engine"``: as vLLM's
engine core (the default), at most PP batches in flight and at most ``--max-num-seqs``
requests; a request that arrives while a batch slot is free goes alone. ``"stage"``: when the
first stage is free, everything waiting up to the token budget. Saturated, the engine's rule
serves what the planner prices (``InstancePricer.prefill_capacity``).

Worked by hand: identical requests through stages of times s_0..s_{P-1} (a proportionate flow
shop, every request alone in its batch) leave at sum(s) + k max(s), k = 0, 1, ...; with a
limit of PP requests the one admitted when the first leaves (k = P) still leaves at
sum(s) + P max(s), since the stage it enters is free by then."""

import math

import numpy as np
import pytest

from controller.models import model_spec
from controller.models.engines import BatchAdmission, engine_profile, prefill_admission
from controller.planner import plan
from controller.planner.options import PlannerOptions
from controller.sim import SimOptions, Simulator, build_model
from controller.topology import testbed as make_testbed
from controller.workload import Request, Workload, default_sla, summarization

N_IN, N = 300, 6  # 6 x 300 tokens fit the 2,048-token budget in one batch


def four_stage_plan():
    """The testbed's summarization plan with prefill forced to TP 1 x PP 4."""
    g = make_testbed()
    opts = PlannerOptions(prefill_par=(1, 4))
    p = plan(g, model_spec("OPT-66B"), summarization(), default_sla("summarization"), opts)
    assert p.prefill.pp == 4
    return g, p


def test_engine_admission_keeps_pp_batches_in_flight():
    g, p = four_stage_plan()  # four stages: the cap of four requests binds for six
    p.prefill.instances = p.prefill.instances[:1]  # one instance takes all six
    fixed = Workload("fixed", np.full(10, N_IN), np.full(10, 2))
    m = build_model(p, g, fixed)
    ev = m.evaluator
    inst = m.prefill[0]
    t = ev.prefill_times([s.gpus for s in inst.stages])
    alone, busiest = float(t.alone @ t.weights), float(t.busiest @ t.weights)
    six = [Request(0.0, N_IN, 2) for _ in range(N)]
    # a limit of PP = 4 requests: one a batch; the fifth and sixth start as the first and
    # second leave
    sim = Simulator(m, SimOptions(prefill_admission="engine", prefill_max_requests=4))
    r = sim.run(six)
    ttft = np.sort(r.per_request["ttft_s"])
    assert ttft == pytest.approx(alone + busiest * np.arange(N), rel=0.02)
    starts = np.sort(sim.start_pf)
    assert starts[:4].tolist() == [0.0] * 4
    assert starts[4:] == pytest.approx(ttft[:2], rel=1e-9)
    # the export's limit (256): the first four alone fill the 4 batch slots; the fifth and
    # sixth wait for the first to leave and then go as one batch, which leaves after them
    sim = Simulator(m, SimOptions(prefill_admission="engine"))
    r = sim.run(six)
    ttft = np.sort(r.per_request["ttft_s"])
    assert ttft[:4] == pytest.approx(alone + busiest * np.arange(4), rel=0.02)
    assert ttft[4] == ttft[5] > ttft[3]
    starts = np.sort(sim.start_pf)
    assert starts[4] == starts[5] == pytest.approx(ttft[0], rel=1e-9)


def test_stage_admission_batches_what_waits_when_the_first_stage_frees():
    # the first request alone, the five behind it in one batch as soon as it leaves stage 0,
    # which then runs every stage for 5 x 300 tokens
    g, p = four_stage_plan()
    p.prefill.instances = p.prefill.instances[:1]
    fixed = Workload("fixed", np.full(10, N_IN), np.full(10, 2))
    m = build_model(p, g, fixed)
    sim = Simulator(m, SimOptions(prefill_admission="stage"))
    r = sim.run([Request(0.0, N_IN, 2) for _ in range(N)])
    ttft = np.sort(r.per_request["ttft_s"])
    starts = np.sort(sim.start_pf)
    assert starts[0] == 0.0 and np.all(starts[1:] == starts[1]) and starts[1] > 0.0
    assert np.all(ttft[1:] == ttft[1]) and ttft[1] > 4 * ttft[0]


def test_saturated_engine_admission_serves_the_planners_capacity():
    # 1,200 summarization prompts all waiting at once at one TP 1 x PP 4 instance: prompts of
    # 1,150-2,047 tokens fill a batch alone, so four are in flight and a stage idles behind a
    # longer prompt ahead. First tokens a second over the middle half of the run are within
    # 3% of the planner's capacity, which is 15% below the open pipeline's 1 / E[busiest]
    g, p = four_stage_plan()
    p.prefill.instances = p.prefill.instances[:1]
    load = summarization()
    m = build_model(p, g, load)
    t = m.evaluator.prefill_times([s.gpus for s in m.prefill[0].stages])
    n = 1200
    reqs = [Request(0.0, int(x), 1) for x in load.inputs[:n]]
    r = Simulator(m).run(reqs)
    first = np.sort(np.asarray(r.per_request["ttft_s"]))
    served = (n // 2) / (first[3 * n // 4] - first[n // 4])
    open_rate = 1.0 / float(t.busiest @ t.weights)
    assert served == pytest.approx(t.capacity, rel=0.03)
    assert 0.83 * open_rate < t.capacity < 0.87 * open_rate


def test_simulator_admits_under_the_limits_the_planner_prices():
    # both read models.engines.prefill_admission: vLLM's defaults at PP 4 are 4 batches,
    # 256 requests (max_num_seqs) and 2,048 tokens (max_num_batched_tokens); SimOptions'
    # fields override the request limit and the budget only
    g, p = four_stage_plan()
    m = build_model(p, g, summarization())
    assert prefill_admission(engine_profile("vllm"), 4) == BatchAdmission(4, 256, 2048)

    def limits(opts: SimOptions) -> tuple:
        sim = Simulator(m, opts)
        sim.run([Request(0.0, N_IN, 2)])
        st = sim.pre[0]
        return st.max_batches, st.max_requests, st.budget

    assert limits(SimOptions()) == (4, 256, 2048)
    assert limits(SimOptions(prefill_max_requests=8, prefill_token_budget=300)) == (4, 8, 300)
    assert limits(SimOptions(prefill_admission="stage")) == (math.inf, math.inf, 2048)


def test_prefill_instances_of_one_shape_price_their_capacity_once(monkeypatch):
    """A plan's prefill instances of one shape have the same stage costs, so their saturated
    capacity (``prefill_capacity``: an admission loop over 4,000 prompts) is run once and
    each of them gets the same figure (2tracks at 24 servers: 6 prefill instances of PP 6)."""
    from controller.evaluation.scenarios import scenario
    from controller.planner import instances

    runs = []

    def counted(*args):
        runs.append(1)
        return saturated_rate(*args)

    saturated_rate = instances.saturated_rate
    monkeypatch.setattr(instances, "saturated_rate", counted)
    s = scenario("2tracks-summarization", servers=24)
    g, w = s.cluster(), s.load()
    m = build_model(plan(g, s.model_spec(), w, s.sla(), PlannerOptions()), g, w)
    runs.clear()
    ev = m.evaluator
    got = [ev.prefill_instance([x.gpus for x in im.stages]).rate for im in m.prefill]
    assert len(got) == 6 and len(set(got)) == 1
    assert m.prefill[0].pp > 1 and len(runs) == 1
