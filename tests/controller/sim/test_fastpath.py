"""The simulator's fast path (``controller/sim/fastpath.py``, ``SimOptions.fast``) against
the event simulator: the same schedule to 1e-9 where no two transfers share a link, and the
issue's agreement (1 point of attainment, 5% of mean TTFT and TPOT) where they do; its KV
tables against each pair's transfer; its refusals."""

import numpy as np
import pytest

from controller.cli import main
from controller.costmodel.prefill_pool import ROUTE_ALL_MAX
from controller.errors import InputError
from controller.evaluation.scenarios import scenario
from controller.planner import PlannerOptions, plan
from controller.sim import (
    FastSimulator,
    SimOptions,
    Simulator,
    build_model,
    make_requests,
    request_arrays,
)
from controller.sim.engine import route_draws
from controller.sim.fastpath import fast_tables


def test_same_schedule_when_no_transfers_overlap(many_plan):
    """At a low rate no two KV transfers are in flight at once, so the event simulator's
    fluid network never stretches one and every request's times must be the same."""
    g, w, p = many_plan
    reqs = make_requests(w, 0.02 * p.predicted.rate, 150, seed=3)
    model = build_model(p, g, w)
    slow = Simulator(model, SimOptions()).run(reqs)
    fast = FastSimulator(build_model(p, g, w), SimOptions()).run(reqs)
    assert slow.rerates == 0  # nothing was shared: the premise of the comparison
    for key, values in slow.per_request.items():
        assert fast.per_request[key] == pytest.approx(values, rel=1e-9, nan_ok=True), key
    assert fast.policy_use == slow.policy_use
    assert fast.little["L_system"] == pytest.approx(slow.little["L_system"], rel=1e-9)
    assert fast.peak_kv_fraction == pytest.approx(slow.peak_kv_fraction)
    # the same KV samples; the last may differ (sampling stops when nothing else is left to
    # happen, and the event simulator's lazy step ends leave its heap empty sooner)
    n = min(len(fast.kv_timeline), len(slow.kv_timeline))
    assert abs(len(fast.kv_timeline) - len(slow.kv_timeline)) <= 1 and n > 100
    assert np.asarray(fast.kv_timeline[:n]) == pytest.approx(np.asarray(slow.kv_timeline[:n]))


@pytest.mark.parametrize("which", ["many_plan", "pp2_plan"])
@pytest.mark.parametrize("factor", [0.6, 1.0, 2.0])
def test_agreement_with_the_event_simulator(which, factor, request):
    """Where transfers contend (the fast path gives each its time alone): within 1 point
    of attainment and 5% of mean TTFT and TPOT, from light load to twice the planner's
    capacity (preemptions included there)."""
    g, w, p = request.getfixturevalue(which)
    reqs = make_requests(w, factor * p.predicted.rate, 1500, seed=1)
    slow = Simulator(build_model(p, g, w), SimOptions()).run(reqs)
    fast = FastSimulator(build_model(p, g, w), SimOptions()).run(reqs)
    assert abs(fast.attainment - slow.attainment) <= 0.01
    for what in ("ttft_s", "tpot_s"):
        a, b = getattr(fast, what)["mean"], getattr(slow, what)["mean"]
        assert a == pytest.approx(b, rel=0.05), what
    assert fast.finished == slow.finished == len(reqs)
    assert (fast.preemptions > 0) == (slow.preemptions > 0)


def test_routing_among_many_instances_is_shared(twelve_decode_plan):
    """12 decode instances, so the router compares two candidates drawn per request
    (``route_draws``): both paths meet the same ones. The prefill side crosses no shared
    link, so every first token is at the same time to 1e-9 even in overload; the decode
    side within the agreement above."""
    g, w, p = twelve_decode_plan
    assert len(p.decode.instances) > ROUTE_ALL_MAX
    for factor in (0.6, 2.0):
        reqs = make_requests(w, factor * p.predicted.rate, 1500, seed=1)
        slow = Simulator(build_model(p, g, w), SimOptions()).run(reqs)
        fast = FastSimulator(build_model(p, g, w), SimOptions()).run(reqs)
        want = slow.per_request["first_token_s"]
        assert fast.per_request["first_token_s"] == pytest.approx(want, rel=1e-9)
        assert abs(fast.attainment - slow.attainment) <= 0.01
        assert fast.tpot_s["mean"] == pytest.approx(slow.tpot_s["mean"], rel=0.05)


def test_route_draws_are_distinct_candidates_per_request():
    draws = route_draws(7, 1, 5000, 12, 3)
    assert draws.shape == (5000, 3) and draws.min() >= 0 and draws.max() < 12
    assert all(len(set(row)) == 3 for row in draws.tolist())
    assert (draws == route_draws(7, 1, 5000, 12, 3)).all()  # the seed fixes them
    assert not (draws == route_draws(7, 0, 5000, 12, 3)).all()  # the sides differ
    # every instance about equally often: 5000 * 3 / 12 = 1250 each
    assert np.bincount(draws.ravel(), minlength=12) == pytest.approx([1250] * 12, rel=0.1)
    assert route_draws(7, 0, 10, ROUTE_ALL_MAX, 2).shape == (10, 0)  # all are compared


def test_kv_tables_are_each_pairs_transfer():
    """On 2tracks at 24 servers the tables' KV envelope gives every prefill/decode pair the
    time its own routes give (``KVModel.time``), at short and long prompts."""
    s = scenario("2tracks-chatbot", servers=24)
    g, w = s.cluster(), s.load()
    p = plan(g, s.model_spec(), w, s.sla(), PlannerOptions(), planner="heroserve")
    m = build_model(p, g, w)
    t = fast_tables(m, SimOptions(), 2048)
    assert t.kv_pairs == len(m.prefill) * len(m.decode) > 4
    for tokens in (16.0, 2048.0):
        got = np.max(t.dec["kv_k"] * tokens + t.dec["kv_l"], axis=2)
        for (i, j), x in np.ndenumerate(got):
            assert x == pytest.approx(m.kv(i, j).time(tokens), rel=1e-12)


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_each_pairs_transfer_is_the_cost_models(mode):
    """``PlanModel.kv`` (a pair's KV transfer as the simulator runs it: one flow per link
    pipelined, one per GPU in the paper's mode) loads the links of the pair's share routes
    with their bytes and takes, alone, the time the cost model's own ``kv_time`` gives those
    shares, on 2tracks at 24 servers."""
    from controller.costmodel.kvcache import kv_route, kv_shares, kv_time
    from controller.costmodel.netparams import NetParams

    s = scenario("2tracks-summarization", servers=24)
    g, w = s.cluster(), s.load()
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    p = plan(g, s.model_spec(), w, s.sla(), opts, planner="heroserve")
    m = build_model(p, g, w)
    ev, kvpt = m.evaluator, m.model.kv_bytes_per_token()
    assert ev.ring_fabric.pipelined == (mode == "pipelined") == m.pipelined
    for i in range(len(m.prefill)):
        for j in range(len(m.decode)):
            pst = [x.gpus for x in m.prefill[i].stages]
            dst = [x.gpus for x in m.decode[j].stages]
            specs = kv_shares(m.model, pst, dst)
            routes = [kv_route(ev.ring_fabric, a, b, f * kvpt * ev.kv_tokens) for a, b, f in specs]
            carried: dict[int, float] = {}  # bytes per token on each link the routes take
            for (_, _, f), r in zip(specs, routes, strict=True):
                for e in m.links.path_links(r):
                    carried[e] = carried.get(e, 0.0) + f * kvpt
            kv = m.kv(i, j)
            assert kv.links == tuple(sorted(carried))
            assert kv.bytes_per_token == pytest.approx(carried, rel=1e-12)
            pairs = list(zip(specs, routes, strict=True))
            for tokens in (16.0, 2048.0):
                shares = [(a, r, f * kvpt * tokens) for (a, _, f), r in pairs]
                want = kv_time(ev.ring_fabric, shares)[0]
                assert m.kv(i, j).time(tokens) == pytest.approx(want, rel=1e-12)


def test_arrays_are_the_requests(many_plan):
    """``request_arrays`` draws what ``make_requests`` draws."""
    _, w, _ = many_plan
    reqs = make_requests(w, 3.0, 50, seed=4)
    t, i, o = request_arrays(w, 3.0, 50, seed=4)
    assert t.tolist() == [r.arrival_s for r in reqs]
    assert i.tolist() == [r.input_tokens for r in reqs]
    assert o.tolist() == [r.output_tokens for r in reqs]


def test_refusals(many_plan, capsys):
    g, w, p = many_plan
    m = build_model(p, g, w)
    with pytest.raises(InputError, match="online scheduler"):
        FastSimulator(m, SimOptions(online_scheduler=True))
    with pytest.raises(InputError, match="prefill admission"):
        FastSimulator(m, SimOptions(prefill_admission="stage"))
    with pytest.raises(InputError, match="no requests"):
        FastSimulator(m).run([])


def test_cli_fast_refuses_exact(many_plan, tmp_path, capsys):
    g, w, p = many_plan
    path = tmp_path / "plan.json"
    p.save(path)
    code = main(["simulate", "--plan", str(path), "--rate", "1", "--fast", "--exact"])
    assert code == 2
    assert "--fast runs neither" in capsys.readouterr().err
    code = main(["simulate", "--plan", str(path), "--rate", "1", "--requests", "50", "--fast"])
    assert code == 0
    assert "SLA attainment" in capsys.readouterr().out
