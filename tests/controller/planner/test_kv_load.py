"""The KV transfer priced from the links' load (``kvtransfer.KVLoad``) on a hand-drawn cluster:
two one-GPU prefill servers and one one-GPU decode server on one switch, every link's load
worked out by hand, T_f stretched by it, the rate bounded where a link saturates, and every
deployed pair priced (no cap on pairs)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from controller.models import model_spec
from controller.planner import plan
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import Problem
from controller.planner.results import InstanceEval, PhaseResult
from controller.topology import testbed as make_testbed
from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps
from controller.workload import Workload, chatbot, default_sla

B = gbps(100)  # bytes/s of the p0 and decode NICs
TOKENS = 100  # every prompt: the KV of one request is 100 tokens' worth


def cluster(n_decode: int = 1) -> nx.Graph:
    g = nx.Graph(name="kv-hand")
    add_switch(g, "sw", tier="access")
    for name, bw in [("p0", B), ("p1", B / 4)] + [(f"d{k}", B) for k in range(n_decode)]:
        (gpu,) = add_server(g, name, gpu_type="A100-80GB", n_gpus=1, role="any")
        add_link(g, gpu, "sw", link="ethernet", capacity=bw)
    return g


def inst(gpu: str, rate: float) -> InstanceEval:
    return inst_of([[gpu]], rate)


def phases(
    n_decode: int = 1, load: Workload | None = None
) -> tuple[Evaluator, PhaseResult, PhaseResult]:
    g = cluster(n_decode)
    load = load or Workload("fixed", np.full(10, TOKENS), np.full(10, 10))
    ev = Evaluator(Problem(g, model_spec("OPT-66B"), load, default_sla("chatbot")), HEROSERVE)
    # prefill p0 serves twice what p1 does, so it takes 2/3 of the requests
    pre = PhaseResult("prefill", 1, 1, [], [inst("p0-gpu0", 2.0), inst("p1-gpu0", 1.0)])
    dec = PhaseResult("decode", 1, 1, [], [inst(f"d{k}-gpu0", 5.0) for k in range(n_decode)])
    return ev, pre, dec


def test_link_loads_worked_by_hand():
    ev, pre, dec = phases()
    kv = TOKENS * ev.model.kv_bytes_per_token()  # bytes of one request's KV
    load = ev.kv_load(pre, dec, None, None)
    # two pairs (every prefill instance sends to the one decode instance), p0's with 2/3 of
    # the requests and p1's with 1/3
    assert [p for p, _ in load.pairs] == [[["p0-gpu0"]], [["p1-gpu0"]]]
    assert load.weights == pytest.approx([2 / 3, 1 / 3])
    # busy seconds per request of the deployment on each link: p0's NIC 2/3 kv / B, p1's
    # (a quarter as fast) 1/3 kv / (B / 4) = 4/3 kv / B, the decode NIC all of it, kv / B
    assert load.link_s[("p0-gpu0", "sw")] == pytest.approx(2 / 3 * kv / B)
    assert load.link_s[("p1-gpu0", "sw")] == pytest.approx(4 / 3 * kv / B)
    assert load.link_s[("sw", "d0-gpu0")] == pytest.approx(kv / B)
    assert len(load.link_s) == 3
    # p1's NIC binds: the links saturate at B / (4/3 kv) requests/s
    assert load.bottleneck() == ("p1-gpu0", "sw")
    assert load.service_s == pytest.approx(4 / 3 * kv / B)


def test_requests_that_end_at_prefill_transfer_no_kv():
    # half the requests: a 100-token prompt and 10 output tokens; the other half a 300-token
    # prompt whose first token is its last: they end at prefill and move no KV cache
    load = Workload("mixed", np.tile([TOKENS, 300], 5), np.tile([10, 1], 5))
    ev, pre, dec = phases(load=load)
    kv = TOKENS * ev.model.kv_bytes_per_token()  # a transfer carries a 100-token prompt
    out = ev.kv_load(pre, dec, None, None)
    # half of every load of the all-transfer case above, each transfer 100 tokens, not the
    # mean prompt (200)
    assert out.link_s[("p0-gpu0", "sw")] == pytest.approx(0.5 * 2 / 3 * kv / B)
    assert out.link_s[("p1-gpu0", "sw")] == pytest.approx(0.5 * 4 / 3 * kv / B)
    assert out.link_s[("sw", "d0-gpu0")] == pytest.approx(0.5 * kv / B)
    fab = ev.ring_fabric
    t0 = fab.path_time(["p0-gpu0", "sw", "d0-gpu0"], kv)
    t1 = fab.path_time(["p1-gpu0", "sw", "d0-gpu0"], kv)
    assert out.t_f(0.0) == pytest.approx(max(t0, t1))


def test_t_f_is_each_share_alone_stretched_by_its_busiest_link():
    ev, pre, dec = phases()
    kv = TOKENS * ev.model.kv_bytes_per_token()
    load = ev.kv_load(pre, dec, None, None)
    fab = ev.ring_fabric
    t0 = fab.path_time(["p0-gpu0", "sw", "d0-gpu0"], kv)  # each request's transfer alone
    t1 = fab.path_time(["p1-gpu0", "sw", "d0-gpu0"], kv)
    assert load.t_f(0.0) == pytest.approx(max(t0, t1))
    # at rate r: p0's share crosses the decode NIC at r kv / B, p1's its own NIC at
    # r 4/3 kv / B (M/G/1 processor sharing: alone / (1 - utilisation))
    r = 0.5 * B / kv
    want = max(t0 / (1 - r * kv / B), t1 / (1 - r * 4 / 3 * kv / B))
    assert want == pytest.approx(max(2 * t0, 3 * t1))
    assert load.t_f(r) == pytest.approx(want)
    assert [f.time_s for f in load.flows_at(r)] == pytest.approx([2 * t0, 3 * t1])
    assert load.t_f(B / kv * 0.8) == np.inf  # p1's NIC saturated (at 3/4 B / kv and above)


def test_every_deployed_pair_is_priced():
    # 2 prefill and 5 decode instances: 5 pairs, every decode instance receives
    ev, pre, dec = phases(n_decode=5)
    kv = TOKENS * ev.model.kv_bytes_per_token()
    load = ev.kv_load(pre, dec, None, None)
    assert [d[0][0] for _, d in load.pairs] == [f"d{k}-gpu0" for k in range(5)]
    # p0 has 3 pairs, p1 has 2: each splits its share of the requests evenly
    assert load.weights == pytest.approx([2 / 9, 1 / 6, 2 / 9, 1 / 6, 2 / 9])
    for k in range(5):
        assert load.link_s[("sw", f"d{k}-gpu0")] == pytest.approx(load.weights[k] * kv / B)
    assert load.link_s[("p1-gpu0", "sw")] == pytest.approx(4 / 3 * kv / B)
    assert len(load.flows) == 5


def test_pairs_follow_the_phase_order_not_the_rates():
    # 2 prefill and 5 decode instances of which the best 3 are deployed: d1, d3 and d4 (rates
    # 4, 6 and 5), paired in the phase's order (d1, d3, d4), whatever their rates' order. A
    # re-pricing that only re-orders their rates (the KV load's contention does) meets the
    # same pairs again; paired best first, all three pairs changed
    ev, pre, _ = phases(n_decode=5)

    def deployed(rates: list[float]) -> list[tuple[str, str]]:
        dec = PhaseResult("decode", 1, 1, [], [inst(f"d{k}-gpu0", r) for k, r in enumerate(rates)])
        return [(p[0][0], d[0][0]) for p, d in ev.kv_pairs(pre, dec, None, 3)]

    want = [("p0-gpu0", "d1-gpu0"), ("p1-gpu0", "d3-gpu0"), ("p0-gpu0", "d4-gpu0")]
    assert deployed([1.0, 4.0, 2.0, 6.0, 5.0]) == want
    assert deployed([1.0, 6.0, 2.0, 4.0, 5.0]) == want


def test_plan_names_its_busiest_kv_link():
    # the testbed's plan: its notes name the link its KV transfers load most at H, at the
    # utilisation H x that link's busy seconds per request
    g = make_testbed()
    load = chatbot()
    p = plan(g, model_spec("OPT-66B"), load, default_sla("chatbot"))
    (note,) = [n for n in p.notes if n.startswith("KV transfer: busiest link")]
    ev = Evaluator(Problem(g, model_spec("OPT-66B"), load, default_sla("chatbot")), HEROSERVE)
    pre = PhaseResult("prefill", p.prefill.tp, p.prefill.pp, [],
                      [inst_of(i.stages, i.rate) for i in p.prefill.instances])  # fmt: skip
    dec = PhaseResult("decode", p.decode.tp, p.decode.pp, [],
                      [inst_of(i.stages, i.rate) for i in p.decode.instances])  # fmt: skip
    kv = ev.kv_load(pre, dec, None, None)
    a, b = kv.bottleneck()
    assert f"{a} -> {b} at {p.predicted.rate * kv.link_s[(a, b)]:.1%}" in note
    # every deployed pair's shares are in the plan
    assert len(p.kv_transfer) == len(kv.flows)


def inst_of(stages: list[list[str]], rate: float) -> InstanceEval:
    return InstanceEval([list(s) for s in stages], [0.0], [], 0.0, 0.0, 0.0, 0.0, rate, 1)
