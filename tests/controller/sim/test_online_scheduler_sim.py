"""The online scheduler (docs/design.md §8) inside the simulator.

Topology: decode servers d0..d3 (2 A100 each); GPU 0 of d0 and d2 on access switch a1, GPU 0
of d1 and d3 on a2 (GPU 1 of each server on the other access switch); a1, a2 and the prefill
server's switch a3 hang off one core switch c1 by one 100 Gb/s uplink each. The plan (what a
homogeneous, Ethernet-only INA planner picks for groups that span a1 and a2) aggregates both
decode groups {d0.0, d1.0} and {d2.0, d3.0} on c1, so the two INA groups share the a1-c1 and
a2-c1 uplinks, whose downlink halves also carry every KV transfer from the prefill server.
Bursty arrivals (gamma, CV 4) bunch the KV transfers onto those uplinks.

Off, every all-reduce stays on c1. On, each group's scheduler also has the ring (NCCL with
PXN relays over NVLink, which avoids the uplinks) and INA on a1 or a2: it spreads the groups'
traffic and moves it off links the utilisation windows show busy. Each option is priced by its
cost-model time (Eq. 16 with latency_s / bandwidth), so at the plan's batch the ring, ~3x
faster than INA on c1 here, is also where an idle group starts; the last tests check that
zero-load choice against ``CommOption.time``.
"""

import numpy as np
import pytest
from support.plans import shared_uplink_cluster, shared_uplink_plan

from controller.models import model_spec
from controller.planner import plan as make_plan
from controller.scheduler.online import OnlineScheduler
from controller.sim import SimOptions, Simulator, build_model, make_requests
from controller.sim.scheduler import GroupSchedulers, policy_table, reference_bytes
from controller.topology import testbed as make_testbed
from controller.workload import Request, chatbot, default_sla

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


# -- Eq. 16 with each option's cost-model time -------------------------------------------
def _fastest_at_reference(model) -> dict[str, int]:
    """Group id -> index of the option with the smallest CommOption.time at D_ref."""
    out = {}
    for inst in model.prefill + model.decode:
        ref = reference_bytes(model, inst.role)
        for st in inst.stages:
            if len(st.options) > 1:
                times = [o.time(ref) for o in st.options]
                out[st.group_id] = times.index(min(times))
    return out


def test_first_choice_on_an_idle_testbed_is_the_fastest_option(monkeypatch):
    # The testbed plan, a few requests far apart (no contention): the first decision of every
    # group must be the option the cost model prices fastest for that decision's all-reduces
    # (a lone request's batch of 1 at decode, where INA's latency can beat the ring that wins
    # at the plan's batch).
    g = make_testbed()
    p = make_plan(g, model_spec("OPT-66B"), chatbot(), default_sla("chatbot"))
    m = build_model(p, g, chatbot())
    assert _fastest_at_reference(m), "the testbed plan should have groups with a choice"
    first: dict[str, tuple[int, float]] = {}
    choose = GroupSchedulers.choose

    def record(self, stage, nbytes):
        k = choose(self, stage, nbytes)
        first.setdefault(stage.group_id, (k, nbytes / stage.allreduces))
        return k

    monkeypatch.setattr(GroupSchedulers, "choose", record)
    reqs = [Request(30.0 * i, 200, 8) for i in range(3)]
    res = Simulator(m, SimOptions(online_scheduler=True)).run(reqs)
    assert res.finished == 3
    stages = {st.group_id: st for i in m.prefill + m.decode for st in i.stages}
    assert set(first) == set(_fastest_at_reference(m))
    for gid, (k, nbytes) in first.items():
        times = [o.time(nbytes) for o in stages[gid].options]
        print(
            gid,
            [
                (o.use_key, f"{t * 1e6:.1f} us")
                for o, t in zip(stages[gid].options, times, strict=True)
            ],
        )
        assert k == times.index(min(times)), gid


def test_zero_load_choice_follows_the_cost_model_not_the_bottleneck():
    # Shared-uplink plan: all four options (INA on c1, ring, INA on a1, INA on a2) have the
    # same 12.5 GB/s bottleneck, so the bottleneck rule ties and keeps the plan's INA on c1
    # (policy 0); the cost model prices the ring at ~98 us against ~328 us for INA on c1.
    g, p = shared_uplink_cluster(), shared_uplink_plan()
    m = build_model(p, g, chatbot())
    window = 0.05
    sched = GroupSchedulers(m, window, 0.3)
    want = _fastest_at_reference(m)
    assert set(want) == {"decode/0/0", "decode/1/0"}
    for inst in m.decode:
        st = inst.stages[0]
        ref = reference_bytes(m, "decode")
        n_ar = 2.0 * st.layers
        assert [o.bottleneck for o in st.options] == [st.options[0].bottleneck] * 4
        k = sched.choose(st, n_ar * ref)
        assert k == want[st.group_id] == 1 and st.options[k].scheme == "ring"
        # delta at D_ref is the iteration's time alone over the window
        s = sched.by_stage[id(st)]
        assert s.last_cost == pytest.approx(n_ar * st.options[1].time(ref) / window, rel=1e-12)
        # without the time model (the bottleneck rule) the plan's option 0 would win
        old = policy_table(st, window, 0.3)
        for link in old["links"]:
            link["capacity"] = st.options[0].bottleneck
        assert OnlineScheduler(old).select(n_ar * ref) == 0


def test_policy_table_time_model_is_the_option_time_made_affine():
    g, p = shared_uplink_cluster(), shared_uplink_plan()
    m = build_model(p, g, chatbot())
    st = m.decode[0].stages[0]
    ref = reference_bytes(m, "decode")
    n_ar = 2.0 * st.layers
    t = policy_table(st, 0.05, 0.3, ref)
    for opt, pol in zip(st.options, t["policies"], strict=True):
        t0, t1 = opt.time(0.0), opt.time(ref)
        assert pol["latency_s"] == pytest.approx(n_ar * t0, rel=1e-15)
        assert pol["bandwidth"] == pytest.approx(ref / (t1 - t0), rel=1e-15)
        # n all-reduces of D_ref bytes: latency + n D_ref / bandwidth = n t(D_ref)
        assert pol["latency_s"] + n_ar * ref / pol["bandwidth"] == pytest.approx(
            n_ar * t1, rel=1e-12
        )
