"""Where INA pays (docs/ina-map.md): the built-in `l40s-rack` loads and validates as built,
the map of ``benchmarks/ina_map.py`` names the winner of two cells worked out by hand from the
cost model's equations, and HeroServe's plan on the rack aggregates some group in the network.

Hand-worked cells (pipelined mode, docs/costmodel.md "Ring" and "Flat INA"), one GPU per
server on one switch, every route GPU -> tor -> GPU of two Ethernet hops (latency l = 2 us
each), NIC bandwidth B, message D = 32 x 9216 x 2 = 589,824 bytes (an OPT-66B decode batch of
32), P = 4 servers:

- ring: 2(P-1) rounds of D/P over B, plus 2(N-1) = 6 network hops of (route latency 2l + one
  RoCE packet of 4096 bytes at B, the second hop's serialisation, + NCCL's 4 us step);
- flat INA: every member's D x w (the lane format's wire ratio) up and the sum back down, full
  duplex: D w / B + the round trip's latency 2l + one INA frame at B + T_agg 1 us + the
  host's 4 us.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support import ROOT

from controller.costmodel.netparams import DEFAULT_INA_LANES, INA_LANES, NetParams
from controller.models import model_spec
from controller.planner import plan
from controller.planner.options import PlannerOptions
from controller.topology import BUILTIN, resolve_topology, topology_from_dict, topology_to_dict
from controller.topology.io import validate
from controller.workload import chatbot, default_sla

D = 32 * 9216 * 2


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _ina_map():
    return _bench("ina_map")


def test_l40s_rack_loads_and_validates_as_built():
    g = resolve_topology("l40s-rack")
    validate(g)
    assert "l40s-rack" in BUILTIN
    gpus = [n for n, d in g.nodes(data=True) if d["kind"] == "gpu"]
    assert len(gpus) == 32 and {g.nodes[n]["gpu_type"] for n in gpus} == {"L40S"}
    eth = [d for _, _, d in g.edges(data=True) if d["link"] == "ethernet"]
    pcie = [d for _, _, d in g.edges(data=True) if d["link"] == "pcie"]
    # 4 x 400 GbE per server over 8 GPUs: 200 Gb/s = 25 GB/s each; PCIe 4.0 x16: 32 GB/s
    assert len(eth) == 32 and {d["capacity"] for d in eth} == {25e9}
    assert len(pcie) == 32 and {d["capacity"] for d in pcie} == {32e9}
    assert g.nodes["tor"]["ina"]
    h = topology_from_dict(topology_to_dict(g))  # a file of it reads back the same
    assert dict(h.nodes(data=True)) == dict(g.nodes(data=True))


def _cell(mod, lanes: str, intra: str, per: int, tp: int, nic: float):
    it = next(i for i in mod.INTRA if i.name == intra)
    servers, _ = mod.placement(tp, per)
    g = mod.map_cluster(servers, min(per, tp), it, nic)
    return mod.Cell(lanes, intra, per, tp, nic, mod.price_cell(g, D, NetParams(ina_lanes=lanes)))


def test_flat_ina_wins_one_gpu_per_server_at_400g_by_hand():
    mod = _ina_map()
    c = _cell(mod, "int32", "PCIe 4.0", 1, 4, 400)
    net = NetParams(ina_lanes="int32")
    b = 400e9 / 8
    ring = 6 * (D / 4) / b + 6 * (2 * 2e-6 + 4096 / b + 4e-6)
    ina = D * net.ina_wire_ratio / b + 2 * 2e-6 + net.ina_frame_bytes / b + 1e-6 + 4e-6
    assert ring == pytest.approx(66.18624e-6, abs=1e-11)  # 17.69472 + 48.49152 us
    assert c.times["ring"] == pytest.approx(ring, rel=1e-12)
    assert c.times["ina"] == pytest.approx(ina, rel=1e-12)
    assert "hier" not in c.times  # one GPU per server: no reduce-scatter to do
    assert c.winner == "ina" and c.gain == pytest.approx(ring / ina, rel=1e-12)


def test_ring_wins_two_gpus_over_two_servers_at_100g_by_hand():
    """P = 2 servers of one GPU at 100 Gb/s: 2 rounds of D/2 and 2 network hops; INA moves
    w > 1 times the message where the ring moves it once."""
    mod = _ina_map()
    c = _cell(mod, "int32", "NVLink3", 1, 2, 100)
    net = NetParams(ina_lanes="int32")
    b = 100e9 / 8
    ring = 2 * (D / 2) / b + 2 * (2 * 2e-6 + 4096 / b + 4e-6)
    ina = D * net.ina_wire_ratio / b + 2 * 2e-6 + net.ina_frame_bytes / b + 1e-6 + 4e-6
    assert ring == pytest.approx(63.84128e-6, abs=1e-11)  # 47.18592 + 16.65536 us
    assert c.times["ring"] == pytest.approx(ring, rel=1e-12)
    assert c.times["ina"] == pytest.approx(ina, rel=1e-12)
    assert c.winner == "ring" and c.gain == 1.0


def test_spot_cells_run_in_every_lane_format_and_match_the_planner():
    """The script's spot checks, as its run makes them: every ``SPOT_CELLS`` geometry in every
    format of ``INA_LANES`` prices through the planner's ``AllReducePricer`` to the map's
    figures (a scheme the planner does not route is the one its bound rules out)."""
    mod = _ina_map()
    cells = [_cell(mod, ln, *key) for ln in INA_LANES for key in mod.SPOT_CELLS]
    checked = mod.spot_checks(cells, D)
    assert [c.lanes for c, _ in checked] == [ln for ln in INA_LANES for _ in mod.SPOT_CELLS]
    for c, planner in checked:
        assert planner["ring"] == pytest.approx(c.times["ring"], rel=1e-9)
        for k, t in planner.items():
            assert t == pytest.approx(c.times[k], rel=1e-9), (c.lanes, c.intra, k)


def test_ina_rack_offers_exactly_the_cost_models_lane_formats():
    ap = _bench("ina_rack").parser()
    lanes = next(a for a in ap._actions if a.dest == "ina_lanes")
    assert tuple(lanes.choices) == tuple(INA_LANES) and lanes.default == DEFAULT_INA_LANES


def test_heroserve_plans_ina_on_the_l40s_rack():
    """OPT-175B (350 GB) does not fit one server's 384 GB with room for its KV cache: the
    decode group spans two servers, where NCCL's ring pays 30 steps of latency and the
    hierarchical scheme's reduce-scatter over PCIe leaves 1/8 of the message to the switch."""
    g = resolve_topology("l40s-rack")
    p = plan(
        g,
        model_spec("OPT-175B"),
        chatbot(),
        default_sla("chatbot"),
        PlannerOptions(net=NetParams()),  # the shipped lane format
    )
    groups = p.prefill.groups + p.decode.groups
    ina = [gr for gr in groups if gr.scheme in ("ina", "hier")]
    assert ina, [(gr.gpus, gr.scheme, gr.reason) for gr in groups]
    for gr in ina:
        assert gr.allreduce_s < gr.ring_s
