"""``Fabric.nvlink_path`` takes a direct link or a server's one NVSwitch without a search;
the path is the breadth-first search's on the GPUs' own neighbourhood less switches and
other GPUs (a route never crosses a third GPU), which it still runs where there are several
shortest paths (two NVSwitches), on every pair of GPUs of one server."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from controller.topology import eight_tracks, fig2
from controller.topology import testbed as make_testbed
from controller.topology.fabric import Fabric
from controller.topology.graph import GPU, SWITCH, add_gpu, add_link, add_nvswitch, servers


def searched(g: nx.Graph, a: str, b: str) -> list[str] | None:
    """The rule as written: BFS over a's and b's neighbours that are neither switches nor
    other GPUs."""
    if a == b:
        return [a]
    local = {*g.neighbors(a), *g.neighbors(b)}
    sub = g.subgraph({a, b} | {n for n in local if g.nodes[n]["kind"] not in (SWITCH, GPU)})
    try:
        return nx.shortest_path(sub, a, b)
    except nx.NetworkXNoPath:
        return None


def odd_server() -> nx.Graph:
    """One server: GPUs 0-3 on two NVSwitches (two shortest paths between them), GPU 4
    joined to GPU 0 directly, GPU 5 to GPU 4 only (a chain: no common neighbour with 0)."""
    g = nx.Graph(name="odd")
    for s in ("nvs0", "nvs1"):
        add_nvswitch(g, s, server="s")
    for i in range(6):
        add_gpu(g, f"s-gpu{i}", gpu_type="A100-80GB", memory_gb=80, server="s", index=i)
    for i in range(4):
        for s in ("nvs0", "nvs1"):
            add_link(g, f"s-gpu{i}", s, link="nvlink", capacity=3e11)
    add_link(g, "s-gpu0", "s-gpu4", link="pcie", capacity=3e10)
    add_link(g, "s-gpu4", "s-gpu5", link="pcie", capacity=3e10)
    return g


@pytest.mark.parametrize("g", [make_testbed(), fig2(), eight_tracks(16), odd_server()])
def test_nvlink_path_is_the_search_result(g: nx.Graph) -> None:
    fab = Fabric(g)
    pairs = 0
    for members in servers(g).values():
        for a, b in itertools.product(members, repeat=2):
            assert fab.nvlink_path(a, b) == searched(g, a, b), (a, b)
            pairs += 1
    assert pairs >= 8


def test_odd_server_paths_by_hand() -> None:
    fab = Fabric(odd_server())
    assert fab.nvlink_path("s-gpu0", "s-gpu4") == ["s-gpu0", "s-gpu4"]  # direct
    assert fab.nvlink_path("s-gpu5", "s-gpu0") is None  # only through GPU 4: never
    two = fab.nvlink_path("s-gpu1", "s-gpu2")  # two NVSwitches: either
    assert two is not None and len(two) == 3 and two[1] in ("nvs0", "nvs1")
    assert fab.nvlink_path("s-gpu4", "s-gpu1") is None  # only through GPU 0 and an NVSwitch
    assert fab.nvlink_path("s-gpu0", "s-gpu3") in (
        ["s-gpu0", "nvs0", "s-gpu3"],
        ["s-gpu0", "nvs1", "s-gpu3"],
    )
