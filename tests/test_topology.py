"""Cluster model: generators, file format, validator (DESIGN.md §3)."""

import json

import networkx as nx
import pytest

from controller.errors import InputError
from controller.topology import (
    eight_tracks,
    fig2,
    topology_from_dict,
    topology_to_dict,
    two_tracks,
)
from controller.topology import (
    testbed as make_testbed,
)
from controller.topology.fabric import Fabric
from controller.topology.graph import gpus, nic_switches, switches
from controller.units import GB, gbps


def test_testbed_matches_fig6():
    g = make_testbed()
    assert len(gpus(g)) == 16
    assert switches(g) == ["s1", "s2"]
    for s in range(4):
        for i in range(4):
            gid = f"srv{s}-gpu{i}"
            assert nic_switches(g, gid) == ["s1" if i % 2 == 0 else "s2"]
            # NVLink per direction: half of A100's 600 and V100's 300 GB/s totals
            assert g.edges[gid, f"srv{s}-nvsw"]["capacity"] == (300 if s < 2 else 150) * GB
            assert g.nodes[gid]["role"] == "any"  # the planner splits the roles
            assert g.nodes[gid]["memory_gb"] == (40 if s < 2 else 32)
    assert g.edges["s1", "s2"]["capacity"] == gbps(100) == 12.5e9


@pytest.mark.parametrize(
    ("make", "n_tracks", "access", "core"), [(two_tracks, 2, 400, 27), (eight_tracks, 8, 600, 280)]
)
def test_track_clusters_have_the_papers_switch_counts(make, n_tracks, access, core):
    g = make()
    tiers = [d["tier"] for _, d in g.nodes(data=True) if d["kind"] == "switch"]
    assert tiers.count("access") == access
    assert tiers.count("core") == core
    assert len(gpus(g)) == 1200 * 8
    # GPU i of a server uses track i mod tracks
    for i in range(8):
        assert nic_switches(g, f"u0-srv3-gpu{i}") == [f"u0-acc{i % n_tracks}"]
    assert nx.is_connected(g)


def test_file_round_trip_keeps_every_attribute():
    g = make_testbed()
    h = topology_from_dict(json.loads(json.dumps(topology_to_dict(g))))
    assert set(g.nodes) == set(h.nodes)
    for a, b, d in g.edges(data=True):
        for k in ("link", "capacity", "available", "latency_s"):
            assert h.edges[a, b][k] == pytest.approx(d[k])


def _doc():
    return {
        "name": "tiny",
        "servers": [
            {"id": "a", "gpu_type": "A100-40GB", "gpus": 2, "role": "prefill"},
            {"id": "b", "gpu_type": "V100-32GB", "gpus": 2, "role": "decode"},
        ],
        "switches": [{"id": "sw", "tier": "access"}],
        "links": [
            {"a": f"{s}-gpu{i}", "b": "sw", "link": "ethernet", "gbps": 100}
            for s in "ab"
            for i in range(2)
        ],
    }


def test_server_shorthand_builds_nvlink_fabric():
    g = topology_from_dict(_doc())
    assert len(gpus(g)) == 4
    assert g.edges["a-gpu0", "a-nvsw"]["link"] == "nvlink"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["links"].append({"a": "zz-gpu0", "b": "sw", "gbps": 100}),
            "unknown node 'zz-gpu0'",
        ),
        (lambda d: d["links"][0].update(gbps=-100), "gbps must be positive, got -100"),
        (lambda d: d["links"].pop(0), "GPU 'a-gpu0' is disconnected"),
        (lambda d: d["servers"][0].update(gpu_type="B300"), "unknown gpu_type 'B300'"),
        (lambda d: d["switches"].append({"id": "sw"}), "duplicate node id 'sw'"),
    ],
)
def test_validator_names_the_problem(mutate, message):
    d = _doc()
    mutate(d)
    if "disconnected" in message:  # a-gpu0 keeps its NVLink edge; drop the whole server
        d["servers"].append({"id": "c", "gpu_type": "T4", "gpus": 1})
        message = "GPU 'c-gpu0' is disconnected"
    with pytest.raises(InputError, match=message):
        topology_from_dict(d)


def test_fig2_routes():
    g = fig2()
    relay, plain = Fabric(g, relay=True), Fabric(g, relay=False)
    assert [e for e in plain.exits("gn2")] == [["gn2", "S1"]]
    assert ["gn2", "A-nvsw", "gn1", "S2"] in relay.exits("gn2")
    assert relay.switch_path("S1", "S2") == ["S1", "S2"]
