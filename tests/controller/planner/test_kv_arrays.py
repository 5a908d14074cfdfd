"""The KV pricing's numpy arrays give the floats of the loops they replace, bit for bit: each
pair's share times against ``costmodel.kvcache.kv_time`` (the per-flow ``flow_times``), and
a deployment's link loads, busiest links and senders against the per-share loop over pairs,
flows and hops, on a small 2tracks cluster whose pairs share links (so the loads sum
several flows) and in both cost modes."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from controller.costmodel.kvcache import kv_time
from controller.costmodel.netparams import NetParams
from controller.models import model_spec
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import PlannerOptions, Problem
from controller.planner.results import InstanceEval, PhaseResult
from controller.topology.generators import two_tracks
from controller.topology.graph import servers
from controller.workload import chatbot, default_sla


def inst(stages: list[list[str]], rate: float) -> InstanceEval:
    return InstanceEval([list(s) for s in stages], [0.0], [], 0.0, 0.0, 0.0, 0.0, rate, 1)


def deployment(mode: str) -> tuple[Evaluator, PhaseResult, PhaseResult]:
    """Three prefill instances (TP 2 x PP 4, over two servers each) and two decode instances
    (TP 4 x PP 2) on 12 servers of 2tracks, at unequal rates."""
    g: nx.Graph = two_tracks(12)
    opts = PlannerOptions(net=NetParams(cost_mode=mode))
    problem = Problem(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"), opts)
    ev = Evaluator(problem, HEROSERVE)
    gpus = [x for s in servers(g).values() for x in s]
    pre = [
        inst([gpus[k * 8 + 2 * j : k * 8 + 2 * j + 2] for j in range(4)], 1.1 + 0.37 * k)
        for k in (0, 2, 4)  # inside servers 0, 2 and 4
    ]
    dec = [
        inst([gpus[80 + k * 8 : 84 + k * 8], gpus[84 + k * 8 : 88 + k * 8]], 3.0) for k in (0, 1)
    ]
    return (
        ev,
        PhaseResult("prefill", 2, 4, [], pre),
        PhaseResult("decode", 4, 2, [], dec),
    )


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_pair_times_are_kv_times(mode: str) -> None:
    ev, pre, dec = deployment(mode)
    for p, d in ev.kv_pairs(pre, dec, None, None):
        routed = ev.kv_routed([(p, d)])
        want_tf, want = kv_time(ev.ring_fabric, [(f.src, f.path, f.nbytes) for f in routed])
        t_f, flows = ev.kv_price([(p, d)])
        assert [f.time_s for f in flows] == want  # exact, not approx
        assert t_f == want_tf
        assert [f.path for f in flows] == [f.path for f in routed]


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_link_loads_are_the_per_share_loop(mode: str) -> None:
    ev, pre, dec = deployment(mode)
    load = ev.kv_load(pre, dec, None, None)
    table = ev.ring_fabric.link_table
    link_s: dict[tuple[str, str], float] = {}
    senders: list[int] = []
    ids: dict[tuple[int, str], int] = {}
    flows = []
    for k, (pair, wk) in enumerate(zip(load.pairs, load.weights, strict=True)):
        _, fl = ev.kv_price([pair])
        flows += fl
        senders += [ids.setdefault((k, f.src), len(ids)) for f in fl]
        for f in fl:
            for e in zip(f.path, f.path[1:], strict=False):
                link_s[e] = link_s.get(e, 0.0) + ev.kv_share * wk * f.nbytes * table[e][0]
    assert len(load.pairs) == 3
    assert load.link_s == link_s  # exact: same keys, same floats
    shared = sum(1 for f in flows for e in zip(f.path, f.path[1:], strict=False)) > len(link_s)
    assert shared  # some link carries several flows, so the sums' order matters
    busiest = [
        max((link_s[e] for e in zip(f.path, f.path[1:], strict=False)), default=0.0) for f in flows
    ]
    assert load.busiest_s.tolist() == busiest
    assert load.alone_s.tolist() == [f.time_s for f in flows]
    assert load.senders.tolist() == senders
    assert load.flows == flows
    assert np.isfinite(load.t_f(0.5 / load.service_s))
