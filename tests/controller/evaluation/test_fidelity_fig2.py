"""Fig. 2 as ``heroserve fidelity`` reports it: the paper's collection-only figures and Eq. 8
in full, in both lane formats, worked by hand on the 100 Gb/s Ethernet (12.5 GB/s, 2 us a
hop) and 300 GB/s-per-direction NVLink (0.5 us a hop) of ``topology.generators.fig2``."""

import pytest

from controller.evaluation.fidelity import fig2_delays, fig2_full
from controller.units import MB

ETH, NV = 12.5e9, 300e9
T_AGG, HOST = 1e-6, 4e-6


def test_collection_only_is_the_papers_figure():
    homo, het = fig2_delays("paper")
    # two store-and-forward Ethernet hops: 2 x (80 + 2) us; gn2 relays over two NVLink hops
    assert homo == pytest.approx(2 * (MB / ETH + 2e-6), rel=1e-12)
    assert het == pytest.approx(2 * (MB / NV + 0.5e-6) + MB / ETH + 2e-6, rel=1e-12)


def test_eq8_in_full_fp16_lanes():
    """T_col + T_agg + T_dis + host: T_dis = T_col (the same routes back): 2 x 164 + 5 = 333 us
    and 2 x 89.667 + 5 = 184.333 us."""
    homo, het = fig2_full("paper", "fp16")
    assert homo == pytest.approx(2 * 164e-6 + T_AGG + HOST, rel=1e-12)
    assert het == pytest.approx(2 * (2 * (MB / NV + 0.5e-6) + MB / ETH + 2e-6) + T_AGG + HOST)
    assert (homo, het) == pytest.approx((333e-6, 184.3333e-6), rel=1e-5)


def test_eq8_in_full_int32_lanes():
    """int32 lanes carry 4 bytes per FP16 element in 210-byte frames of 128 payload bytes:
    1 MB of FP16 is 2 x 210 / 128 = 3.28125 MB on the wire. Homogeneous: 2 x 2 x (262.5 + 2)
    + 5 = 1,063 us; heterogeneous: 2 x (2 x (10.9375 + 0.5) + 262.5 + 2) + 5 = 579.75 us."""
    wire = 3.28125 * MB
    homo, het = fig2_full("paper", "int32")
    assert homo == pytest.approx(4 * (wire / ETH + 2e-6) + T_AGG + HOST, rel=1e-12)
    assert het == pytest.approx(
        2 * (2 * (wire / NV + 0.5e-6) + wire / ETH + 2e-6) + T_AGG + HOST, rel=1e-12
    )
    assert (homo, het) == pytest.approx((1063e-6, 579.75e-6), rel=1e-6)
