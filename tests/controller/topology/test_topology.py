"""Cluster model: generators, file format, validator (docs/design.md §3)."""

import json
import math

import networkx as nx
import pytest
import yaml

from controller.errors import InputError
from controller.topology import (
    eight_tracks,
    fig2,
    load_topology,
    topology_from_dict,
    topology_to_dict,
    tracks,
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
            # 4-GPU boards are point-to-point meshes (docs/topology.md "Server fabrics"): each
            # pair has 4 NVLink3 links (A100) or 2 NVLink2 links (V100) of 25 GB/s each way
            for j in range(4):
                if j != i:
                    e = g.edges[gid, f"srv{s}-gpu{j}"]
                    assert (e["link"], e["capacity"]) == ("nvlink", (100 if s < 2 else 50) * GB)
            assert f"srv{s}-nvsw" not in g
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
    # 2 A100s sit on the 4-GPU board (a mesh): their pair keeps its 4 links, 100 GB/s each way
    e = g.edges["a-gpu0", "a-gpu1"]
    assert (e["link"], e["capacity"]) == ("nvlink", 100 * GB)
    assert "a-nvsw" not in g


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["links"].append({"a": "zz-gpu0", "b": "sw", "gbps": 100}),
            "links[4].a: unknown node 'zz-gpu0'",
        ),
        (lambda d: d["links"][0].update(gbps=-100), "links[0].gbps: must be positive, got -100"),
        (lambda d: d["links"].pop(0), "GPU 'a-gpu0' is disconnected"),
        (lambda d: d["servers"][0].update(gpu_type="B300"), "servers[0].gpu_type: must be one of"),
        (lambda d: d["switches"].append({"id": "sw"}), "switches[1].id: duplicate node id 'sw'"),
        # a misspelt key is an error naming it, not silently ignored
        (
            lambda d: d["links"][1].update(latncy_us=3),
            "links[1]: key 5: unknown key (did you mean latency_us?)",
        ),
        (lambda d: d.update(switchs=[]), "key 5: unknown key (did you mean switches?)"),
        # duplicate servers are an error, not an A100 server overwritten by T4
        (
            lambda d: d["servers"].append({"id": "a", "gpu_type": "T4", "gpus": 2}),
            "servers[2].id: duplicate server id 'a' (also servers[0].id)",
        ),
        (
            lambda d: d["servers"][0].update(gpus=0.5),
            "servers[0].gpus: must be an integer, got 0.5",
        ),
        (
            lambda d: d["servers"][0].update(gpus=True),
            "servers[0].gpus: must be an integer, got True",
        ),
        (
            lambda d: d["servers"][0].update(gpus=10**7),
            "servers[0].gpus: must be at most 1024, got 10000000",
        ),
        (lambda d: d["links"][0].update(gbps=math.nan), "links[0].gbps: must be a finite number"),
        (lambda d: d["links"][0].update(gbps=math.inf), "links[0].gbps: must be a finite number"),
        (lambda d: d["links"][0].update(latency_us=math.nan), "links[0].latency_us: must be a fin"),
        (lambda d: d["links"][0].update(used_gbps=math.inf), "links[0].used_gbps: must be a fin"),
        (lambda d: d["links"][0].update(used_gbps=100), "links[0].used_gbps: must be below"),
        (lambda d: d["servers"][1].update(memory_gb=math.nan), "servers[1].memory_gb: must be a"),
        (lambda d: d["links"][0].update(GBps=12.5), "links[0]: give the bandwidth once"),
        # fields of the wrong type
        (lambda d: d["servers"][0].update(gpu_type=["A100-40GB"]), "servers[0].gpu_type: must be"),
        (lambda d: d.update(servers=5), "servers: must be a list, got 5"),
        (lambda d: d["switches"][0].update(ina="false"), "switches[0].ina: must be true or false"),
        (lambda d: d["links"][0].update(a={"x": [[[1]]]}), "links[0].a: must be an id"),
        (lambda d: d["links"][0].update(a="bad/id"), "links[0].a: must be an id"),
        (
            lambda d: d.update(
                nodes=[{"id": "g", "kind": "gpu", "gpu_type": "T4", "server": "a", "index": "abc"}]
            ),
            "nodes[0].index: must be an integer, got a string",
        ),
        (
            lambda d: d.update(nodes=[{"id": "h", "kind": "host", "tier": "core"}]),
            "nodes[0]: key 3: unknown key; allowed: id, kind",
        ),
        (
            lambda d: d["switches"][0].update(aggregator_slots=2**32 - 1),
            "switches[0].aggregator_slots: must be at most 65536",
        ),
    ],
)
def test_validator_names_the_problem(mutate, message):
    d = _doc()
    mutate(d)
    if "disconnected" in message:  # a-gpu0 keeps its NVLink edge; drop the whole server
        d["servers"].append({"id": "c", "gpu_type": "T4", "gpus": 1})
        message = "GPU 'c-gpu0' is disconnected"
    with pytest.raises(InputError) as e:
        topology_from_dict(d, source="tiny.yaml")
    assert str(e.value).startswith("tiny.yaml: ") and message in str(e.value)


def test_explicit_gpus_need_distinct_indexes_in_a_server():
    d = _doc()
    d["nodes"] = [{"id": "x", "kind": "gpu", "gpu_type": "T4", "server": "a", "index": 1}]
    with pytest.raises(
        InputError, match="nodes\\[0\\].index: GPU index 1 of server 'a' is already"
    ):
        topology_from_dict(d)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_counts_are_bounded_before_anything_is_built(tmp_path):
    # 1,000 servers of 1,000 GPUs each: 10^6 GPUs refused before one is made
    d = _doc()
    d["servers"] = [{"id": f"s{i}", "gpu_type": "T4", "gpus": 1000} for i in range(1000)]
    with pytest.raises(InputError, match="1000000 GPUs in all, at most 65536 allowed"):
        topology_from_dict(d)
    # a 20 MB JSON file: refused from its size, before it is read
    big = tmp_path / "big.json"
    with big.open("w") as f:
        f.write('{"links": [' + ",".join(['{"a": "x", "b": "y", "gbps": 1}'] * 700_000) + "]}")
    with pytest.raises(InputError, match="a topology file may have at most 16777216"):
        load_topology(big)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # a billion-laughs document: nine nested aliases would expand to 9^9 nodes
        (
            "bomb.yaml",
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [*{p}, *{p}, *{p}]\n"
                for p, c in zip("abcdefgh", "bcdefghi", strict=True)
            )
            + "links: *i\n",
            "line 2: YAML aliases are not supported",
        ),
        ("deep.yaml", "links: " + "[" * 100_000 + "]" * 100_000, "nested deeper than 32"),
        ("deep.json", '{"links": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than"),
        ("dup.yaml", "links: []\nlinks: []\n", "line 2: a key the mapping already has"),
        ("dup.json", '{"links": [], "links": []}', "a JSON object names a key twice"),
        ("bin.yaml", "\xff\xfe\x00garbage", "not UTF-8"),
        ("bad.yaml", "links: [a, b\n", "not valid YAML"),
        ("int.json", '{"links": [{"gbps": ' + "9" * 5000 + "}]}", "not valid JSON"),
        ("nan.json", '{"links": [{"a": "x", "b": "y", "gbps": NaN}]}', "gbps: must be a finite"),
        ("list.yaml", "- a\n- b\n", "must be a mapping with 'links'"),
    ],
)
def test_hostile_files_get_one_line(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_bytes(text.encode("latin-1") if name == "bin.yaml" else text.encode())
    with pytest.raises(InputError) as e:
        load_topology(p)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("make", [make_testbed, fig2, lambda: tracks(12, 8, 2, 6, 3)])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_built_ins_exported_to_files_read_back_the_same(tmp_path, make, suffix):
    g = make()
    doc = topology_to_dict(g)
    path = tmp_path / f"t{suffix}"
    path.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc))
    h = load_topology(path)
    assert dict(g.nodes(data=True)) == dict(h.nodes(data=True))
    assert set(map(frozenset, g.edges)) == set(map(frozenset, h.edges))
    for a, b, d in g.edges(data=True):
        assert h.edges[a, b]["link"] == d["link"]
        for k in ("capacity", "available", "latency_s"):
            assert h.edges[a, b][k] == pytest.approx(d[k], rel=1e-12)


def test_fig2_routes():
    g = fig2()
    relay, plain = Fabric(g, relay=True), Fabric(g, relay=False)
    assert [e for e in plain.exits("gn2")] == [["gn2", "S1"]]
    assert ["gn2", "A-nvsw", "gn1", "S2"] in relay.exits("gn2")
    assert relay.switch_path("S1", "S2") == ["S1", "S2"]
