"""Hand-made plans several test modules run: a testbed plan whose decode group runs
hierarchical INA (the simulator's validation and its unit tests), and the shared-uplink
cluster with the plan an Ethernet-only INA planner makes on it (the online scheduler in the
simulator, the controller's time model)."""

import networkx as nx

from controller.costmodel.hier import hier_pattern
from controller.costmodel.netparams import NetParams
from controller.plan import SLA, Group, Instance, PhasePlan, Plan, Predicted, Rail, SlotRange
from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps

# -- hierarchical INA ----------------------------------------------------------------------
HIER_DECODE = ["srv2-gpu0", "srv2-gpu1", "srv3-gpu0", "srv3-gpu1"]


def hier_plan(g, mode: str = "pipelined", lanes: str = "int32"):
    """A hand-made testbed plan whose decode group (TP4 over two V100 servers, two GPUs on
    each) runs hierarchical INA in ``lanes``: rail 0 (GPU 0 of both) at s1, rail 1 (GPU 1)
    at s2, with the routes ``hier_pattern`` chooses; prefill is one TP4 ring inside srv0."""
    net = NetParams(cost_mode=mode, ina_lanes=lanes)
    h = hier_pattern(net.fabric(g), HIER_DECODE, 48 * 5120 * 2, net)
    rails = [
        Rail(r.switch, r.shard, r.shards, r.members, SlotRange(8 * r.shard, 8), r.paths)
        for r in h.rails
    ]
    pre_gpus = [f"srv0-gpu{i}" for i in range(4)]
    pre = PhasePlan(
        "prefill", 4, 1, "A100-40GB", [Instance([pre_gpus])],
        [Group(0, 0, pre_gpus, "ring", None, None, {}, 0.0, None, 0.0, "NVLink ring")],
        0.0, 0.0, 1, 0.0,
    )  # fmt: skip
    dec = PhasePlan(
        "decode", 4, 1, "V100-32GB", [Instance([HIER_DECODE])],
        [Group(0, 0, HIER_DECODE, "hier", None, None, dict(h.paths), 0.0, None, 0.0,
               "hierarchical INA", rails)],
        0.0, 0.0, 48, 0.0,
    )  # fmt: skip
    return Plan(
        "heroserve", "testbed", "OPT-13B", "chatbot",
        SLA(2.5, 0.15, 0.9), pre, dec, [],
        Predicted(0.1, 0.05, 0.01, 10.0, 1.0, 8), options=net.plan_options(),
    )  # fmt: skip


# -- shared uplinks (see tests/controller/sim/test_online_scheduler_sim.py) ----------------
def shared_uplink_cluster() -> nx.Graph:
    g = nx.Graph(name="shared-uplink")
    for s, tier in (("c1", "core"), ("a1", "access"), ("a2", "access"), ("a3", "access")):
        add_switch(g, s, tier=tier)
    for a in ("a1", "a2", "a3"):
        add_link(g, a, "c1", link="ethernet", capacity=gbps(100))
    for gid in add_server(g, "p0", gpu_type="A100-40GB", n_gpus=4, role="prefill"):
        add_link(g, gid, "a3", link="ethernet", capacity=gbps(100))
    for k in range(4):
        gids = add_server(g, f"d{k}", gpu_type="A100-40GB", n_gpus=2, role="decode")
        first, second = ("a1", "a2") if k % 2 == 0 else ("a2", "a1")
        add_link(g, gids[0], first, link="ethernet", capacity=gbps(100))
        add_link(g, gids[1], second, link="ethernet", capacity=gbps(100))
    return g


def shared_uplink_plan() -> Plan:
    pre_gpus = [f"p0-gpu{i}" for i in range(4)]
    pre = PhasePlan(
        "prefill", 1, 1, "A100-40GB", [Instance([[x]]) for x in pre_gpus],
        [Group(i, 0, [x], "ring", None, None, {}, 0.0, None, 0.0, "TP=1")
         for i, x in enumerate(pre_gpus)],
        0.0, 0.0, 1, 0.0,
    )  # fmt: skip
    groups, insts = [], []
    for k, (a, b) in enumerate((("d0-gpu0", "d1-gpu0"), ("d2-gpu0", "d3-gpu0"))):
        insts.append(Instance([[a, b]]))
        paths = {a: [a, "a1", "c1"], b: [b, "a2", "c1"]}
        groups.append(Group(k, 0, [a, b], "ina", "c1", SlotRange(8 * k, 8), paths, 0.0, 0.0,
                            0.0, "Ethernet-only INA on the common core switch"))  # fmt: skip
    dec = PhasePlan("decode", 2, 1, "A100-40GB", insts, groups, 0.0, 0.0, 48, 0.0)
    return Plan(
        "ds-switchml", "shared-uplink", "OPT-13B", "chatbot",
        SLA(2.5, 0.15, 0.9), pre, dec, [],
        Predicted(0.1, 0.05, 0.01, 10.0, 1.0, 8),
    )  # fmt: skip
