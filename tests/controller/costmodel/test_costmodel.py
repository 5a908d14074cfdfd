"""The cost model against hand-worked numbers (docs/design.md §5)."""

import math

import pytest

from controller.costmodel.compute import (
    decode_layer_time,
    default_coefficients,
    layer_weights,
    prefill_layer_time,
)
from controller.costmodel.ina import T_AGG_S, ina_pattern
from controller.costmodel.kvcache import kv_shares
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import flow_times
from controller.costmodel.queueing import pk_queue_delay
from controller.costmodel.ring import ring_pattern
from controller.errors import InputError
from controller.models import model_spec
from controller.topology import fig2
from controller.topology import testbed as make_testbed

MB = 1e6
ETH = 12.5e9  # 100 Gb/s in bytes/s


NV = 300e9  # A100 NVLink per direction (600 GB/s is the total over both directions)
PAPER = NetParams(cost_mode="paper")
PIPE_BYTES = NetParams(ina_lanes="fp16", ina_overhead_bytes=0)


def test_fig2_pipelined_mode():
    """Fig. 2 with packet-by-packet forwarding (4096-byte RoCE packets): a route costs its
    slowest hop's D / B plus its latencies plus one packet per extra hop, so the relay's gain
    is the latency of one Ethernet hop, not a whole store-and-forward copy of the message."""
    g = fig2()
    homo_f, het_f = NetParams().fabric(g, relay=False), NetParams().fabric(g)
    # gn3 -> S2 -> S1: 1 MB / 12.5 GB/s + 2 x 2 us + 4096 B / 12.5 GB/s = 84.32768 us
    t_homo = max(flow_times(homo_f, [(["gn3", "S2", "S1"], MB), (["gn2", "S1"], MB)]))
    assert t_homo == pytest.approx(84.32768e-6, rel=1e-9)
    # gn2 -> A-nvsw -> gn1 -> S2: 80 us + (0.5 + 0.5 + 2) us + 4096 B x 2 / 300 GB/s
    t_het = flow_times(het_f, [(["gn2", "A-nvsw", "gn1", "S2"], MB)])[0]
    assert t_het == pytest.approx(80e-6 + 3e-6 + 4096 * 2 / NV, rel=1e-12)
    assert t_het == pytest.approx(83.0273067e-6, rel=1e-8)


def test_two_hop_pipelined_flow_hand_worked():
    """A flow over two equal Ethernet hops, alone and with a second flow on its first hop.
    Alone: D / B + 2 latencies + one 4096-byte packet on the extra hop (paper: 2 D / B)."""
    g = fig2()
    pipe, paper = NetParams().fabric(g), PAPER.fabric(g)
    path = ["gn3", "S2", "S1"]
    # 1 MB: 80 us + 4 us + 0.32768 us = 84.32768 us; paper 2 x 82 = 164 us
    assert pipe.path_time(path, MB) == pytest.approx(84.32768e-6, rel=1e-12)
    assert paper.path_time(path, MB) == pytest.approx(164e-6, rel=1e-12)
    # gn1 also sends 1 MB into S2 over its own link: no shared link, nothing changes
    both = flow_times(pipe, [(path, MB), (["gn1", "S2", "S1"], MB)])
    # ...but S2 -> S1 carries both megabytes: 2 MB / 12.5 GB/s = 160 us is the slowest hop
    assert both == pytest.approx([164.32768e-6, 164.32768e-6], rel=1e-12)
    # paper: (80 + 2) + (160 + 2) = 244 us
    assert flow_times(paper, [(path, MB), (["gn1", "S2", "S1"], MB)])[0] == pytest.approx(244e-6)


def test_flows_of_one_collective_share_a_link():
    g = fig2()
    relay = ["gn2", "A-nvsw", "gn1", "S2"]
    for params in (NetParams(), PAPER):
        f = params.fabric(g)
        alone = flow_times(f, [(["gn1", "S2"], MB)])[0]
        both = flow_times(f, [(["gn1", "S2"], MB), (relay, MB)])
        assert alone == pytest.approx(MB / ETH + 2e-6)
        assert both[0] == pytest.approx(2 * MB / ETH + 2e-6)  # the NIC carries both megabytes
    # the relayed flow: pipelined its slowest hop is the shared NIC (160 us) + 3 us latency +
    # 4096 B on each NVLink hop; paper: 2 x (3.333 + 0.5) + 162 us
    assert flow_times(NetParams().fabric(g), [(["gn1", "S2"], MB), (relay, MB)])[1] == (
        pytest.approx(160e-6 + 3e-6 + 4096 * 2 / NV, rel=1e-12)
    )
    assert flow_times(PAPER.fabric(g), [(["gn1", "S2"], MB), (relay, MB)])[1] == (
        pytest.approx(2 * (MB / NV + 0.5e-6) + 162e-6, rel=1e-12)
    )


def test_overlapped_ina_hand_worked():
    """Pipelined INA: members stream up and the switch streams the sum back on full-duplex
    links, so T_ina = the most loaded link (up or down) + the longest round trip's latency +
    T_agg + the host overhead, instead of T_col + T_agg + T_dis."""
    g = fig2()
    f = NetParams().fabric(g)
    # 16-bit lanes without headers (1 wire byte per byte), 128-byte packets: gn2 relays via
    # gn1's NIC, gn3 uses its own. Every link up and down carries 1 MB: slowest 80 us.
    # gn2's round trip: 6 hops, 2 x 3 us + 128 B x (4 / 300 GB/s + 1 / 12.5 GB/s) = 6.011947 us;
    # gn3's: 4 us + 128 B / 12.5 GB/s. T = 80 + 6.011947 + 1 (T_agg) + 4 (host) = 91.011947 us
    het = ina_pattern(f, ["gn2", "gn3"], "S2", MB, PIPE_BYTES)
    assert het.paths == {"gn2": ["gn2", "A-nvsw", "gn1", "S2"], "gn3": ["gn3", "S2"]}
    rtt = 6e-6 + 128 * (4 / NV + 1 / ETH)
    assert het.time(f, MB) == pytest.approx(MB / ETH + rtt + T_AGG_S + 4e-6, rel=1e-12)
    assert het.time(f, MB) == pytest.approx(91.011947e-6, rel=1e-7)
    # the same routes in paper mode (Eq. 8 as written): each round trip alone, no latency,
    # T_agg and no host term: 2 x (3.333 + 3.333 + 80) + 1 us
    assert ina_pattern(PAPER.fabric(g), ["gn2", "gn3"], "S2", MB, PAPER).time(
        PAPER.fabric(g), MB
    ) == pytest.approx(174.3333e-6, rel=1e-5)
    # the project's default lanes: int32 (4 bytes per FP16 element) in 210-byte frames of 128
    # payload bytes: 1 MB of FP16 is 2 x 210 / 128 = 3.28125 MB on the wire, 262.5 us; the
    # round trip's packet terms use 210 bytes: 6 us + 210 B x (4 / 300 + 1 / 12.5) GB/s^-1
    d = NetParams()
    assert d.ina_wire_ratio == pytest.approx(3.28125)
    t = ina_pattern(f, ["gn2", "gn3"], "S2", MB, d).time(f, MB)
    assert t == pytest.approx(3.28125 * MB / ETH + 6e-6 + 210 * (4 / NV + 1 / ETH) + 5e-6)
    assert t == pytest.approx(273.5196e-6, rel=1e-8)


def test_lane_formats():
    # bytes on the wire per byte of FP16 message, with the 82 bytes of headers and framing
    # of each 128-byte INA payload: int32 2 x 210/128; bfp16 (exponent in the header) 210/128
    assert NetParams(ina_lanes="int32").ina_wire_ratio == pytest.approx(2 * 210 / 128)
    assert NetParams(ina_lanes="bfp16").ina_wire_ratio == pytest.approx(210 / 128)
    assert NetParams(ina_lanes="fp16").ina_wire_ratio == pytest.approx(210 / 128)
    assert NetParams().plan_options() == {"cost_mode": "pipelined", "ina_lanes": "int32"}
    assert NetParams.from_plan_options({}) == NetParams()
    assert NetParams.from_plan_options({"cost_mode": "paper"}).cost_mode == "paper"
    for bad, needle in (
        ({"ina_lanes": "int8"}, "INA lanes must be one of int32, bfp16, fp16"),
        ({"cost_mode": "fast"}, "cost mode must be one of pipelined, paper"),
        ({"cost_mode": 3}, "plan option cost_mode must be a string"),
    ):
        with pytest.raises(InputError, match=needle):
            NetParams.from_plan_options(bad)


def test_ring_inside_a_server_hand_worked():
    """4 A100s on the HGX A100 4-GPU mesh (each pair 100 GB/s per direction): 2(P-1) = 6
    steps of D/4 per GPU, spread by NCCL's rings over the GPU's 3 links: D/12 on each."""
    g = make_testbed()
    members = [f"srv0-gpu{i}" for i in range(4)]
    d = 4 * MB
    # paper (Eq. 11 as written): each step D/4 = 1 MB on the one link to the successor at
    # 100 GB/s = 10 us, no latency: 6 x 10 = 60 us (test_paper_mode.py has the V100 ring)
    f = PAPER.fabric(g)
    assert ring_pattern(f, members, d, PAPER).time(f, d) == pytest.approx(60e-6, rel=1e-12)
    # pipelined (NCCL's model): 6 x D/12 / 100 GB/s = 20 us of bandwidth, plus the chain of
    # 6 one-link hops, each 0.5 us + NCCL's 1.9 us (one hop: no packet serialised before the
    # slowest): 20 + 14.4 = 34.4 us
    f = NetParams().fabric(g)
    r = ring_pattern(f, members, d, NetParams())
    assert r.time(f, d) == pytest.approx(20e-6 + 6 * (0.5e-6 + 1.9e-6), rel=1e-12)
    assert r.time(f, d) == pytest.approx(34.4e-6, rel=1e-9)


def test_ring_across_servers_uses_one_channel_per_nic_pair():
    """2 + 2 V100s on two servers: two channels, each carrying D/4/2 over Ethernet; both cross
    the same access switch because GPU i of both servers share a track."""
    g = make_testbed()
    members = ["srv2-gpu0", "srv2-gpu1", "srv3-gpu0", "srv3-gpu1"]
    d = 8 * MB
    f = PAPER.fabric(g)
    r = ring_pattern(f, members, d, PAPER)
    # Eq. 11 as written: no channels, D/4 = 2 MB per step at the ring's slowest link (a 12.5
    # GB/s port), no latency: 6 x 160 = 960 us
    assert r.time(f, d) == pytest.approx(6 * d / 4 / ETH, rel=1e-12)
    assert r.time(f, d) == pytest.approx(960e-6, rel=1e-9)
    # pipelined: 6 x 1 MB / 12.5 GB/s = 480 us (the NVLink hop's D/4 = 2 MB at the V100
    # pair's 50 GB/s is 40 us); chain of 2(N-1) = 2 network hops (4 us + 4096 B / 12.5 GB/s +
    # NCCL's 4 us) and 2(P-N) = 4 NVLink hops over the pair's direct link (0.5 us + NCCL's
    # 1.9 us): 480 + 2 x 8.32768 + 4 x 2.4 = 506.25536 us
    f = NetParams().fabric(g)
    r = ring_pattern(f, members, d, NetParams())
    want = 480e-6 + 2 * (4e-6 + 4096 / ETH + 4e-6) + 4 * (0.5e-6 + 1.9e-6)
    assert r.time(f, d) == pytest.approx(want, rel=1e-12)
    assert r.time(f, d) == pytest.approx(506.25536e-6, rel=1e-8)


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_latency_matrix_is_the_best_route(mode):
    """pair_times (min-plus over exits and switch paths, by levels when pipelined) equals the
    cheapest of every candidate route, priced alone, at sizes below and above a packet."""
    from controller.costmodel.pairs import pair_times
    from controller.topology.generators import tracks

    g = tracks(12, 4, 2, 6, 2, name="t")
    f = NetParams(cost_mode=mode).fabric(g)
    gpus = sorted(n for n, d in g.nodes(data=True) if d.get("kind") == "gpu")[::3]
    for nbytes in (0.0, 1000.0, 1e6):
        d = pair_times(f, gpus, nbytes)
        for i, a in enumerate(gpus):
            for j, b in enumerate(gpus):
                want = (
                    0.0 if a == b else min(f.path_time(p, nbytes) for p in f.routes_between(a, b))
                )
                assert d[i, j] == pytest.approx(want, rel=1e-12, abs=1e-18), (a, b, nbytes)


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

    from controller.costmodel.ring import rail_routes
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


# -- hierarchical INA ----------------------------------------------------------------------
FIG2_ALL = ["gn1", "gn2", "gn3", "gn4"]


def test_hier_ina_two_servers_of_two_gpus_hand_worked():
    """Fig. 2's cluster, all four GPUs (servers A = gn1, gn2 and B = gn3, gn4; gn1, gn3 on S2,
    gn2, gn4 on S1), 1 MB, 16-bit lanes without headers (1 wire byte per byte), pipelined:
    (a) reduce-scatter in each server: m - 1 = 1 ring step, each GPU sends D/2 to its peer
        over gpu -> nvsw -> gpu: 0.5 MB / 300 GB/s = 1.6667 us, plus one NVLink hop of
        chain latency: 1 us + 4096 B / 300 GB/s + NCCL's 1.9 us = 2.913653 us; 4.580320 us;
    (b) rail 0 = {gn1, gn3} aggregates shard 0 at S2, rail 1 = {gn2, gn4} shard 1 at S1, each
        over its own NICs: every link up and down carries 0.5 MB: 40 us, plus a round trip
        of 2 x 2 us + 128 B / 12.5 GB/s = 4.01024 us, plus T_agg 1 us and host 4 us:
        49.01024 us;
    (c) all-gather: the reduce-scatter's ring again, 4.580320 us.
    Total 58.17088 us."""
    from controller.costmodel.hier import hier_pattern

    g = fig2()
    f = PIPE_BYTES.fabric(g)
    h = hier_pattern(f, FIG2_ALL, MB, PIPE_BYTES)
    assert h is not None and h.scheme == "hier" and h.switch is None
    rails = [(r.switch, r.shard, r.shards, r.members, r.paths) for r in h.rails]
    assert rails == [
        ("S2", 0, 2, ["gn1", "gn3"], {"gn1": ["gn1", "S2"], "gn3": ["gn3", "S2"]}),
        ("S1", 1, 2, ["gn2", "gn4"], {"gn2": ["gn2", "S1"], "gn4": ["gn4", "S1"]}),
    ]
    assert h.paths == {"gn1": ["gn1", "S2"], "gn3": ["gn3", "S2"], "gn2": ["gn2", "S1"],
                       "gn4": ["gn4", "S1"]}  # fmt: skip
    rs, ina, ag = (c.time(MB) for c in h.compiled(f))
    assert rs == pytest.approx(MB / 2 / NV + 1e-6 + 4096 / NV + 1.9e-6, rel=1e-12)
    assert rs == pytest.approx(4.580320e-6, rel=1e-6)
    assert ina == pytest.approx(MB / 2 / ETH + 4e-6 + 128 / ETH + 5e-6, rel=1e-12)
    assert ina == pytest.approx(49.01024e-6, rel=1e-9)
    assert ag == rs
    assert h.time(f, MB) == pytest.approx(58.17088e-6, rel=1e-6)
    # the paper's mode (its equations as written, no latency): (a) one ring step, D/2 at
    # the NVLink bottleneck once (Eq. 11): 1.6667 us; (b) each member's round trip alone
    # (Eqs. 8-10) 2 x 40 us + T_agg 1 us = 81 us; (c) 1.6667 us: 84.3333 us
    fp = PAPER.fabric(g)
    hp = hier_pattern(fp, FIG2_ALL, MB, PAPER)
    assert [c.time(MB) for c in hp.compiled(fp)] == pytest.approx(
        [MB / 2 / NV, 2 * MB / 2 / ETH + 1e-6, MB / 2 / NV], rel=1e-12
    )
    assert hp.time(fp, MB) == pytest.approx(84.3333e-6, rel=1e-5)


def test_hier_rails_share_links_when_they_share_a_switch():
    """S1 cannot aggregate: both rails go to S2, at once. Rail 0 takes gn1's and gn3's own
    links; for rail 1, gn2 and gn4 can relay through gn1's / gn3's NIC or cross S1 -> S2, and
    every choice puts two half-megabyte shards on one link: 1 MB / 12.5 GB/s = 80 us. The
    phase lasts as long as its slowest rail: 80 us + rail 1's longest round trip (gn2 over
    S1: 4 hops, 8 us + 3 x 128 B / 12.5 GB/s) + 5 us = 93.03072 us."""
    from controller.costmodel.hier import hier_pattern

    g = fig2()
    g.nodes["S1"]["ina"] = False
    f = PIPE_BYTES.fabric(g)
    h = hier_pattern(f, FIG2_ALL, MB, PIPE_BYTES)
    assert [r.switch for r in h.rails] == ["S2", "S2"]
    assert h.rails[1].paths["gn2"] == ["gn2", "S1", "S2"]
    ina = h.compiled(f)[1]
    assert max(ina.slopes) * MB == pytest.approx(MB / ETH, rel=1e-12)  # two shards on a link
    assert max(dict(ina.loads).values()) == pytest.approx(1.0)  # both rails' shares
    assert ina.time(MB) == pytest.approx(MB / ETH + 8e-6 + 3 * 128 / ETH + 5e-6, rel=1e-12)
    assert ina.time(MB) == pytest.approx(93.03072e-6, rel=1e-9)


def test_hier_ina_on_the_testbed_rails_follow_the_tracks():
    """2 servers x 2 A100s of the testbed: GPU 0 of both on s1, GPU 1 on s2; each rail
    aggregates at its own track's switch over its own NICs."""
    from controller.costmodel.hier import hier_pattern

    g = make_testbed()
    f = NetParams().fabric(g)
    members = ["srv0-gpu0", "srv0-gpu1", "srv1-gpu0", "srv1-gpu1"]
    h = hier_pattern(f, members, MB, NetParams())
    assert [(r.switch, r.members) for r in h.rails] == [
        ("s1", ["srv0-gpu0", "srv1-gpu0"]),
        ("s2", ["srv0-gpu1", "srv1-gpu1"]),
    ]
    # int32 lanes: a shard is 0.5 MB x 3.28125 on each NIC link, up and down
    ina = h.compiled(f)[1]
    assert max(ina.slopes) * MB == pytest.approx(0.5 * 3.28125 * MB / ETH, rel=1e-12)


@pytest.mark.parametrize(
    "members,why",
    [
        (["srv0-gpu0", "srv0-gpu1"], "one server"),
        (["srv0-gpu0", "srv1-gpu0"], "one member per server: flat INA"),
        (["srv0-gpu0", "srv0-gpu1", "srv1-gpu0"], "2 and 1 members"),
    ],
)
def test_hier_ina_none_where_it_does_not_apply(members, why):
    from controller.costmodel.hier import hier_pattern

    f = NetParams().fabric(make_testbed())
    assert hier_pattern(f, members, MB, NetParams()) is None, why


def test_hier_ina_none_without_a_common_ina_switch():
    from controller.costmodel.hier import hier_pattern

    g = fig2()
    for s in ("S1", "S2"):
        g.nodes[s]["ina"] = False
    assert hier_pattern(NetParams().fabric(g), FIG2_ALL, MB, NetParams()) is None
    # S2 cannot aggregate and no relay: rail 0 (gn1, gn3) reaches only S2 first, which both
    # share, so nothing above it is a candidate; rail 1 (gn2, gn4, on S1) could use S1
    g = fig2()
    g.nodes["S2"]["ina"] = False
    assert hier_pattern(NetParams().fabric(g, relay=False), FIG2_ALL, MB, NetParams()) is None
    # with relay every GPU reaches both switches first: both rails aggregate at S1
    h = hier_pattern(NetParams().fabric(g), FIG2_ALL, MB, NetParams())
    assert [r.switch for r in h.rails] == ["S1", "S1"]


def test_hier_on_the_plans_rails_prices_like_hier_pattern():
    from controller.costmodel.hier import hier_on_rails, hier_pattern

    g = fig2()
    f = NetParams().fabric(g)
    h = hier_pattern(f, FIG2_ALL, MB, NetParams())
    rails = [(r.switch, r.shard, r.members, r.paths) for r in h.rails]
    again = hier_on_rails(f, FIG2_ALL, rails, NetParams())
    for nbytes in (1e3, MB, 3e7):
        assert again.time(f, nbytes) == pytest.approx(h.time(f, nbytes), rel=1e-12)
    # rails that do not fit the group
    assert hier_on_rails(f, FIG2_ALL, rails[:1], NetParams()) is None
    swapped = [(s, k, ["gn1", "gn2"], p) for s, k, _, p in rails]
    assert hier_on_rails(f, FIG2_ALL, swapped, NetParams()) is None
    assert hier_on_rails(f, FIG2_ALL, [(*rails[0][:3], {}), rails[1]], NetParams()) is None


@pytest.mark.parametrize("mode", ["pipelined", "paper"])
def test_incremental_route_loads_equal_a_full_repricing(mode):
    """choose_routes' incremental loads (add, move, trial) give every flow the time
    flow_times gives the same routes from scratch, after any sequence of moves."""
    import random

    from controller.costmodel.network import _Loads
    from controller.topology.generators import tracks

    g = tracks(12, 4, 2, 6, 2, name="t")
    f = NetParams(cost_mode=mode).fabric(g)
    gpus = sorted(n for n, d in g.nodes(data=True) if d.get("kind") == "gpu")
    rnd = random.Random(7)
    options, sizes = [], []
    for _ in range(12):
        a, b = rnd.sample(gpus, 2)
        options.append(f.routes_between(a, b))
        sizes.append(rnd.choice([1e4, 1e6, 3e6]))
    state = _Loads(f)
    chosen = [rnd.choice(o) for o in options]
    for p, nb in zip(chosen, sizes, strict=True):
        state.add(p, nb)
    for _ in range(200):
        k = rnd.randrange(len(options))
        new = rnd.choice(options[k])
        extra = rnd.choice(options[rnd.randrange(len(options))])
        want_trial = max(flow_times(f, [*zip(chosen, sizes, strict=True), (extra, 2e6)]))
        assert state.trial(extra, 2e6) == pytest.approx(want_trial, rel=1e-9)
        state.move(k, new)
        chosen[k] = new
        want = flow_times(f, list(zip(chosen, sizes, strict=True)))
        assert state.times == pytest.approx(want, rel=1e-9)


def test_kv_transfer_hand_worked_both_modes():
    """gn1 sends two 1 MB KV shares, to gn3 over [gn1, S2, gn3] (A) and to gn4 over
    [gn1, S2, S1, gn4] (B); gn2 sends 1 MB to gn4 over [gn2, S1, gn4] (C), all at once.
    Pipelined, gn1's shares stream together: its NIC link and S1 -> gn4 carry 2 MB (160 us);
    A = 160 + 4 + 0.32768 (one 4096-byte packet on its second hop) = 164.32768 us,
    B = 160 + 6 + 2 x 0.32768 = 166.65536 us, C = 164.32768 us: T_f = 166.65536 us.
    Paper (Eq. 15): gn1's shares one after the other, each with its own bytes and gn2's:
    A = 2 x 82 = 164 us; B = 82 + 82 + (160 + 2, C shares S1 -> gn4) = 326 us; gn1 = 490 us;
    gn2: C = 82 + 162 = 244 us. T_f = 490 us (counting gn1's other share on its own NIC as
    well would have made it 650 us)."""
    from controller.costmodel.kvcache import kv_time

    g = fig2()
    shares = [
        ("gn1", ["gn1", "S2", "gn3"], MB),
        ("gn1", ["gn1", "S2", "S1", "gn4"], MB),
        ("gn2", ["gn2", "S1", "gn4"], MB),
    ]
    pkt = 4096 / ETH
    t_f, times = kv_time(NetParams().fabric(g), shares)
    assert times == pytest.approx([164e-6 + pkt, 166e-6 + 2 * pkt, 164e-6 + pkt], rel=1e-12)
    assert t_f == pytest.approx(166.65536e-6, rel=1e-9)
    t_f, times = kv_time(PAPER.fabric(g), shares)
    assert times == pytest.approx([164e-6, 326e-6, 244e-6], rel=1e-12)
    assert t_f == pytest.approx(490e-6, rel=1e-12)
