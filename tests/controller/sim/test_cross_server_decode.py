"""A decode instance whose tensor group spans two servers, on a hand-drawn cluster, priced
by hand and checked against the planner's re-pricing of the plan and the simulator.

The cluster: two decode servers of two A100-40GB GPUs each (one NVLink link between the
two, 100 GB/s each way, 0.5 us), a prefill server of one GPU, every GPU's NIC on one
INA-capable switch at 100 Gb/s (12.5 GB/s, 2 us). The plan decodes OPT-13B with TP 4 over
the two servers on NCCL's ring, the scheme a planner picks at a large batch; at a batch of
one, flat INA on the switch would be faster, but the plan reserved no aggregator slots for
it, so the deployed group runs the ring at every size (docs/simulator.md "What was wrong
with a cross-server decode")."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from controller.costmodel.compute import decode_layer_time
from controller.costmodel.netparams import NetParams
from controller.costmodel.sharing import allreduce_stretch
from controller.models import model_spec
from controller.plan import SLA, Group, Instance, PhasePlan, Plan, Predicted
from controller.sim import Simulator, build_model
from controller.topology.graph import add_gpu, add_link, add_switch
from controller.workload import Request, Workload

DECODE = ["d0-gpu0", "d0-gpu1", "d1-gpu0", "d1-gpu1"]
PREFILL = "p0-gpu0"
IN, OUT = 100, 21


def cluster() -> nx.Graph:
    g = nx.Graph(name="two-by-two")
    add_switch(g, "s", tier="access")
    for server, n, role in (("d0", 2, "decode"), ("d1", 2, "decode"), ("p0", 1, "prefill")):
        for i in range(n):
            gid = f"{server}-gpu{i}"
            add_gpu(g, gid, gpu_type="A100-40GB", memory_gb=40, server=server, index=i, role=role)
            add_link(g, gid, "s", link="ethernet", capacity=12.5e9, latency_s=2e-6)
        if n == 2:
            add_link(g, f"{server}-gpu0", f"{server}-gpu1", link="nvlink", capacity=100e9,
                     latency_s=0.5e-6)  # fmt: skip
    return g


def ring_plan() -> Plan:
    net = NetParams()
    pre = PhasePlan(
        "prefill", 1, 1, "A100-40GB", [Instance([[PREFILL]])],
        [Group(0, 0, [PREFILL], "ring", None, None, {}, 0.0, None, 0.0, "TP=1")],
        0.0, 0.0, 1, 0.0,
    )  # fmt: skip
    dec = PhasePlan(
        "decode", 4, 1, "A100-40GB", [Instance([DECODE])],
        [Group(0, 0, DECODE, "ring", None, None, {}, 0.0, None, 0.0, "ring at the batch")],
        0.0, 0.0, 64, 0.0,
    )  # fmt: skip
    return Plan(
        "heroserve", "two-by-two", "OPT-13B", "fixed",
        SLA(2.5, 0.15, 0.9), pre, dec, [],
        Predicted(0.1, 0.05, 0.01, 1.0, 0.2, 5), options=net.plan_options(),
    )  # fmt: skip


def ring_by_hand(nbytes: float) -> float:
    """NCCL's ring over d0 = (gpu0, gpu1) and d1 = (gpu0, gpu1), pipelined (Eq. 11 as
    docs/costmodel.md "Ring" prices it): 2 (P - 1) = 6 steps of D/4 per GPU. Inside a server
    the D/4 crosses the NVLink link alone (2.5e-12 s/B); between servers two channels (one
    per NIC pair) carry D/8 each over NIC -> switch -> NIC (1e-11 s/B, the bottleneck). A
    chunk going round takes 2 (N - 1) = 2 network hops, each 2 + 2 us of links, one 4096-byte
    packet on the second link and NCCL's 4 us per network step, and 2 (P - N) = 4 NVLink
    hops, each 0.5 us plus 1.9 us per NVLink step."""
    bandwidth = 6 * nbytes / 8 / 12.5e9
    network_hops = 2 * (2e-6 + 2e-6 + 4096 / 12.5e9 + 4e-6)
    nvlink_hops = 4 * (0.5e-6 + 1.9e-6)
    return bandwidth + network_hops + nvlink_hops


def test_a_cross_server_decode_step_is_the_planned_ring_in_planner_and_simulator():
    g, p = cluster(), ring_plan()
    load = Workload("fixed", np.full(10, IN), np.full(10, OUT))
    m = build_model(p, g, load)
    ev, model = m.evaluator, model_spec("OPT-13B")
    d = 1 * 5120 * 2  # one token's activation, fp16: 10,240 bytes per all-reduce
    ring = ring_by_hand(d)
    assert ring == pytest.approx(26.86976e-6, rel=1e-12)
    # flat INA would beat it at this size: the planner's unpinned price of the group is lower
    assert ev.times(DECODE, d).time(d) < 0.6 * ring
    # 2 all-reduces per layer, 40 layers, one after the other and after the layer's compute
    # (Eq. 13 at TP 4, the request's mean context over its 20 steps: 100 + 1 + 19 / 2)
    ctx = IN + 1 + (OUT - 2) / 2
    assert load.mean_kv_tokens == pytest.approx(ctx)
    compute = 40 * decode_layer_time(ev.coeffs("A100-40GB"), model, 4, 1, ctx)
    want = compute + 80 * ring
    one = ev.decode_step([DECODE], 1)
    assert one.compute_s == pytest.approx(compute, rel=1e-12)
    assert one.comm_s == pytest.approx(80 * ring, rel=1e-9)
    assert one.step_s == one.busiest_s == pytest.approx(want, rel=1e-9)
    # the simulator: one request alone, (last token - KV arrival) / decode steps
    st = m.decode[0].stages[0]
    assert st.options[0].scheme == "ring" and st.allreduces == 80
    r = Simulator(m).run([Request(1000.0 * i, IN, OUT) for i in range(3)])
    assert r.finished == 3 and set(r.policy_use) == {"ring"}
    pr = r.per_request
    sim_step = (np.array(pr["finish_s"]) - np.array(pr["kv_done_s"])) / (OUT - 1)
    assert sim_step == pytest.approx(want, rel=1e-9)


def test_a_cross_server_decode_step_under_kv_load_is_stretched_by_hand():
    """The same group with KV transfers keeping each switch -> GPU link of its servers busy
    u = 0.4 of the time: every network flow of the ring crosses one such link (pipelined:
    its slowest hop sets its time, now the stretched one), so its bandwidth term grows by
    ``allreduce_stretch(0.4, w)``, w being the stage's share of its iteration on that link;
    the latencies and NVLink hops do not change."""
    g, p = cluster(), ring_plan()
    load = Workload("fixed", np.full(10, IN), np.full(10, OUT))
    ev, model = build_model(p, g, load).evaluator, model_spec("OPT-13B")
    batch = 16
    d = batch * 5120 * 2
    alone = ring_by_hand(d)
    bandwidth = 6 * d / 8 / 12.5e9  # seconds the ring keeps each NIC link busy
    ctx = IN + 1 + (OUT - 2) / 2
    layer = decode_layer_time(ev.coeffs("A100-40GB"), model, 4, batch, batch * ctx)
    w = 2 * bandwidth / (layer + 2 * alone)  # 2 all-reduces a layer, the stage's 40 layers
    s = allreduce_stretch(0.4, w)
    assert s > 1.3  # material: a third more time on the network
    util = {("s", x): 0.4 for x in DECODE}
    loaded = ev.decode_step([DECODE], batch, util)
    step = loaded.step_s
    stretched = alone + (s - 1) * bandwidth
    assert loaded.compute_s == pytest.approx(40 * layer, rel=1e-12)
    assert loaded.comm_s == pytest.approx(80 * stretched, rel=1e-9)
    assert step == pytest.approx(40 * (layer + 2 * stretched), rel=1e-9)
    # the uplinks carry the same bytes at the same bandwidth: loaded instead, the same step
    up = {(x, "s"): 0.4 for x in DECODE}
    assert ev.decode_step([DECODE], batch, up).step_s == pytest.approx(step, rel=1e-12)
    # KV on a link the ring does not cross (the prefill GPU's) leaves the step alone
    other = {("s", PREFILL): 0.4, (PREFILL, "s"): 0.4}
    unloaded = 40 * (layer + 2 * alone)
    assert ev.decode_step([DECODE], batch, other).step_s == pytest.approx(unloaded)
    # and no KV at all is the step of the unloaded group
    assert ev.decode_step([DECODE], batch, {}) == ev.decode_step([DECODE], batch)
