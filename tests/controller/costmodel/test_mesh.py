"""The cost model on the boards' NVLink wiring (docs/costmodel.md "Ring", docs/topology.md
"Server fabrics"): hand-worked ring, hierarchical-INA and KV prices on a 4-GPU mesh, and an
8-GPU NVSwitch server priced as before."""

import pytest

from controller.costmodel.hier import hier_pattern
from controller.costmodel.kvcache import kv_route
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import compile_phase, flow_times
from controller.costmodel.ring import ring_pattern, server_ring
from controller.topology import testbed as make_testbed
from controller.topology import tracks
from controller.units import MB

PAIR_A100 = 100e9  # 4 NVLink3 links x 25 GB/s, per direction
HUB_A100 = 300e9  # 12 links x 25 GB/s into the NVSwitch, per direction
STEP_NV = 1.9e-6  # NCCL's per-hop NVLink overhead (NetParams.ring_step_nvlink_s)


def test_mesh_ring_step_loads_every_directed_link_evenly():
    """4 GPUs, each sending 1/4 of the message a step: 12 directed links, 1/12 on each."""
    f = NetParams().fabric(make_testbed())
    block = [f"srv0-gpu{i}" for i in range(4)]
    flows = server_ring(f, block, 0.25)
    assert sorted(tuple(p) for p, _ in flows) == sorted(
        (u, v) for u in block for v in block if u != v
    )
    assert all(s == pytest.approx(1 / 12) for _, s in flows)


def test_two_gpu_ring_on_the_mesh_gets_one_pair_of_links():
    """P = 2 on a 4-GPU A100 board: 2 steps of D/2 over the pair's one 100 GB/s link each way.
    D = 4 MB: 2 x 2 MB / 100 GB/s = 40 us, + 2 x (0.5 us hop + 1.9 us) = 44.8 us; through an
    NVSwitch it would be 2 x 2 MB / 300 GB/s = 13.33 us of bandwidth."""
    f = NetParams().fabric(make_testbed())
    d = 4 * MB
    r = ring_pattern(f, ["srv0-gpu0", "srv0-gpu2"], d, NetParams())
    assert r.time(f, d) == pytest.approx(2 * (d / 2) / PAIR_A100 + 2 * (0.5e-6 + STEP_NV))
    assert r.time(f, d) == pytest.approx(44.8e-6, rel=1e-9)


def test_eight_gpu_nvswitch_ring_hand_worked():
    """8 A100s on an NVSwitch board, D = 8 MB, pipelined: 14 steps of D/8 = 1 MB over the
    GPU's 300 GB/s edge = 46.667 us, + 14 hops gpu -> NVSwitch -> gpu (2 x 0.5 us + one 4096 B
    packet at 300 GB/s + NCCL's 1.9 us) = 40.7911 us: 87.4578 us, as before the boards."""
    g = tracks(6, 8, 2, 6, 1)
    f = NetParams().fabric(g)
    d = 8 * MB
    members = [f"u0-srv0-gpu{i}" for i in range(8)]
    r = ring_pattern(f, members, d, NetParams())
    want = 14 * (d / 8) / HUB_A100 + 14 * (1e-6 + 4096 / HUB_A100 + STEP_NV)
    assert r.time(f, d) == pytest.approx(want, rel=1e-12)
    assert r.time(f, d) == pytest.approx(87.45782e-6, rel=1e-6)


def test_hier_reduce_scatter_on_the_mesh():
    """2 + 2 A100s (srv0, srv1): the NVLink reduce-scatter is one step of D/2 each way over
    the pair's direct link: D = 4 MB, 2 MB / 100 GB/s = 20 us + (0.5 us + 1.9 us) = 22.4 us."""
    g = make_testbed()
    f = NetParams().fabric(g)
    d = 4 * MB
    members = ["srv0-gpu0", "srv0-gpu1", "srv1-gpu0", "srv1-gpu1"]
    h = hier_pattern(f, members, d, NetParams())
    assert h is not None
    rs = compile_phase(f, h.phases[0])
    assert rs.time(d) == pytest.approx(20e-6 + 0.5e-6 + STEP_NV, rel=1e-12)
    assert {tuple(p) for p, _ in h.phases[0].flows} >= {("srv0-gpu0", "srv0-gpu1")}


def test_hier_reduce_scatter_of_four_spreads_over_the_mesh():
    """4 + 4 A100s: 3 steps of D/4 per GPU spread over its 3 links, D/12 on each: D = 4 MB,
    3 x 3.3333 us + 3 x (0.5 + 1.9) us = 17.2 us (one ring order would take 3 x 10 us of
    bandwidth: 37.2 us)."""
    g = make_testbed()
    f = NetParams().fabric(g)
    d = 4 * MB
    members = [f"srv{s}-gpu{i}" for s in (0, 1) for i in range(4)]
    h = hier_pattern(f, members, d, NetParams())
    assert h is not None and len(h.rails) == 4
    rs = compile_phase(f, h.phases[0])
    assert rs.time(d) == pytest.approx(3 * (d / 12) / PAIR_A100 + 3 * (0.5e-6 + STEP_NV))
    assert rs.time(d) == pytest.approx(17.2e-6, rel=1e-9)


def test_flat_ina_relay_crosses_the_pair_link():
    """srv0-gpu1 relays to s1 through srv0-gpu0's NIC over their direct 100 GB/s link (Fig.
    2), srv1-gpu0 goes up its own NIC. Pipelined: the Ethernet links carry D in the lane format
    each way, D w / 12.5 GB/s; the relay's round trip is the longest, 0.5 + 2 + 2 + 0.5 us of
    latency and one frame on every hop but the slowest (2 / 100 GB/s + 2 / 12.5 GB/s - 1 /
    12.5 GB/s); then T_agg and the host's synchronisation."""
    from controller.costmodel.ina import T_AGG_S, ina_on_routes

    g = make_testbed()
    params = NetParams()
    f = params.fabric(g)
    routes = {"srv0-gpu1": ["srv0-gpu1", "srv0-gpu0", "s1"], "srv1-gpu0": ["srv1-gpu0", "s1"]}
    d = MB
    t = ina_on_routes(routes, "s1", params).time(f, d)
    eth, frame, w = 12.5e9, params.ina_frame_bytes, params.ina_wire_ratio
    want = d * w / eth + 5e-6 + frame * (2 / PAIR_A100 + 1 / eth) + T_AGG_S + params.ina_host_s
    assert t == pytest.approx(want, rel=1e-12)


def test_kv_transfer_inside_a_mesh_server():
    """A KV share between two GPUs of one V100 board takes their direct link (50 GB/s each
    way): 10 MB alone = 200 us + 0.5 us; two shares into the same GPU from two peers run on
    two links and do not share."""
    g = make_testbed()
    f = NetParams().fabric(g)
    route = kv_route(f, "srv2-gpu0", "srv2-gpu3", 10 * MB)
    assert route == ["srv2-gpu0", "srv2-gpu3"]
    other = kv_route(f, "srv2-gpu1", "srv2-gpu3", 10 * MB)
    times = flow_times(f, [(route, 10 * MB), (other, 10 * MB)])
    assert times == pytest.approx([200.5e-6, 200.5e-6], rel=1e-12)
