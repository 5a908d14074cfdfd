"""``kvcache.kv_route``'s cached price of each rail route is exactly the rule it implements:
the first of ``rail_routes`` with the least ``path_time`` (the same list, bit for bit, ties to
the first), on the testbed and on small 2tracks and 8tracks clusters, where a GPU has several
equal routes (its NVLink peers on the destination's rail) and the cached sums up to a
switch are shared by every destination behind it."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from controller.costmodel.kvcache import kv_route
from controller.costmodel.ring import rail_routes
from controller.topology import testbed as make_testbed
from controller.topology.fabric import PAPER, PIPELINED, Fabric
from controller.topology.generators import eight_tracks, two_tracks
from controller.topology.graph import servers

# 0 bytes, under one packet, one packet, a decode share, a whole request's KV cache
SIZES = (0.0, 100.0, 4096.0, 1.3e6, 7.58e8)


def reference(fab: Fabric, src: str, dst: str, nbytes: float) -> list[str]:
    """The rule as written: NVLink in a server, else the cheapest rail route alone."""
    nv = fab.nvlink_path(src, dst)
    if nv is not None:
        return nv
    return min(rail_routes(fab, src, dst), key=lambda p: fab.path_time(p, nbytes))


def gpu_pairs(g: nx.Graph, n_servers: int) -> list[tuple[str, str]]:
    """Every ordered pair of GPUs among the first ``n_servers`` servers and the last one."""
    by_server = list(servers(g).values())
    gpus = [x for s in by_server[:n_servers] + by_server[-1:] for x in s]
    return list(itertools.permutations(gpus, 2))


@pytest.mark.parametrize(
    "name,g,n_servers",
    [
        ("testbed", make_testbed(), 4),
        ("2tracks", two_tracks(12), 7),
        ("8tracks", eight_tracks(32), 3),
    ],
)
@pytest.mark.parametrize("mode", [PIPELINED, PAPER])
@pytest.mark.parametrize("relay", [True, False])
def test_kv_route_is_the_cheapest_rail_route(
    name: str, g: nx.Graph, n_servers: int, mode: str, relay: bool
) -> None:
    # two fabrics: one asked in the reference's order first, so the cached one answers from
    # its per-switch sums for every destination after the first behind a switch
    fab, ref = Fabric(g, relay=relay, cost_mode=mode), Fabric(g, relay=relay, cost_mode=mode)
    pairs = gpu_pairs(g, n_servers)
    ties = 0
    for nbytes in SIZES:
        for src, dst in pairs:
            want = reference(ref, src, dst, nbytes)
            assert kv_route(fab, src, dst, nbytes) == want, (name, src, dst, nbytes)
            times = [ref.path_time(p, nbytes) for p in rail_routes(ref, src, dst)]
            ties += times.count(min(times)) > 1
    if name == "2tracks" and relay:
        # four peers of a server share each rail: the tie rule was exercised
        assert ties > 0
