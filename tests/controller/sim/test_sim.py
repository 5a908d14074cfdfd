"""Simulator building blocks: the fluid network (hand-worked), the priced plan against the cost
model, and `heroserve simulate` as a user runs it (bad input: one line, exit 2)."""

import heapq
import itertools
import json

import networkx as nx
import pytest
from support.plans import HIER_DECODE, hier_plan

from controller.cli import main
from controller.costmodel.compute import decode_layer_time
from controller.costmodel.netparams import NetParams
from controller.models import model_spec
from controller.planner import PLANNERS, PlannerOptions, Problem, plan
from controller.planner.evaluate import Evaluator
from controller.sim import SimOptions, Simulator, build_model, make_requests, simulate
from controller.sim.flows import Work
from controller.sim.model import comm_option
from controller.sim.network import Activity, FluidNetwork, Links
from controller.topology import fig2
from controller.topology import testbed as make_testbed
from controller.topology.graph import add_link, add_switch
from controller.workload import chatbot, default_sla

GB = 1e9


def _one_link() -> Links:
    g = nx.Graph(name="pair")
    add_switch(g, "a", tier="access")
    add_switch(g, "b", tier="access")
    add_link(g, "a", "b", link="ethernet", capacity=1 * GB, latency_s=0.0)
    return Links(g)


def _run(starts):
    """Start (time, bytes) transfers on a 1 GB/s link; return their finish times."""
    lk = _one_link()
    e = lk.index[("a", "b")]
    events: list = []
    seq = itertools.count()
    net = FluidNetwork(lk, events, lambda: next(seq))
    done: dict[int, float] = {}
    for k, (t0, nbytes) in enumerate(starts):
        heapq.heappush(events, (t0, next(seq), "start", (k, nbytes)))
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "start":
            k, nbytes = payload
            work = Work.single([(((e, lk.inv_bw[e]),), 0.0)], pipelined=True)
            a = Activity(0.0, nbytes, work, 1.0, None,
                         lambda now, k=k: done.__setitem__(k, now), (e,))  # fmt: skip
            net.start(a, t)
        else:
            a = net.finish(payload[0], payload[1], t)
            if a is not None:
                a.on_done(t)
    return [done[k] for k in range(len(starts))]


def test_fluid_link_alone_and_shared_hand_worked():
    # 1 GB alone on 1 GB/s: 1 s
    assert _run([(0.0, 1e9)]) == pytest.approx([1.0])
    # two at once share the link equally: both end at 2 s
    assert _run([(0.0, 1e9), (0.0, 1e9)]) == pytest.approx([2.0, 2.0])
    # the second starts at 0.5 s: the first has 0.5 GB left at half rate -> 1.5 s;
    # the second moves 0.5 GB by 1.5 s, then 0.5 GB alone -> 2.0 s
    assert _run([(0.0, 1e9), (0.5, 1e9)]) == pytest.approx([1.5, 2.0])


def _chain(hops: int) -> tuple[Links, list[int]]:
    """``hops`` 1 GB/s links in a row, no latency: a-0-1-...-b."""
    g = nx.Graph(name="chain")
    names = [f"s{i}" for i in range(hops + 1)]
    for x in names:
        add_switch(g, x, tier="access")
    for u, v in zip(names, names[1:], strict=False):
        add_link(g, u, v, link="ethernet", capacity=1 * GB, latency_s=0.0)
    lk = Links(g)
    return lk, lk.path_links(names)


def _run_busy_share(
    hops: int, n: int, tolerance: float = 0.0, pipelined: bool = False
) -> list[float]:
    """n transfers of 1 GB start at 0 on the same ``hops``-hop path; each weighs by its
    busy share (weight None). Store and forward, alone one takes ``hops`` seconds;
    pipelined, 1 s (its slowest hop)."""
    lk, path = _chain(hops)
    events: list = []
    seq = itertools.count()
    net = FluidNetwork(lk, events, lambda: next(seq), tolerance)
    done: list[float] = []
    per_byte = {e: 1.0 for e in path}
    work = Work.single([(tuple((e, lk.inv_bw[e]) for e in path), 0.0)], pipelined)
    for _ in range(n):
        a = Activity(0.0, 1e9, work, None, (per_byte, 1e9), done.append, tuple(path),
                     ("kv", 0, 0))  # fmt: skip
        net.start(a, 0.0)
    net.run_until_idle()
    return done


def test_busy_share_weights_hand_worked():
    # alone: 3 hops of 1 s each (store-and-forward)
    assert _run_busy_share(3, 1) == pytest.approx([3.0])
    # each transfer keeps a hop busy 1 s of its 3: three of them fill the path exactly,
    # nobody slows (the old rule, weight 1 per hop, made them take 9 s)
    assert _run_busy_share(3, 3) == pytest.approx([3.0] * 3)
    # six ask for 2x the capacity: stretch 2 on every hop, 6 s each
    assert _run_busy_share(3, 6) == pytest.approx([6.0] * 6)
    # pipelined: alone the slowest hop, 1 s, busy all the time on every hop (weight 1)...
    assert _run_busy_share(3, 1, pipelined=True) == pytest.approx([1.0])
    # ...so three share every hop three ways: stretch 3, 3 s each
    assert _run_busy_share(3, 3, pipelined=True) == pytest.approx([3.0] * 3)


@pytest.mark.parametrize("pipelined,want", [(True, [2.0, 2.0]), (False, [2.3, 1.5])])
def test_most_stretched_hop_sets_a_pipelined_rate(pipelined, want):
    """Transfer A (1 GB over hops 1 and 2) and B (1 GB over hop 2 only) start together.
    Pipelined: each keeps its hops busy all the time (weight 1), hop 2 carries both
    (stretch 2), and A's rate is set by its most stretched hop: max(1 x 1, 1 x 2) = 2 s, B
    2 s. Store and forward: A alone takes 2 s and weighs 1/2 per hop, B 1 s and weight 1:
    stretch 1.5 on hop 2, A = 1 + 1.5 = 2.5 s, B = 1.5 s; when B ends A has 1 - 1.5/2.5 = 0.4
    of 2 s left: it ends at 2.3 s."""
    lk, path = _chain(2)
    e1, e2 = path
    events: list = []
    seq = itertools.count()
    net = FluidNetwork(lk, events, lambda: next(seq))
    done: dict[str, float] = {}
    for name, links in (("A", (e1, e2)), ("B", (e2,))):
        work = Work.single([(tuple((e, lk.inv_bw[e]) for e in links), 0.0)], pipelined)
        a = Activity(0.0, 1e9, work, None, ({e: 1.0 for e in links}, 1e9),
                     lambda t, name=name: done.__setitem__(name, t), links)  # fmt: skip
        net.start(a, 0.0)
    net.run_until_idle()
    assert [done["A"], done["B"]] == pytest.approx(want)


def test_rerate_tolerance_bounds_the_error_and_the_work():
    # 100 transfers on one hop, started together: exact and 2%-tolerant runs agree (all
    # finish at 100 s) because the stretch is the same whenever it is read
    exact = _run_busy_share(1, 100)
    assert exact == pytest.approx([100.0] * 100)
    assert _run_busy_share(1, 100, tolerance=0.02) == pytest.approx(exact, rel=0.02)
    # a link leaving a large stretch: the rate in force is never more than 2% off, and it
    # falls back to exactly 1 when the link empties
    lk, path = _chain(1)
    events: list = []
    seq = itertools.count()
    net = FluidNetwork(lk, events, lambda: next(seq), 0.02)
    e = path[0]
    idle = Work.single((), pipelined=True)
    acts = [Activity(0.0, 1.0, idle, 1.0, None, lambda t: None, (e,)) for _ in range(50)]
    for a in acts:
        net.start(a, 0.0)
        assert abs(lk.stretch[e] - max(1.0, lk.load[e])) <= 0.02 * lk.stretch[e] + 1e-12
    for a in acts:
        net.finish(a.id, a.version, 0.0)
        assert abs(lk.stretch[e] - max(1.0, lk.load[e])) <= 0.02 * lk.stretch[e] + 1e-12
    assert lk.stretch[e] == 1.0 and net.stretched == 0
    with pytest.raises(ValueError, match="tolerance"):
        FluidNetwork(lk, events, lambda: next(seq), 1.5)


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
@pytest.mark.parametrize("make,members", [
    (make_testbed, ["srv2-gpu0", "srv3-gpu0", "srv2-gpu1", "srv3-gpu1"]),
    (make_testbed, ["srv2-gpu0", "srv2-gpu1", "srv2-gpu2", "srv2-gpu3"]),
    (fig2, ["gn2", "gn3"]),
])  # fmt: skip
def test_comm_options_price_like_the_cost_model(make, members, mode):
    g = make()
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    problem = Problem(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    ev = Evaluator(problem, PLANNERS["heroserve"][0])
    lk = Links(g)
    for nbytes in (1e4, 1e6, 3e7):
        ge = ev.group(members, nbytes)
        pats = [(ge.ring, ev.ring_fabric)] + [(p, ev.ina_fabric) for p in ge.ina]
        for pattern, fab in pats:
            opt = comm_option(lk, fab, pattern)
            assert opt.time(nbytes) == pytest.approx(pattern.time(fab, nbytes), rel=1e-12)


@pytest.fixture(scope="module")
def tb_plan():
    g = make_testbed()
    return g, plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"))


def test_decode_compute_fast_path_is_eq13(tb_plan):
    g, p = tb_plan
    m = build_model(p, g, chatbot())
    inst = m.decode[0]
    for b, k in [(1, 300), (16, 5000), (63, 21000), (400, 1e5)]:
        co = m.evaluator.coeffs(inst.gpu_type)
        want = inst.stages[0].layers * decode_layer_time(co, m.model, inst.tp, b, k)
        assert m.decode_compute(inst, inst.stages[0], b, k) == pytest.approx(want, rel=1e-12)


def test_only_links_that_can_overflow_are_accounted(tb_plan):
    g, p = tb_plan
    m = build_model(p, g, chatbot())
    lk = m.links
    # the decode stages are 4-GPU NVLink rings inside one server: one stage per link, whose
    # iteration can never fill it, so none of its links is risky
    for st in m.decode[0].stages:
        opt = st.options[0]
        assert opt.scheme == "ring"
        shares = opt.peak_shares(lk.inv_bw)
        assert shares and max(shares.values()) <= 1.0 + 1e-12
        assert not any(lk.risky[e] for e in opt.links)
    # KV routes are not accounted until a run uses them (any number may share a link)
    kv_links = m.kv(0, 0).links
    assert kv_links and not all(lk.risky[e] for e in kv_links)
    Simulator(m).run(make_requests(chatbot(), 2.0, 50, seed=1))
    assert all(lk.risky[e] for e in kv_links)


def test_decode_memory_is_never_exceeded_under_overload(tb_plan):
    g, p = tb_plan
    r = simulate(p, g, chatbot(), rate=3 * p.predicted.rate, n=600, seed=3)
    assert r.finished == r.requests == 600
    assert r.preemptions > 0  # the cache did fill
    assert r.kv_overflow_events == 0 and r.peak_kv_fraction <= 1.0


def test_simulate_api_reports_every_request(tb_plan):
    g, p = tb_plan
    r = simulate(p, g, chatbot(), rate=2.0, n=200, seed=1)
    assert r.finished == r.requests == 200
    assert 0.0 <= r.attainment <= 1.0
    assert r.ttft_s["p50"] <= r.ttft_s["p90"] <= r.ttft_s["p99"]
    assert r.peak_kv_bytes_per_gpu > 0
    assert r.policy_use  # iterations ran on some all-reduce policy


# -- heroserve simulate ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, tb_plan):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    tb_plan[1].save(path)
    return path


def test_cli_simulate_prints_and_writes_json(plan_file, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["simulate", "--plan", str(plan_file), "--rate", "1.5", "--requests", "100",
               "--json", str(out)])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "SLA attainment" in text and "TPOT" in text and "INA throughput" in text
    d = json.loads(out.read_text())
    assert d["finished"] == 100 and "peak_kv_bytes_per_gpu" in d and "ttft_s" in d


def test_cli_simulate_per_gpu_rate_and_online_scheduler(plan_file, capsys):
    rc = main(["simulate", "--plan", str(plan_file), "--rate", "0.1", "--per-gpu",
               "--requests", "50", "--online-scheduler", "--cv", "4"])  # fmt: skip
    assert rc == 0
    assert "50/50 finished" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--rate", "0"], "--rate: must be positive"),
    (["--rate", "-2"], "--rate: must be positive"),
    (["--rate", "abc"], "is not a number"),
    (["--rate", "1", "--topology", "fig2"], "not in topology"),
    (["--rate", "1", "--requests", "0"], "must be positive"),
    (["--rate", "1", "--workload", "nope"], "unknown workload"),
])  # fmt: skip
def test_cli_simulate_bad_input_one_line_exit_2(plan_file, capsys, args, needle):
    assert main(["simulate", "--plan", str(plan_file), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_simulate_missing_or_bad_plan_file(tmp_path, capsys):
    assert main(["simulate", "--plan", str(tmp_path / "none.json"), "--rate", "1"]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["simulate", "--plan", str(bad), "--rate", "1"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    bad.write_text("{}")
    assert main(["simulate", "--plan", str(bad), "--rate", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a plan" in err and len(err.splitlines()) == 1
    assert main(["simulate", "--rate", "1"]) == 2  # --plan missing
    assert "--plan" in capsys.readouterr().err


def test_whole_pass_decode_steps_equal_stage_by_stage(tb_plan, monkeypatch):
    """A decode step run through every stage at once (a permutation flow shop) gives the same
    schedule as stage by stage: every request's times agree, at low load and in overload
    (preemptions included)."""
    g = tb_plan[0]
    w = chatbot()
    # decode in 2 pipeline stages, so that a whole pass differs from stage by stage
    p = plan(g, model_spec("OPT-66B"), w, default_sla("chatbot"), PlannerOptions(decode_par=(4, 2)))
    assert p.decode.pp == 2
    for factor in (0.5, 2.0):
        reqs = make_requests(w, factor * p.predicted.rate, 400, seed=2)
        whole = Simulator(build_model(p, g, w)).run(reqs)
        with monkeypatch.context() as mp:
            mp.setattr(Simulator, "_whole_pass", lambda self, ds: False)
            staged = Simulator(build_model(p, g, w)).run(reqs)
        assert whole.events < staged.events  # it did take the whole-pass path
        # the same schedule; sums associate differently, hence 1e-9 and not bit equality
        assert whole.per_request.keys() == staged.per_request.keys()
        for key, values in whole.per_request.items():
            assert values == pytest.approx(staged.per_request[key], rel=1e-9, nan_ok=True)
        assert whole.preemptions == staged.preemptions
        assert whole.policy_use == staged.policy_use  # every stage iteration counted
        assert whole.allreduce_throughput_Bps == pytest.approx(staged.allreduce_throughput_Bps)
        assert whole.link_util == pytest.approx(staged.link_util)


def test_hier_group_offers_hier_ring_and_flat_ina():
    """The plan's hierarchical INA first, then the ring and flat INA at each switch, each
    priced like the cost model; the online scheduler runs with the three kinds."""
    from controller.costmodel.hier import hier_on_rails

    g = make_testbed()
    p = hier_plan(g)
    m = build_model(p, g, chatbot())
    opts = m.decode[0].stages[0].options
    assert [o.use_key for o in opts] == ["hier", "ring", "ina:s1", "ina:s2"]
    ev = m.evaluator
    rails = [(r.switch, r.shard, r.members, r.paths) for r in p.decode.groups[0].rails]
    pattern = hier_on_rails(ev.ina_fabric, HIER_DECODE, rails, ev.net)
    for nbytes in (1e3, 1e6, 3e7):
        assert opts[0].time(nbytes) == pytest.approx(pattern.time(ev.ina_fabric, nbytes), rel=1e-12)
    # its links: the NVLink edges of both servers (reduce-scatter, all-gather) and the rails'
    # NIC links, each way
    assert {"srv2-gpu0|srv2-gpu1", "s1|srv2-gpu0", "s2|srv3-gpu1"} <= set(opts[0].link_ids)
    r = Simulator(m, SimOptions(online_scheduler=True)).run(
        make_requests(chatbot(), 4.0, 300, seed=1, cv=4.0)
    )
    assert r.finished == 300 and r.policy_use


def test_plan_with_rails_that_do_not_fit_is_refused():
    from controller.errors import InputError

    g = make_testbed()
    p = hier_plan(g)
    p.decode.groups[0].rails[1].members = ["srv2-gpu0", "srv3-gpu1"]  # srv2-gpu0 twice
    with pytest.raises(InputError, match="rails that do not fit"):
        build_model(p, g, chatbot())
    p = hier_plan(g)
    p.decode.groups[0].rails[0].paths["srv2-gpu0"] = ["srv2-gpu0", "s2"]  # no such link
    with pytest.raises(InputError, match="hop srv2-gpu0 - s2 of srv2-gpu0's path is not a link"):
        build_model(p, g, chatbot())


def test_iteration_weights_never_exceed_the_risky_bound(monkeypatch):
    """The risky-link marking bounds an iteration's weight on a link with its compute
    (C1 W / TP per token and layer) as well as its all-reduces; every iteration actually
    started, at any batch, weighs no more than that bound on each of its links."""
    from controller.sim.network import FluidNetwork

    # decode TP8 over both V100 servers: its rings cross the NICs the KV transfers arrive on
    g = make_testbed(fixed_roles=True)
    opts = PlannerOptions(prefill_par=(1, 4), decode_par=(8, 1))
    p = plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    m = build_model(p, g, chatbot())
    inv = m.links.inv_bw
    stages = {id(st): (inst, st) for inst in m.prefill + m.decode for st in inst.stages}
    seen = []
    start = FluidNetwork.start

    def checked(self, a, now):
        start(self, a, now)
        if isinstance(a.chan, tuple) and a.chan[0] == "it":
            inst, st = stages[a.chan[1]]
            floor = st.layers * inst.decode_terms[1] / (m.message_bytes(1.0) * st.allreduces)
            bound = st.options[a.chan[2]].peak_shares(inv, floor)
            for e, w in a.loads:
                assert w <= bound[e] * (1 + 1e-9), (st.group_id, e, w, bound[e])
                seen.append(w)

    monkeypatch.setattr(FluidNetwork, "start", checked)
    r = Simulator(m).run(make_requests(chatbot(), 3 * p.predicted.rate, 300, seed=4))
    assert r.finished == 300 and seen  # iterations did run as activities on risky links


def test_single_link_flows_price_only_the_stretched_ones_exactly():
    """A part of one-link flows (a pipelined KV transfer) is priced from its envelope alone and
    its stretched flows only; that is the maximum over every flow, whatever the stretch."""
    import random

    rnd = random.Random(3)
    for _ in range(200):
        flows = [(((e, rnd.uniform(1e-9, 1e-6)),), rnd.uniform(0, 1e-5)) for e in range(12)]
        work = Work.single(flows, pipelined=True)
        assert work.singles is not None
        stretch = [rnd.choice([1.0, 1.0, 1.0, rnd.uniform(1.0, 5.0)]) for _ in range(12)]
        scale = rnd.uniform(1, 1e4)
        want = max(k * stretch[e] * scale + lat for ((e, k),), lat in flows)
        assert work.time(0.5, scale, work.sums(stretch)) == pytest.approx(0.5 + want, rel=1e-12)


def test_aggregation_throughput_runs_each_group_on_its_fastest_option():
    """Fig. 9's figure: every group all-reduces M bytes at once on the option that is
    fastest alone at M. The testbed hier plan's two groups share no link (prefill on srv0's
    NVLink, decode on srv2/srv3 and the switches), so each finishes in its fastest option's
    uncontended time and the throughput is 2 M / the slower of the two."""
    from controller.evaluation.ina import aggregation_throughput

    g = make_testbed()
    m = build_model(hier_plan(g), g, chatbot())
    stages = [m.prefill[0].stages[0], m.decode[0].stages[0]]
    assert not set(stages[0].options[0].links) & {e for o in stages[1].options for e in o.links}
    for nbytes in (4e6, 64e6):
        best = [min(o.time(nbytes) for o in st.options) for st in stages]
        t = aggregation_throughput(m, nbytes)
        assert t["groups"] == 2
        assert t["throughput_Bps"] == pytest.approx(2 * nbytes / max(best), rel=1e-9)
        assert t["mean_allreduce_s"] == pytest.approx(sum(best) / 2, rel=1e-9)
        picks = [min(st.options, key=lambda o: o.time(nbytes)).scheme for st in stages]
        assert t["ina_share"] == sum(s != "ring" for s in picks) / 2
        # the figure's other lines: the ring everywhere, INA wherever the cost model prices it
        for scheme, keep in (("ring", lambda o: o.scheme == "ring"),
                             ("ina", lambda o: o.scheme != "ring")):  # fmt: skip
            own = [min((o for o in st.options if keep(o)), key=lambda o: o.time(nbytes))
                   for st in stages]  # fmt: skip
            t = aggregation_throughput(m, nbytes, scheme)
            assert t["ina_share"] == (scheme == "ina")  # both groups have both kinds
            want = max(o.time(nbytes) for o in own)
            assert t["throughput_Bps"] == pytest.approx(2 * nbytes / want, rel=1e-9)
