"""bfp16's round of exponent proposals priced as the host library and the C++ client run it
(controller/costmodel/ina.py ``proposal_phase``; docs/costmodel.md "INA lanes"): one round
trip of the data's routes with one packet, plus T_agg, before the data; none for int32 and
none in the paper's mode. Hand-worked on Fig. 2's cluster, flat and hierarchical."""

import pytest

from controller.costmodel.hier import hier_pattern
from controller.costmodel.ina import T_AGG_S, ina_pattern
from controller.costmodel.netparams import NetParams
from controller.topology import fig2

MB = 1e6
ETH = 12.5e9  # 100 Gb/s in bytes/s
NV = 300e9  # A100 NVLink per direction
HOST = 4e-6  # NetParams.ina_host_s
BFP16 = NetParams(ina_lanes="bfp16")


def test_flat_bfp16_pays_one_round_trip_of_proposals_hand_worked():
    """gn2 (relayed over NVLink to gn1's NIC) and gn3 at S2, 1 MB of FP16. bfp16 on the wire:
    1 byte per byte of message x 210 / 128 (headers), 1.640625 MB: 131.25 us on every link up
    and down. The longest round trip (gn2's: 6 hops) is 6 us of latency + a 210-byte packet
    on 4 NVLink and 2 Ethernet hops: 6 + 0.0196 = 6.0196 us.
    Proposals: 6.0196 + T_agg 1 = 7.0196 us; data: 131.25 + 6.0196 + 1 + host 4 = 142.2696 us;
    149.2892 us in all."""
    g = fig2()
    f = BFP16.fabric(g)
    p = ina_pattern(f, ["gn2", "gn3"], "S2", MB, BFP16)
    assert p.paths == {"gn2": ["gn2", "A-nvsw", "gn1", "S2"], "gn3": ["gn3", "S2"]}
    rtt = 6e-6 + 210 * (4 / NV + 1 / ETH)
    proposals, data = (c.time(MB) for c in p.compiled(f))
    assert proposals == pytest.approx(rtt + T_AGG_S, rel=1e-12)
    assert proposals == pytest.approx(7.0196e-6, rel=1e-9)
    assert proposals == p.compiled(f)[0].time(0.0)  # no bytes per byte of message
    assert data == pytest.approx(1.640625 * MB / ETH + rtt + T_AGG_S + HOST, rel=1e-12)
    assert p.time(f, MB) == pytest.approx(149.2892e-6, rel=1e-9)
    # int32 has no proposal round here (its exponent travels per vector): one phase.
    assert len(ina_pattern(f, ["gn2", "gn3"], "S2", MB, NetParams()).compiled(f)) == 1


def test_hier_bfp16_rails_pay_their_proposal_round_hand_worked():
    """Fig. 2's four GPUs, hierarchical (rails {gn1, gn3} at S2, {gn2, gn4} at S1), 1 MB:
    reduce-scatter and all-gather as for any lanes, 4.580320 us each (test_costmodel.py);
    the rails' proposals: a round trip of 2 x 2 us + 210 B / 12.5 GB/s = 4.0168 us, + T_agg:
    5.0168 us; the rails' data: 0.5 MB x 1.640625 / 12.5 GB/s = 65.625 us + 4.0168 + 1 + 4 =
    74.6418 us. Total 2 x 4.580320 + 5.0168 + 74.6418 = 88.81924 us."""
    g = fig2()
    f = BFP16.fabric(g)
    h = hier_pattern(f, ["gn1", "gn2", "gn3", "gn4"], MB, BFP16)
    assert h is not None
    assert [r.switch for r in h.rails] == ["S2", "S1"]
    rs, proposals, data, ag = (c.time(MB) for c in h.compiled(f))
    rtt = 4e-6 + 210 / ETH
    assert rs == ag == pytest.approx(4.580320e-6, rel=1e-6)
    assert proposals == pytest.approx(rtt + T_AGG_S, rel=1e-12)
    assert data == pytest.approx(0.5 * MB * 1.640625 / ETH + rtt + T_AGG_S + HOST, rel=1e-12)
    assert h.time(f, MB) == pytest.approx(88.81924e-6, rel=1e-6)


@pytest.mark.parametrize("lanes", ["int32", "bfp16", "fp16"])
def test_no_proposal_round_as_written_nor_for_vector_exponents(lanes: str) -> None:
    """The paper's Eq. 8 has no such round; int32 (one exponent per vector, agreed before
    the data by the caller) and the fp16 what-if carry none per packet."""
    g = fig2()
    for mode in ("pipelined", "paper"):
        params = NetParams(cost_mode=mode, ina_lanes=lanes)
        f = params.fabric(g)
        p = ina_pattern(f, ["gn2", "gn3"], "S2", MB, params)
        h = hier_pattern(f, ["gn1", "gn2", "gn3", "gn4"], MB, params)
        extra = int(mode == "pipelined" and lanes == "bfp16")
        assert (len(p.phases), len(h.phases)) == (1 + extra, 3 + extra)
