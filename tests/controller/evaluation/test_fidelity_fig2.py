"""Fig. 2 as ``heroserve fidelity`` reports it: the paper's collection-only figures and Eq. 8
in full, in the paper's mode (FP16 message, each path alone, no latency) and pipelined in
both lane formats, worked by hand on the 100 Gb/s Ethernet (12.5 GB/s, 2 us a hop) and 300
GB/s-per-direction NVLink (0.5 us a hop) of ``topology.generators.fig2``."""

import pytest

from controller.evaluation.fidelity import fig2_delays, fig2_full
from controller.units import MB

ETH, NV = 12.5e9, 300e9
T_AGG, HOST = 1e-6, 4e-6


def test_collection_only_is_the_papers_figure():
    homo, het = fig2_delays("paper")
    # Eq. 10 as written: two Ethernet hops 2 x 80 us; gn2 relays over two NVLink hops
    assert homo == pytest.approx(2 * MB / ETH, rel=1e-12)
    assert het == pytest.approx(2 * MB / NV + MB / ETH, rel=1e-12)
    assert (homo, het) == pytest.approx((160e-6, 86.6667e-6), rel=1e-5)


def test_eq8_in_full_paper_mode_counts_the_fp16_message():
    """T_col + T_agg + T_dis, T_dis = T_col (the same routes back), no host term: 2 x 160 + 1
    = 321 us and 2 x 86.667 + 1 = 174.333 us, whatever the lanes."""
    for lanes in ("fp16", "int32"):
        homo, het = fig2_full("paper", lanes)
        assert homo == pytest.approx(2 * 2 * MB / ETH + T_AGG, rel=1e-12)
        assert het == pytest.approx(2 * (2 * MB / NV + MB / ETH) + T_AGG, rel=1e-12)
        assert (homo, het) == pytest.approx((321e-6, 174.3333e-6), rel=1e-5)


def test_eq8_in_full_pipelined_int32_lanes():
    """int32 lanes carry 4 bytes per FP16 element in 210-byte frames of 128 payload bytes:
    1 MB of FP16 is 2 x 210 / 128 = 3.28125 MB on the wire. Heterogeneous, pipelined: every
    link up and down carries it once, 262.5 us, plus gn2's round trip of 6 hops (2 x 3 us of
    latency and a 210-byte frame on each NVLink hop and the Ethernet hop but the slowest),
    T_agg and host: 262.5 + 6 + 210 x (4 / 300 GB/s + 1 / 12.5 GB/s) + 5 = 273.52 us."""
    wire = 3.28125 * MB
    _, het = fig2_full("pipelined", "int32")
    assert het == pytest.approx(wire / ETH + 6e-6 + 210 * (4 / NV + 1 / ETH) + T_AGG + HOST)
    assert het == pytest.approx(273.5196e-6, rel=1e-6)
