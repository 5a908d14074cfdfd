"""The online scheduler (DESIGN.md §8) inside the simulator (issue 3, "must show" 3).

Topology: decode servers d0..d3 (2 A100 each); GPU 0 of d0 and d2 on access switch a1, GPU 0
of d1 and d3 on a2 (GPU 1 of each server on the other access switch); a1, a2 and the prefill
server's switch a3 hang off one core switch c1 by one 100 Gb/s uplink each. The plan (what a
homogeneous, Ethernet-only INA planner picks for groups that span a1 and a2) aggregates both
decode groups {d0.0, d1.0} and {d2.0, d3.0} on c1, so the two INA groups share the a1-c1 and
a2-c1 uplinks, whose downlink halves also carry every KV transfer from the prefill server.
Bursty arrivals (gamma, CV 4) bunch the KV transfers onto those uplinks.

Off, every all-reduce stays on c1. On, each group's scheduler also has the ring (NCCL with
PXN relays over NVLink, which avoids the uplinks) and INA on a1 or a2: it spreads the groups'
traffic and moves it off links the utilisation windows show busy.
"""

import networkx as nx
import numpy as np
import pytest

from controller.plan import Group, Instance, PhasePlan, Plan, Predicted, SlotRange
from controller.sim import SimOptions, Simulator, build_model, make_requests
from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps
from controller.workload import chatbot


def shared_uplink_cluster() -> nx.Graph:
    g = nx.Graph(name="shared-uplink")
    for s, tier in (("c1", "core"), ("a1", "access"), ("a2", "access"), ("a3", "access")):
        add_switch(g, s, tier=tier)
    for a in ("a1", "a2", "a3"):
        add_link(g, a, "c1", link="ethernet", capacity=gbps(100))
    for gid in add_server(g, "p0", gpu_type="A100-40GB", n_gpus=4, role="prefill"):
        add_link(g, gid, "a3", link="ethernet", capacity=gbps(100))
    for k in range(4):
        gids = add_server(g, f"d{k}", gpu_type="A100-40GB", n_gpus=2, role="decode")
        first, second = ("a1", "a2") if k % 2 == 0 else ("a2", "a1")
        add_link(g, gids[0], first, link="ethernet", capacity=gbps(100))
        add_link(g, gids[1], second, link="ethernet", capacity=gbps(100))
    return g


def shared_uplink_plan() -> Plan:
    pre_gpus = [f"p0-gpu{i}" for i in range(4)]
    pre = PhasePlan(
        "prefill", 1, 1, "A100-40GB", [Instance([[x]]) for x in pre_gpus],
        [Group(i, 0, [x], "ring", None, None, {}, 0.0, None, 0.0, "TP=1")
         for i, x in enumerate(pre_gpus)],
        0.0, 0.0, 1, 0.0,
    )  # fmt: skip
    groups, insts = [], []
    for k, (a, b) in enumerate((("d0-gpu0", "d1-gpu0"), ("d2-gpu0", "d3-gpu0"))):
        insts.append(Instance([[a, b]]))
        paths = {a: [a, "a1", "c1"], b: [b, "a2", "c1"]}
        groups.append(Group(k, 0, [a, b], "ina", "c1", SlotRange(8 * k, 8), paths, 0.0, 0.0,
                            0.0, "Ethernet-only INA on the common core switch"))  # fmt: skip
    dec = PhasePlan("decode", 2, 1, "A100-40GB", insts, groups, 0.0, 0.0, 48, 0.0)
    return Plan(
        "ds-switchml", "shared-uplink", "OPT-13B", "chatbot",
        {"ttft_s": 2.5, "tpot_s": 0.15, "attainment": 0.9}, pre, dec, [],
        Predicted(0.1, 0.05, 0.01, 10.0, 1.0, 8),
    )  # fmt: skip


UPLINKS = ("a1|c1", "a2|c1")


def _run(on: bool):
    g, p, w = shared_uplink_cluster(), shared_uplink_plan(), chatbot()
    m = build_model(p, g, w)
    reqs = make_requests(w, 4.0, 1500, seed=11, cv=4.0)
    return Simulator(m, SimOptions(online_scheduler=on, window_s=0.05)).run(reqs)


@pytest.fixture(scope="module")
def runs():
    return _run(False), _run(True)


def test_groups_have_the_ring_and_other_switches_as_candidates():
    g, p = shared_uplink_cluster(), shared_uplink_plan()
    m = build_model(p, g, chatbot())
    for inst in m.decode:
        opts = inst.stages[0].options
        assert (opts[0].scheme, opts[0].switch) == ("ina", "c1")  # the plan's choice first
        kinds = {(o.scheme, o.switch) for o in opts}
        assert ("ring", None) in kinds and ("ina", "a1") in kinds and ("ina", "a2") in kinds


def test_scheduler_evens_link_use_and_cuts_tail_tpot_under_bursts(runs):
    off, on = runs
    assert off.finished == on.finished == 1500
    assert set(off.policy_use) == {"ina:c1"}  # off: the plan's scheme, always
    assert len(on.policy_use) > 1  # on: the groups spread over their candidates

    def uplinks(r):
        return [r.link_util.get(x, 0.0) for x in UPLINKS]

    def ethernet_cv(r):
        xs = np.array([u for lid, u in r.link_util.items()
                       if not any(k in lid for k in ("nvsw",))])  # fmt: skip
        return float(xs.std() / xs.mean())

    print(
        f"\nscheduler off: uplink utilisation {uplinks(off)}, link CV {ethernet_cv(off):.3f}, "
        f"TPOT p90 {off.tpot_s['p90'] * 1e3:.2f} ms p99 {off.tpot_s['p99'] * 1e3:.2f} ms, "
        f"policies {off.policy_use}"
        f"\nscheduler on:  uplink utilisation {uplinks(on)}, link CV {ethernet_cv(on):.3f}, "
        f"TPOT p90 {on.tpot_s['p90'] * 1e3:.2f} ms p99 {on.tpot_s['p99'] * 1e3:.2f} ms, "
        f"policies {on.policy_use}"
    )
    assert max(uplinks(on)) < max(uplinks(off))  # the shared uplinks carry less
    assert ethernet_cv(on) < ethernet_cv(off)  # link utilisation is more even
    assert on.tpot_s["p99"] < off.tpot_s["p99"]  # tail TPOT is lower
    assert on.tpot_s["p90"] < off.tpot_s["p90"]
