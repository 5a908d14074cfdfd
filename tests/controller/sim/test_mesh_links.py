"""The simulator prices a collective on the links the boards wire (docs/topology.md "Server
fabrics"): a ring inside a 4-GPU A100 mesh loads the six direct NVLink links, each way, with
the cost model's bytes, and takes the cost model's time."""

import pytest

from controller.costmodel.netparams import NetParams
from controller.costmodel.ring import ring_pattern
from controller.sim.model import comm_option
from controller.sim.network import Links
from controller.topology import testbed as make_testbed
from controller.topology.graph import link_id
from controller.units import MB


def test_ring_in_a_mesh_server_loads_every_direct_link():
    g = make_testbed()
    f = NetParams().fabric(g)
    gpus = [f"srv0-gpu{i}" for i in range(4)]
    d = 4 * MB
    links = Links(g)
    opt = comm_option(links, f, ring_pattern(f, gpus, d, NetParams()))
    assert set(opt.link_ids) == {link_id(a, b) for a in gpus for b in gpus if a < b}
    # 6 steps, each D/12 on every directed link: half the message on each, all 12 directions
    assert len(opt.bytes_per_byte) == 12
    assert all(v == pytest.approx(0.5) for v in opt.bytes_per_byte.values())
    assert opt.bottleneck == 100e9
    # the cost model's 34.4 us (tests/controller/costmodel/test_costmodel.py)
    assert opt.time(d) == pytest.approx(34.4e-6, rel=1e-9)
