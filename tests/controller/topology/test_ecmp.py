"""Equal-cost switch paths (``Fabric.switch_paths``, ``flow_switch_path``) on a hand-drawn
fabric: two access switches, each with one uplink to each of two core switches that are joined
by a link. Between the access switches there are exactly two shortest paths (one per core);
a flow takes the one CRC-32 of its name picks, so the KV routes of many GPUs spread over both
uplinks, where the predecessor matrix's one path put them all on one. A slower uplink leaves
one shortest path."""

from __future__ import annotations

import zlib

import networkx as nx

from controller.costmodel.kvcache import kv_route
from controller.topology.fabric import Fabric
from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps

N = 8  # one-GPU servers behind a1


def fabric(slow_c2: bool = False) -> Fabric:
    g = nx.Graph(name="ecmp-hand")
    for s in ("a1", "a2"):
        add_switch(g, s, tier="access")
    for s in ("c1", "c2"):
        add_switch(g, s, tier="core")
    for a in ("a1", "a2"):
        for c in ("c1", "c2"):
            slow = slow_c2 and a == "a1" and c == "c2"
            add_link(g, a, c, link="ethernet", capacity=gbps(100 if slow else 400))
    add_link(g, "c1", "c2", link="ethernet", capacity=gbps(400))
    for k in range(N):
        (gpu,) = add_server(g, f"p{k}", gpu_type="A100-80GB", n_gpus=1, role="any")
        add_link(g, gpu, "a1", link="ethernet", capacity=gbps(100))
    (gpu,) = add_server(g, "d", gpu_type="A100-80GB", n_gpus=1, role="any")
    add_link(g, gpu, "a2", link="ethernet", capacity=gbps(100))
    return Fabric(g)


def test_the_equal_shortest_paths_in_name_order():
    fab = fabric()
    assert fab.switch_paths("a1", "a2") == (["a1", "c1", "a2"], ["a1", "c2", "a2"])
    assert fab.switch_paths("a1", "c1") == (["a1", "c1"],)  # c1 -> c2 -> ... is longer
    assert fab.switch_paths("a1", "a1") == (["a1"],)
    # the predecessor matrix's one path is one of them
    assert fab.switch_path("a1", "a2") in fab.switch_paths("a1", "a2")


def test_a_flow_takes_the_path_its_hash_picks():
    fab = fabric()
    paths = fab.switch_paths("a1", "a2")
    for k in range(N):
        flow = f"p{k}-gpu0"
        want = paths[zlib.crc32(f"{flow}>a2".encode()) % 2]
        assert fab.flow_switch_path("a1", "a2", flow) == want


def test_kv_routes_of_many_gpus_spread_over_both_uplinks():
    fab = fabric()
    cores = [kv_route(fab, f"p{k}-gpu0", "d-gpu0", 1e6)[2] for k in range(N)]
    want = ["c1" if zlib.crc32(f"p{k}-gpu0>a2".encode()) % 2 == 0 else "c2" for k in range(N)]
    assert cores == want
    assert set(cores) == {"c1", "c2"}  # these 8 names hash to both


def test_a_slower_uplink_is_not_an_equal_path():
    fab = fabric(slow_c2=True)
    assert fab.switch_paths("a1", "a2") == (["a1", "c1", "a2"],)
    assert {kv_route(fab, f"p{k}-gpu0", "d-gpu0", 1e6)[2] for k in range(N)} == {"c1"}
