"""``--cost-mode paper``: the paper's Eqs. 7-11 as written (docs/costmodel.md "Cost modes"),
checked against figures worked by hand from the paper's equations: FP16 message bytes, no
packet headers, each member's path priced alone, no latency, per-hop or channel terms.

The testbed (``topology.generators.testbed``): srv0, srv1 are A100 4-GPU mesh boards (100
GB/s per pair and direction), srv2, srv3 V100 mesh boards (50 GB/s per pair); every GPU has
one 100 Gb/s (12.5 GB/s) port, GPUs 0 and 2 on s1, 1 and 3 on s2. OPT-66B's hidden size is
9216, so a prefill of 161 tokens all-reduces D = 161 x 9216 x 2 = 2,967,552 bytes."""

import json

import pytest

from controller.cli import main
from controller.costmodel.hier import hier_pattern
from controller.costmodel.ina import T_AGG_S, collection_time, ina_pattern
from controller.costmodel.netparams import NetParams
from controller.costmodel.ring import ring_pattern
from controller.topology import fig2
from controller.topology import testbed as make_testbed
from controller.workload import chatbot

PAPER = NetParams(cost_mode="paper")
D = 161 * 9216 * 2
ETH, NV_A100, NV_V100 = 12.5e9, 100e9, 50e9
TP8 = [f"srv{s}-gpu{i}" for s in (0, 1) for i in range(4)]


def test_v100_prefill_ring_is_eq11_literal():
    """Eq. 11 with D_rg = D/P per step: 2(P-1) = 6 steps of D/4 = 741,888 bytes at the
    slowest link, the 50 GB/s V100 pair: 6 x 14.83776 us = 89.02656 us (no latency)."""
    g = make_testbed()
    f = PAPER.fabric(g)
    r = ring_pattern(f, [f"srv2-gpu{i}" for i in range(4)], D, PAPER)
    assert r.time(f, D) == pytest.approx(6 * (D / 4) / NV_V100, rel=1e-12)
    assert r.time(f, D) == pytest.approx(89.02656e-6, rel=1e-9)
    # each GPU's share on its one link to its successor, not spread over the mesh
    assert r.paths["srv2-gpu3"] == ["srv2-gpu3", "srv2-gpu0"]


def test_tp8_over_two_servers_ring_and_flat_ina_literal():
    """TP-8 on srv0 + srv1. Ring: 14 steps of D/8 = 370,944 bytes at the ring's slowest link,
    a 12.5 GB/s port: 14 x 29.67552 = 415.45728 us (no channels: one route per GPU).
    Flat INA at s1 (Eqs. 8-10): GPUs 0, 2 reach s1 over their port, D / 12.5 GB/s = 237.4042
    us; GPUs 1, 3 relay over a 100 GB/s NVLink pair to a GPU on s1, 29.67552 + 237.4042 =
    267.07968 us, each path alone (their peer's port is not charged twice). T_ina = 2 x
    267.07968 + T_agg 1 = 535.15936 us, no host term."""
    g = make_testbed()
    f = PAPER.fabric(g)
    ring = ring_pattern(f, TP8, D, PAPER)
    assert ring.time(f, D) == pytest.approx(14 * (D / 8) / ETH, rel=1e-12)
    assert ring.time(f, D) == pytest.approx(415.45728e-6, rel=1e-9)
    one_way = D / NV_A100 + D / ETH
    for sw in ("s1", "s2"):
        ina = ina_pattern(f, TP8, sw, D, PAPER)
        assert ina.time(f, D) == pytest.approx(2 * one_way + T_AGG_S, rel=1e-12)
        assert ina.time(f, D) == pytest.approx(535.15936e-6, rel=1e-9)
        assert collection_time(f, ina, D, PAPER) == pytest.approx(one_way, rel=1e-12)
    # lanes do not change the paper's price: it counts the FP16 message
    i16 = NetParams(cost_mode="paper", ina_lanes="int32")
    assert ina_pattern(f, TP8, "s1", D, i16).time(f, D) == pytest.approx(535.15936e-6)
    # hierarchical INA in the paper's terms: NVLink rings of 3 steps of D/4 at 100 GB/s
    # (22.25664 us each way) and each rail's shard D/4 one hop up and down, 2 x 59.35104 + 1
    h = hier_pattern(f, TP8, D, PAPER)
    rs = 3 * (D / 4) / NV_A100
    assert [c.time(D) for c in h.compiled(f)] == pytest.approx(
        [rs, 2 * (D / 4) / ETH + T_AGG_S, rs], rel=1e-12
    )


def test_fig2_160_and_90_us():
    """Fig. 2, 1 MB collected (T_col, Eqs. 9-10): homogeneous, gn3 crosses two 12.5 GB/s hops
    to the core S1: 160 us; heterogeneous, gn2 relays over two 300 GB/s NVLink hops to gn1's
    port on S2: 3.333 + 3.333 + 80 = 86.667 us (the paper: about 90). Eq. 8 in full: twice
    that plus T_agg: 321 and 174.333 us."""
    mb = 1e6
    g = fig2()
    homo_f, het_f = PAPER.fabric(g, relay=False), PAPER.fabric(g)
    homo = ina_pattern(homo_f, ["gn2", "gn3"], "S1", mb, PAPER)
    het = ina_pattern(het_f, ["gn2", "gn3"], "S2", mb, PAPER)
    assert collection_time(homo_f, homo, mb, PAPER) == pytest.approx(160e-6, rel=1e-12)
    assert collection_time(het_f, het, mb, PAPER) == pytest.approx(
        2 * mb / 300e9 + mb / ETH, rel=1e-12
    )
    assert het.paths["gn2"] == ["gn2", "A-nvsw", "gn1", "S2"]
    assert homo.time(homo_f, mb) == pytest.approx(321e-6, rel=1e-12)
    assert het.time(het_f, mb) == pytest.approx(174.33333e-6, rel=1e-7)


def test_plan_prints_the_prefill_rings_literal_all_reduce(tmp_path, capsys):
    """``plan --cost-mode paper`` on the testbed: the prefill groups (a V100 server each)
    print Eq. 11 at the plan's reference message, the chatbot workload's mean input
    (160.736 tokens): 6 x (K_in x 9216 x 2 / 4) / 50 GB/s = 88.9 us (89.0 at 161 tokens)."""
    out = tmp_path / "p.json"
    rc = main(["plan", "--planner", "heroserve", "--cost-mode", "paper", "--quiet",
               "--json", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0
    plan = json.loads(out.read_text())
    want = 6 * (chatbot().mean_input * 9216 * 2 / 4) / NV_V100
    prefill = plan["prefill"]["groups"]
    assert prefill and all(gr["scheme"] == "ring" for gr in prefill)
    assert all(gr["allreduce_s"] == pytest.approx(want, rel=1e-9) for gr in prefill)
    assert f"{want * 1e6:.1f} us" == "88.9 us"
    assert sum("prefill" in ln and "88.9 us" in ln for ln in text.splitlines()) == len(prefill)
