"""NVLink-less cards join their server over PCIe x16 at their own generation's rate."""

import networkx as nx
import pytest

from controller.topology.generators import add_server
from controller.units import GB


@pytest.mark.parametrize(("gpu_type", "gb_per_s"), [("T4", 16), ("L4", 32), ("L40", 32)])
def test_pcie_link_per_generation(gpu_type, gb_per_s):
    g = nx.Graph()
    gids = add_server(g, "s", gpu_type=gpu_type, n_gpus=2, role="any")
    for gid in gids:
        e = g.edges[gid, "s-nvsw"]
        assert e["link"] == "pcie"
        assert e["capacity"] == gb_per_s * GB
