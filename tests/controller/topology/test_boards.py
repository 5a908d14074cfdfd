"""Server fabrics as the boards wire them (docs/topology.md "Server fabrics"): 4-GPU A100 and
V100 boards are point-to-point meshes, 8-GPU A100/H100 boards NVSwitch, NVLink-less cards
PCIe; routes inside a server never pass through a third GPU."""

import networkx as nx
import pytest

from controller.models.boards import BOARDS, MESH, NVSWITCH, PCIE, board_for
from controller.models.gpus import GPU_SPECS
from controller.topology import testbed as make_testbed
from controller.topology import topology_from_dict, tracks
from controller.topology.fabric import Fabric
from controller.topology.generators import add_server, nvlink_per_direction
from controller.topology.graph import add_link, add_switch, relayed
from controller.units import GB


@pytest.mark.parametrize(
    ("gpu_type", "n", "name", "fabric"),
    [
        ("A100-40GB", 2, "HGX A100 4-GPU", MESH),
        ("A100-80GB", 4, "HGX A100 4-GPU", MESH),
        ("A100-40GB", 5, "HGX A100 8-GPU", NVSWITCH),
        ("A100-40GB", 8, "HGX A100 8-GPU", NVSWITCH),
        ("V100-32GB", 4, "V100 SXM2 4-GPU", MESH),
        ("V100-32GB", 8, "HGX-2 V100", NVSWITCH),
        ("H100", 4, "HGX H100/H200 8-GPU", NVSWITCH),
        ("T4", 4, "PCIe", PCIE),
    ],
)
def test_board_chosen_by_gpu_and_count(gpu_type, n, name, fabric):
    b = board_for(gpu_type, n)
    assert (b.name, b.fabric) == (name, fabric)


def test_mesh_boards_use_every_nvlink_link():
    """A full mesh of 4 gives each GPU 3 peers: 3 x links_per_peer x 25 GB/s is the GPU's
    whole NVLink bandwidth per direction (A100: 3 x 4 x 25 = 300; V100: 3 x 2 x 25 = 150)."""
    for spec in GPU_SPECS.values():
        for name in spec.boards:
            b = BOARDS[name]
            assert b.source
            if b.fabric == MESH:
                assert (b.max_gpus - 1) * b.pair_bw() == nvlink_per_direction(spec.name)
    assert board_for("A100-40GB", 4).pair_bw() == 100 * GB
    assert board_for("V100-32GB", 4).pair_bw() == 50 * GB


def test_a100_mesh_pair_gets_100_gb_per_s():
    """Two GPUs of a 4-GPU A100 server: the direct link, 100 GB/s each way; 1 MB alone on it
    takes 1e6 / 100e9 = 10 us + one 0.5 us NVLink hop (it was 1e6 / 300e9 + two hops through
    the NVSwitch model before)."""
    g = make_testbed()
    f = Fabric(g)
    p = f.nvlink_path("srv0-gpu1", "srv0-gpu3")
    assert p == ["srv0-gpu1", "srv0-gpu3"]
    assert g.edges["srv0-gpu1", "srv0-gpu3"]["capacity"] == 100 * GB
    assert f.path_time(p, 1e6) == pytest.approx(10.5e-6, rel=1e-12)
    # relaying to a peer's NIC (Fig. 2) also crosses the direct link
    assert ["srv0-gpu1", "srv0-gpu0", "s1"] in f.exits("srv0-gpu1")
    assert relayed(g, ["srv0-gpu1", "srv0-gpu0", "s1"])
    assert not relayed(g, ["srv0-gpu1", "s2", "s1"])


def test_eight_gpu_nvswitch_server_unchanged():
    """An 8-GPU A100 server keeps the NVSwitch model: every GPU one 300 GB/s edge to the
    server's fabric node, and a pair's route goes through it."""
    g = tracks(6, 8, 2, 6, 1)
    hub = "u0-srv0-nvsw"
    assert g.nodes[hub]["kind"] == "nvswitch"
    for i in range(8):
        gid = f"u0-srv0-gpu{i}"
        assert g.edges[gid, hub]["capacity"] == 300 * GB
        assert not any(g.nodes[v]["kind"] == "gpu" for v in g.neighbors(gid))
    assert Fabric(g).nvlink_path("u0-srv0-gpu0", "u0-srv0-gpu5") == [
        "u0-srv0-gpu0",
        hub,
        "u0-srv0-gpu5",
    ]
    assert relayed(g, ["u0-srv0-gpu0", hub, "u0-srv0-gpu1", "u0-acc1"])


def test_routes_never_cross_a_third_gpu():
    """A partial mesh from a file (a-b and b-c linked, a-c not): a and c have no NVLink path,
    since b does not forward its peers' NVLink traffic."""
    g = topology_from_dict(
        {
            "nodes": [
                *(
                    {"id": x, "kind": "gpu", "gpu_type": "A100-40GB", "server": "s", "index": i}
                    for i, x in enumerate("abc")
                ),
                {"id": "sw", "kind": "switch"},
            ],
            "links": [
                {"a": "a", "b": "b", "link": "nvlink", "GBps": 100},
                {"a": "b", "b": "c", "link": "nvlink", "GBps": 100},
                *({"a": x, "b": "sw", "gbps": 100} for x in "abc"),
            ],
        }
    )
    f = Fabric(g)
    assert f.nvlink_path("a", "b") == ["a", "b"]
    assert f.nvlink_path("a", "c") is None


def test_topology_file_server_is_wired_by_its_board():
    doc = {
        "servers": [{"id": "m", "gpu_type": "V100-32GB", "gpus": 3}],
        "switches": [{"id": "sw"}],
        "links": [{"a": f"m-gpu{i}", "b": "sw", "gbps": 100} for i in range(3)],
    }
    g = topology_from_dict(doc)
    assert sorted(g.edges("m-gpu0")) == [
        ("m-gpu0", "m-gpu1"),
        ("m-gpu0", "m-gpu2"),
        ("m-gpu0", "sw"),
    ]
    assert g.edges["m-gpu1", "m-gpu2"]["capacity"] == 50 * GB
    # a mesh server has no fabric node, so the id is free for a node of the file
    doc["nodes"] = [{"id": "m-nvsw", "kind": "host"}]
    doc["links"].append({"a": "m-nvsw", "b": "sw", "gbps": 10})
    assert topology_from_dict(doc).nodes["m-nvsw"]["kind"] == "host"


def test_pcie_cards_keep_the_host_fabric():
    g = nx.Graph()
    add_switch(g, "sw", tier="access")
    for gid in add_server(g, "p", gpu_type="L4", n_gpus=3, role="any"):
        add_link(g, gid, "sw", link="ethernet", capacity=12.5e9)
        assert g.edges[gid, "p-nvsw"]["link"] == "pcie"
    assert Fabric(g).nvlink_path("p-gpu0", "p-gpu2") == ["p-gpu0", "p-nvsw", "p-gpu2"]
