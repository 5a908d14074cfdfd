"""The cost model against hand-worked numbers (DESIGN.md §5)."""

import math

import pytest

from controller.costmodel.compute import (
    decode_layer_time,
    default_coefficients,
    layer_weights,
    prefill_layer_time,
)
from controller.costmodel.kvcache import kv_shares
from controller.costmodel.network import T_AGG_S, NetParams, flow_times, ina_pattern, ring_pattern
from controller.costmodel.queueing import max_rate_within, pk_queue_delay
from controller.models import model_spec
from controller.topology import fig2
from controller.topology import testbed as make_testbed
from controller.topology.fabric import Fabric

MB = 1e6
ETH = 12.5e9  # 100 Gb/s in bytes/s


def test_fig2_ina_collection_homogeneous_vs_nvlink():
    """Paper Fig. 2: 1 MB collected over two Ethernet hops ~160 us; NVLink + one hop ~90 us."""
    g = fig2()
    fp16 = NetParams(ina_element_bytes=2)  # the paper counts the message's own bytes
    homo = ina_pattern(Fabric(g, relay=False), ["gn2", "gn3"], "S1", MB, fp16)
    het = ina_pattern(Fabric(g, relay=True), ["gn2", "gn3"], "S2", MB, fp16)
    t_homo = max(flow_times(Fabric(g, relay=False), [(p, MB) for p in homo.paths.values()]))
    t_het = max(flow_times(Fabric(g), [(p, MB) for p in het.paths.values()]))
    assert t_homo == pytest.approx(160e-6, rel=0.15)
    assert t_het == pytest.approx(90e-6, rel=0.15)
    # hand-worked: 2 x (1 MB / 12.5 GB/s + 2 us) and 2 x (1 MB / 600 GB/s + 0.5 us) + 80 + 2 us
    assert t_homo == pytest.approx(2 * (MB / ETH + 2e-6))
    assert t_het == pytest.approx(2 * (MB / 600e9 + 0.5e-6) + MB / ETH + 2e-6)
    assert het.paths["gn2"] == ["gn2", "A-nvsw", "gn1", "S2"]
    # Eq. 8: T_ina = T_col + T_agg + T_dis (+ one host round)
    assert het.time(Fabric(g), MB) == pytest.approx(2 * t_het + T_AGG_S + fp16.ina_host_s)


def test_flows_of_one_collective_share_a_link():
    g = fig2()
    f = Fabric(g)
    path = ["gn1", "S2"]
    alone = flow_times(f, [(path, MB)])[0]
    both = flow_times(f, [(path, MB), (["gn2", "A-nvsw", "gn1", "S2"], MB)])
    assert alone == pytest.approx(MB / ETH + 2e-6)
    assert both[0] == pytest.approx(2 * MB / ETH + 2e-6)  # the NIC carries both megabytes


def test_ring_inside_a_server_hand_worked():
    """4 A100s on one NVLink fabric: 2(P-1) = 6 steps of D/4 over two 600 GB/s hops."""
    g = make_testbed()
    f = Fabric(g)
    members = [f"srv0-gpu{i}" for i in range(4)]
    d = 4 * MB
    r = ring_pattern(f, members, d, NetParams())
    step = 2 * (MB / 600e9 + 0.5e-6) + NetParams().ring_step_nvlink_s
    assert r.time(f, d) == pytest.approx(6 * step)


def test_ring_across_servers_uses_one_channel_per_nic_pair():
    """2 + 2 GPUs on two servers: two channels, each carrying D/4/2 over Ethernet; both cross
    the same access switch because GPU i of both servers share a track."""
    g = make_testbed()
    f = Fabric(g)
    members = ["srv2-gpu0", "srv2-gpu1", "srv3-gpu0", "srv3-gpu1"]
    d = 8 * MB
    r = ring_pattern(f, members, d, NetParams())
    cross = 2 * (d / 4 / 2 / ETH + 2e-6)  # gpu -> switch -> gpu, each hop loaded with D/8
    assert r.time(f, d) == pytest.approx(6 * (cross + NetParams().ring_step_net_s))


def test_compute_equations_hand_worked():
    m = model_spec("OPT-66B")
    co = default_coefficients("A100-40GB")
    assert layer_weights(m) == 4 * 9216**2 + 2 * 9216 * 36864
    assert co.c1 == pytest.approx(2 / (312e12 * 0.6))
    t = prefill_layer_time(co, m, 4, 1000, 1000**2)
    want = co.c1 / 4 * layer_weights(m) * 1000 + co.c2 / (128 * 4) * 3 * 9216 * 1e6 + co.c3
    assert t == pytest.approx(want)
    # decode: memory-bound at batch 1, compute-bound at a large batch (roofline)
    small = decode_layer_time(co, m, 4, 1, 500)
    assert small == pytest.approx(co.c4 * layer_weights(m) / 4 + co.c5 / 4 * 3 * 9216 * 500 + co.c6)
    big = decode_layer_time(co, m, 4, 512, 0)
    assert big == pytest.approx(co.c1 * layer_weights(m) * 512 / 4 + co.c6)


def test_pollaczek_khinchine():
    assert pk_queue_delay(5.0, 0.1) == pytest.approx(5 * 0.01 / (2 * 0.5))
    assert pk_queue_delay(10.0, 0.1) == math.inf
    assert pk_queue_delay(20.0, 0.1) == math.inf  # unstable, never negative
    lam = max_rate_within(1.0, 0.2, 0.1)
    assert 0.2 + pk_queue_delay(lam, 0.1) == pytest.approx(1.0)
    assert max_rate_within(0.1, 0.2, 0.1) == 0.0


def test_kv_bytes_and_shard_overlap():
    m = model_spec("OPT-66B")
    assert m.kv_bytes_per_token() == 2 * 9216 * 2 * 64
    llama = model_spec("LLaMA-3-70B")
    assert llama.kv_bytes_per_token() == 2 * (8 * 8192 // 64) * 2 * 80  # KV heads, not A
    pre = [["p0", "p1"], ["p2", "p3"]]  # TP2 PP2
    dec = [["d0", "d1", "d2", "d3"]]  # TP4 PP1
    shares = kv_shares(m, pre, dec)
    assert sum(f for _, _, f in shares) == pytest.approx(1.0)
    # p0 holds layers 0-31 and heads 0-1/2: it overlaps d0 and d1, a quarter each of its half
    assert sorted((d, f) for s, d, f in shares if s == "p0") == [("d0", 0.125), ("d1", 0.125)]


def test_rail_routes_are_routes_between_filtered_by_nccl_rules():
    """rail_routes builds only the routes NCCL would use; the same list as filtering every
    route: enter through the destination's own NIC, leave through the source's own NIC or a
    peer's NIC on one of the destination's rails (PXN)."""
    import random

    from controller.costmodel.network import rail_routes
    from controller.topology.fabric import Fabric
    from controller.topology.generators import tracks

    g = tracks(12, 8, 2, 6, 2, name="t")
    fab = Fabric(g)
    gpus = sorted(n for n, d in g.nodes(data=True) if d.get("kind") == "gpu")

    def spec(src: str, dst: str) -> list:
        rails = {e[-1] for e in fab.exits(dst) if len(e) == 2}
        keep = []
        for r in fab.routes_between(src, dst):
            first = next(n for n in r if g.nodes[n]["kind"] == "switch")
            if g.nodes[r[-2]]["kind"] == "switch" and (r[1] == first or first in rails):
                keep.append(r)
        return keep or fab.routes_between(src, dst)

    rnd = random.Random(1)
    for _ in range(300):
        a, b = rnd.sample(gpus, 2)
        if fab.nvlink_path(a, b) is None:
            assert rail_routes(fab, a, b) == spec(a, b)
        else:
            assert rail_routes(fab, a, b) == [fab.nvlink_path(a, b)]
    assert rail_routes(fab, gpus[0], gpus[0]) == [[gpus[0]]]
