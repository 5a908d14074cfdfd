"""What the emulation derives from a topology without starting anything (no root): the
emulated network (names, ports, addresses, shaping), the switch agents' --port arguments,
ring routes (PXN), the plan made for the emulation and its checks, NCCL-style ring channels,
the expected result of a collective, and the cost model's prediction on the emulated links."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
from support import ROOT

from agents.ina import lanes
from agents.ina.impairments import MIN_REORDER_DELAY_S, Impairments
from agents.ina.packet import BFP16_LANES
from agents.ina.worker import lanes_digest, member_data, sums_digest
from controller.costmodel.hier import hier_pattern
from controller.emulate.collectives import (
    expected,
    expected_bfp16,
    expected_hier_bfp16,
    ring_channels,
)
from controller.emulate.plans import check_plan, emulation_plan, group_runs
from controller.emulate.predict import emulated_graph, lane_params, predict
from controller.emulate.spec import network_spec, ring_route, shape
from controller.errors import InputError
from controller.topology import resolve_topology
from controller.topology.graph import add_link


@pytest.fixture(scope="module")
def testbed() -> nx.Graph:
    return resolve_topology("testbed")


def test_testbed_network_names_ports_and_addresses(testbed: nx.Graph) -> None:
    spec = network_spec(testbed, 1000.0, tag="hx1")
    assert len(spec.hosts) == 16 and sorted(spec.switches) == ["s1", "s2"]
    assert len(spec.bridges) == 4
    # Hosts in name order: srv0-gpu0 is host 0, srv1-gpu0 host 4.
    h = spec.hosts["srv1-gpu0"]
    assert (h.name, h.nic_ip, h.nic_mac, h.nvlink_ip) == (
        "hx1g4",
        "10.0.0.5",
        "02:48:53:00:00:04",
        "10.1.0.5",
    )
    assert (h.switch, h.fabric) == ("s1", "srv1-nvsw")
    s1 = spec.switches["s1"]
    # Ports in neighbour-name order: s2 first, then the 8 GPUs of the track.
    assert [s1.ports[p].peer for p in range(1, 4)] == ["s2", "srv0-gpu0", "srv0-gpu2"]
    assert s1.ports[9].peer == "srv3-gpu2" and s1.ports[2].intf == "hx1s1-eth2"
    assert s1.agent_ports()[:2] == [
        "1=s2,mac=02:48:53:ff:00:02,gbps=100",
        "2=srv0-gpu0,mac=02:48:53:00:00:00,ip=10.0.0.1,gbps=100",
    ]
    assert (s1.ina_ip, s1.ina_mac) == ("10.0.255.1", "02:48:53:ff:00:01")
    # 8 + 8 GPU ports, the s1-s2 link once, 16 NVLink ports: 33 links.
    assert len(spec.links) == 33


def test_mesh_board_runs_on_one_bridge_per_server(testbed: nx.Graph) -> None:
    """The testbed's 4-GPU boards join GPUs pair by pair; the emulation puts each server on
    one bridge, each GPU's port the total of its three links (A100 3 x 100, V100 3 x 50 GB/s),
    and the prediction charges a direct link the two bridge hops it takes."""
    spec = network_spec(testbed, 1000.0, tag="hx1")
    ports = {(x.a, x.b): x for x in spec.links if x.kind == "nvlink"}
    assert ports[("srv0-nvsw", "srv0-gpu1")].capacity == 300e9
    assert ports[("srv3-nvsw", "srv3-gpu2")].capacity == 150e9
    assert ports[("srv3-nvsw", "srv3-gpu2")].shape.rate_bps == 150e9 * 8 / 1000
    h = emulated_graph(testbed, 1000, {"ethernet": 5e-6, "nvlink": 3e-6})
    assert h.edges["srv0-gpu0", "srv0-gpu1"]["latency_s"] == 6e-6
    assert h.edges["srv0-gpu0", "s1"]["latency_s"] == 5e-6
    g = testbed.copy()
    g.add_node("srv0-nvsw", kind="host")
    g.add_edge("srv0-nvsw", "s1", link="ethernet", capacity=1e9, available=1e9, latency_s=0)
    with pytest.raises(InputError, match="needs a bridge named 'srv0-nvsw'"):
        network_spec(g, 1000.0)


def test_shaping_divides_bandwidth_and_leaves_the_fastest_unshaped(testbed: nx.Graph) -> None:
    assert shape(12.5e9, 1000.0).rate_bps == 100e6  # 100 Gb/s -> 100 Mb/s
    # NVLink per direction: A100 300 GB/s -> 2.4 Gb/s, over 2 Gb/s: unshaped; V100 150 GB/s
    # -> 1.2 Gb/s: shaped.
    assert shape(300e9, 1000.0).rate_bps == 0.0
    assert shape(150e9, 1000.0).rate_bps == 1.2e9
    assert shape(300e9, 10000.0).rate_bps == 240e6
    spec = network_spec(testbed, 1000.0, tag="hx1")
    assert sorted(spec.unshaped)[0] == "srv0-nvsw-srv0-gpu0"
    assert len(spec.unshaped) == 8  # the NVLink ports of the two A100 servers
    eth = [lk for lk in spec.links if lk.kind == "ethernet"]
    assert {lk.shape.rate_bps for lk in eth} == {100e6}


def test_ring_routes_nvlink_same_switch_and_pxn(testbed: nx.Graph) -> None:
    spec = network_spec(testbed, 1000.0, tag="hx1")
    assert ring_route(spec, "srv0-gpu0", "srv0-gpu1") == ("10.1.0.2", None)
    assert ring_route(spec, "srv0-gpu0", "srv1-gpu0") == ("10.0.0.5", None)
    # srv1-gpu1 is on s2: relay through srv0-gpu1, whose NIC is on s2 (NCCL's PXN).
    assert ring_route(spec, "srv0-gpu0", "srv1-gpu1") == ("10.0.0.6", "10.1.0.2")


def test_what_cannot_be_emulated_is_refused(testbed: nx.Graph) -> None:
    with pytest.raises(InputError, match="slowdown must be >= 1"):
        network_spec(testbed, 0.5)
    g = testbed.copy()
    add_link(g, "srv0-gpu0", "s2", link="ethernet", capacity=12.5e9)
    with pytest.raises(InputError, match="srv0-gpu0 has 2 links to switches"):
        network_spec(g, 1000.0)
    g = testbed.copy()
    add_link(g, "srv0-gpu0", "srv1-gpu0", link="nvlink", capacity=1e9)
    with pytest.raises(InputError, match="direct GPU-to-GPU links are not emulated"):
        network_spec(g, 1000.0)
    # Two servers whose GPUs sit on different switches and have no NVLink peer to relay.
    g2 = resolve_topology("fig2")
    spec = network_spec(g2, 1000.0)
    assert ring_route(spec, "gn2", "gn4") == (spec.hosts["gn4"].nic_ip, None)
    g3 = g2.copy()
    g3.remove_edge("gn3", "B-nvsw")
    spec3 = network_spec(g3, 1000.0)
    with pytest.raises(InputError, match="no emulated route from gn3 to gn2"):
        ring_route(spec3, "gn3", "gn2")


def test_plan_made_for_the_emulation(testbed: nx.Graph) -> None:
    plan = emulation_plan(testbed, window=64, hier=True)
    runs = {r.name: r for r in group_runs(plan)}
    ina = runs["prefill/0/0"].group
    assert (ina.scheme, ina.switch) == ("ina", "s1")
    assert ina.gpus == ["srv0-gpu0", "srv0-gpu2", "srv1-gpu0", "srv1-gpu2"]
    assert (ina.slots.start, ina.slots.count) == (0, 64)  # type: ignore[union-attr]
    assert all(ina.paths[m] == [m, "s1"] for m in ina.gpus)
    hier = runs["prefill/1/0"].group
    assert hier.scheme == "hier" and [r.members for r in hier.rails] == [
        ["srv0-gpu1", "srv1-gpu1"],
        ["srv0-gpu3", "srv1-gpu3"],
    ]
    assert [r.switch for r in hier.rails] == ["s2", "s2"]
    ring = runs["decode/0/0"].group
    assert ring.scheme == "ring" and ring.gpus == [f"srv3-gpu{i}" for i in range(4)]
    assert runs["prefill/0/0"].schemes == ("ina", "ring")
    assert runs["decode/0/0"].schemes == ("ring",)
    no_hier = emulation_plan(testbed, hier=False)
    assert [g.scheme for g in no_hier.prefill.groups] == ["ina"]
    # Every GPU of the made plan is used once.
    gpus = plan.all_gpus()
    assert len(gpus) == len(set(gpus)) == 12


def test_plans_the_data_plane_cannot_serve_are_refused(testbed: nx.Graph) -> None:
    spec = network_spec(testbed, 1000.0)
    plan = emulation_plan(testbed, hier=False)
    check_plan(plan, testbed, spec)
    bad = dataclasses.replace(plan)
    grp = bad.prefill.groups[0]
    grp.gpus = ["srv0-gpu0", "srv0-gpu1"]  # srv0-gpu1's NIC is on s2
    with pytest.raises(InputError, match="srv0-gpu1 does not reach s1 through its own NIC"):
        check_plan(bad, testbed, spec)
    ring_only = emulation_plan(testbed, hier=False)
    ring_only.prefill.groups = []
    with pytest.raises(InputError, match="no INA group"):
        check_plan(ring_only, testbed, spec)


def test_the_planners_own_hier_plan_is_accepted(testbed: nx.Graph) -> None:
    """`heroserve plan --workload summarization` on the testbed aggregates its decode group
    with hierarchical INA (4 rails on s1 and s2): every rail member reaches its rail's switch
    by its own NIC, so `heroserve emulate --plan` runs it as planned (docs/emulation.md)."""
    from controller.models import model_spec
    from controller.planner import plan as make_plan
    from controller.workload import default_sla, summarization

    plan = make_plan(testbed, model_spec("OPT-66B"), summarization(), default_sla("summarization"))
    hier = [r for r in group_runs(plan) if r.group.scheme == "hier"]
    assert hier and [r.switch for r in hier[0].group.rails] == ["s1", "s2", "s1", "s2"]
    check_plan(plan, testbed, network_spec(testbed, 1000.0))


def test_ring_channels_spread_traffic_between_servers_over_two_nics(testbed: nx.Graph) -> None:
    spec = network_spec(testbed, 1000.0)
    cluster = SimpleNamespace(g=testbed, spec=spec)
    members = ["srv0-gpu0", "srv0-gpu2", "srv1-gpu0", "srv1-gpu2"]
    ch = ring_channels(cluster, members)  # type: ignore[arg-type]
    ip = {n: (spec.hosts[n].nic_ip, spec.hosts[n].nvlink_ip) for n in members}
    # Channel 0: s0g0 s0g2 s1g0 s1g2; channel 1 enters each server at its second GPU.
    assert ch["srv0-gpu0"] == [[0, 4, ip["srv0-gpu2"][1]], [1, 4, ip["srv1-gpu2"][0]]]
    assert ch["srv0-gpu2"] == [[1, 4, ip["srv1-gpu0"][0]], [0, 4, ip["srv0-gpu0"][1]]]
    # Between servers, channel 0 leaves through srv0-gpu2's NIC and channel 1 through gpu0's.
    one = ring_channels(cluster, ["srv2-gpu0", "srv2-gpu1", "srv2-gpu2"])  # type: ignore[arg-type]
    assert [len(v) for v in one.values()] == [1, 1, 1]  # one server: one NVLink ring


def test_expected_result_is_the_exact_lane_sum() -> None:
    digest, e, err, bound = expected(seed=3, n=1000, workers=3)
    data = [member_data(3, i, 1000) for i in range(3)]
    # Member 0's data is 100 x [-1, 1): 64 <= max |x| < 128, E = 7; the others' E = 0.
    assert e == max(lanes.exponent_of(lanes.max_abs(x)) for x in data) == 7
    assert [lanes.exponent_of(lanes.max_abs(x)) for x in data[1:]] == [0, 0]
    total = sum(lanes.to_lanes(x, 3, e).astype(np.int64) for x in data)
    assert digest == lanes_digest(total.astype(np.int32))
    assert 0 < err <= bound == 3 * 2.0 ** -(30 - 2 - 7 + 1)


def test_expected_bfp16_result_is_the_exact_sum_of_the_quantized_values() -> None:
    """The emulation's bfp16 reference, worked here block by block: member 0's data,
    100 x [-1, 1), gives each 64-element block E = 7 (some element above 64) where the
    others propose E = 0 (member 1's first block, zeros, the smallest exponent), so
    s = 14 - 2 - 7 = 5 for 3 members and the bound per element is 3 x 2^-6."""
    digest, err, bound = expected_bfp16(seed=3, n=1000, workers=3)
    data = [member_data(3, i, 1000).astype(np.float64) for i in range(3)]
    assert not data[1][:BFP16_LANES].any()
    want = np.zeros(1000)
    for b in range(0, 1000, BFP16_LANES):
        assert [lanes.block_exponent(d[b : b + BFP16_LANES]) - 127 for d in data] == [
            7, -127 if b == 0 else 0, 0
        ]  # fmt: skip
        q = sum(np.rint(d[b : b + BFP16_LANES] * 2.0**5).astype(np.int64) for d in data)
        want[b : b + BFP16_LANES] = q / 2.0**5
    assert digest == sums_digest(want)
    assert 0 < err <= bound == 3 * 2.0**-6


def test_expected_hier_bfp16_sums_each_servers_float32_sum() -> None:
    """The emulation's hierarchical bfp16 reference: servers {0, 1} and {2, 3} (data
    indices in local-rank order), 2 shards of 500; each rail's sum is lanes.bfp16_reference
    of the two servers' float32 sums of its shard. Which members share a server matters:
    member 0's 100x data beside member 1 or beside member 2 quantises differently."""
    n = 1000
    digest, err, bound = expected_hier_bfp16(3, n, [[0, 1], [2, 3]])
    x = [member_data(3, i, n) for i in range(4)]
    want = np.concatenate(
        [lanes.bfp16_reference([x[0][a:b] + x[1][a:b], x[2][a:b] + x[3][a:b]])[0]
         for a, b in ((0, 500), (500, 1000))]
    )  # fmt: skip
    assert digest == sums_digest(want.astype(np.float32))
    assert 0 < err <= bound
    assert expected_hier_bfp16(3, n, [[0, 2], [1, 3]])[0] != digest


def test_bfp16_prediction_halves_the_wire(testbed: nx.Graph) -> None:
    """INA priced in the plan's lanes: bfp16 carries an element in 2 wire bytes where
    int32 takes 4, so with no latency a large message takes half the time (the proposal
    round adds only its packets and T_agg); the ring keeps int32. Hierarchical INA's rails
    halve the same way, its NVLink rings (float32, 4 bytes) unchanged."""
    members = ["srv0-gpu0", "srv0-gpu2", "srv1-gpu0", "srv1-gpu2"]
    h = emulated_graph(testbed, 1000, {"ethernet": 0.0, "nvlink": 0.0})
    i32 = predict(h, "ina", members, "s1", 64 << 20)
    b16 = predict(h, "ina", members, "s1", 64 << 20, lanes="bfp16")
    assert i32 is not None and b16 is not None
    assert b16 / i32 == pytest.approx(0.5, rel=1e-3)
    assert predict(h, "ring", members, "s1", 1 << 20, lanes="bfp16") == predict(
        h, "ring", members, "s1", 1 << 20
    )
    phases = {}
    for fmt in ("int32", "bfp16"):
        params = lane_params(fmt)  # type: ignore[arg-type]
        fab = params.fabric(h, relay=False)
        pat = hier_pattern(fab, members, 64 << 20, params)
        assert pat is not None
        phases[fmt] = [c.time(64 << 20) for c in pat.compiled(fab)]
        assert predict(h, "hier", members, "s1", 64 << 20, lanes=fmt) == sum(phases[fmt])
    (rs, ina, ag), (rs16, proposals, ina16, ag16) = phases["int32"], phases["bfp16"]
    assert (rs16, ag16) == (rs, ag) and proposals < 1e-3 * ina16
    assert ina16 / ina == pytest.approx(0.5, rel=1e-3)


def test_prediction_scales_with_the_slowdown(testbed: nx.Graph) -> None:
    """With no latency, a large message's time is its bandwidth term: twice the slowdown,
    twice the time, for INA and ring alike."""
    members = ["srv0-gpu0", "srv0-gpu2", "srv1-gpu0", "srv1-gpu2"]
    zero = {"ethernet": 0.0, "nvlink": 0.0}
    h1, h2 = emulated_graph(testbed, 1000, zero), emulated_graph(testbed, 2000, zero)
    assert h1.edges["s1", "srv0-gpu0"]["capacity"] == 12.5e9 / 1000
    assert h1.edges["s1", "srv0-gpu0"]["latency_s"] == 0.0
    for scheme in ("ina", "ring"):
        t1 = predict(h1, scheme, members, "s1", 64 << 20)
        t2 = predict(h2, scheme, members, "s1", 64 << 20)
        assert t1 is not None and t2 is not None
        assert t2 / t1 == pytest.approx(2.0, rel=1e-3)


def test_impairments_follow_netem() -> None:
    rng = random.Random(0)
    fates = [Impairments(loss=0.1, duplicate=0.2, reorder=0.3).fate(rng, 0.0) for _ in range(20000)]
    lost = sum(1 for f in fates if not f) / len(fates)
    dup = sum(1 for f in fates if len(f) == 2) / len(fates)
    early = sum(1 for f in fates for d in f if d == 0.0) / sum(len(f) for f in fates)
    assert lost == pytest.approx(0.1, abs=0.01)
    assert dup == pytest.approx(0.9 * 0.2, abs=0.01)
    assert early == pytest.approx(0.3, abs=0.01)
    # A reordered packet skips the wait the others have (at least MIN_REORDER_DELAY_S).
    assert {d for f in fates for d in f} == {0.0, MIN_REORDER_DELAY_S}
    assert Impairments().fate(rng, 0.25) == [0.25]
    with pytest.raises(ValueError, match="loss must be a probability"):
        Impairments(loss=1.0)


@pytest.mark.skipif(
    not Path("/usr/lib/python3/dist-packages/mininet").is_dir(),
    reason="Debian's mininet package is not installed",
)
def test_token_bucket_holds_four_ms_of_the_rate() -> None:
    from controller.emulate.mn import load_network_module

    net = load_network_module()
    assert net.tbf_line("e0", 100e6) == (
        "tc qdisc replace dev e0 root tbf rate 100000000bit burst 50000 limit 4194304"
    )
    assert net.tbf_line("e0", 1e6).split()[-3] == "3200"  # two frames at least
    assert net.tbf_line("e0", 0.0) == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["emulate", "--bytes", "2"], "--bytes: must be at least 4, got 2"),
        (["emulate", "--loss", "1.5"], "not a probability"),
        (["emulate", "--slowdown", "nan"], "must be a finite number"),
        (["demo", "--hold", "-1"], "--hold: must be non-negative"),
        (["emulate", "--topology", "2tracks"], "one machine emulates at most 256"),
        (["emulate", "--plan", "/etc/hostname"], "not a plan"),
        (["demo", "--topology", "nope.yaml"], "does not exist"),
        (["emulate", "--ina-client", "nccl"], "invalid choice: 'nccl'"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (the CLI's own main; every refusal comes before anything starts)."""
    import os

    from controller.cli import main

    try:
        status = main(args)
    except SystemExit as exc:  # argparse's refusal
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    # argparse shows its usage above; the problem is named on one line.
    lines = [x for x in err.splitlines() if "error:" in x]
    assert len(lines) == 1, err
    if os.geteuid() == 0 or "argument" in lines[0]:
        assert message in lines[0]
    else:
        assert "needs root" in lines[0]


def test_plugin_client_without_the_cxx_build_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ina-client plugin names the missing harness before anything starts (any user)."""
    from controller.cli import main
    from controller.emulate import plugin

    monkeypatch.setattr(plugin, "HARNESS", tmp_path / "collnet_harness")
    status = main(["emulate", "--ina-client", "plugin"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [f"heroserve emulate: error: --ina-client plugin: {tmp_path}/collnet_harness "
                   "is not built (make cxx)"]  # fmt: skip


def test_a_fresh_session_is_the_next_one_and_every_member_gets_it() -> None:
    """The plugin's ranks start their rounds at 0: each of their runs takes the group's next
    session (newer modulo 2^32, RFC 1982), and so does whoever uses the group after."""
    from agents.ina.packet import SESSIONS
    from controller.emulate.collectives import Workers

    w = Workers(cluster=None)  # type: ignore[arg-type]
    w.ina_sessions[7] = {"session": SESSIONS - 1, "first_generation": 3}
    s = w.fresh_session(7)
    assert s["session"] == 0 and w.ina_session(7) == s
    assert w.fresh_session(7)["session"] == 1 and w.ina_session(7)["session"] == 1
    assert w.ina_session(8)["session"] != w.fresh_session(8)["session"]


def test_bad_input_from_the_command_line_is_status_2() -> None:
    """The same through a real process: the status reaches the shell, no traceback."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "controller.cli", "emulate", "--loss", "1.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "not a probability" in r.stderr


def test_demo_reads_what_the_gpu_agents_writer_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's reader against csrc's own writer (agents.gpu.policy_core), then the
    segments a hostile or unlucky moment gives it: each named, none trusted."""
    import os

    from agents.gpu.policy_core import library_path, publish_to_shm
    from agents.gpu.shmview import DATA_OFFSET, MAX_PAYLOAD, describe, read_segment

    if not library_path().exists():
        pytest.skip(f"{library_path()} not built (make cxx)")
    prefix = f"emuview{os.getpid()}."
    monkeypatch.setenv("HEROSERVE_SHM_PREFIX", prefix)
    seg = Path("/dev/shm") / f"heroserve-{prefix}prefill.1.0"
    policies = [
        {"id": 0, "scheme": "hier", "links": ["a|s"], "cost": 0.0,
         "rails": [{"shard": 0, "switch": "s2"}, {"shard": 1, "switch": "s2"}]},
        {"id": 1, "scheme": "ina", "switch": "s2", "links": ["a|s"], "cost": 0.0},
        {"id": 2, "scheme": "ring", "links": ["a|b"], "cost": 0.0},
    ]  # fmt: skip
    table = {"group_id": "prefill/1/0", "version": 3, "apply_from_seq": 0, "window_s": 0.1,
             "gamma": 0.5, "links": [{"id": "a|s", "capacity": 5e10},
                                     {"id": "a|b", "capacity": 2.5e10}],
             "policies": policies}  # fmt: skip
    try:
        publish_to_shm("prefill/1/0", [table])
        raw = seg.read_bytes()
    finally:
        seg.unlink(missing_ok=True)
    good = tmp_path / "good"
    good.write_bytes(raw)
    got = read_segment(good)
    assert (got.version, got.error, len(got.tables)) == (3, "", 1)
    assert describe(got) == "group prefill/1/0 version 3: hier s2:0,s2:1; ina s2; ring"

    def variant(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return describe(read_segment(tmp_path / name))

    flipped = bytearray(raw)
    flipped[DATA_OFFSET + 5] ^= 1
    assert variant("flipped", bytes(flipped)) == "payload fails its checksum"
    writing = bytearray(raw)
    writing[24] |= 1  # the seqlock odd: a write in progress that never ends
    assert "odd seqlock" in variant("writing", bytes(writing))
    long = bytearray(raw)
    long[32:40] = MAX_PAYLOAD.to_bytes(8, "little")  # within the limit, past the segment
    assert "outside the segment" in variant("long", bytes(long))
    long[32:40] = (1 << 40).to_bytes(8, "little")  # refused on the limit, before the segment
    assert f"above the limit of {MAX_PAYLOAD}" in variant("huge", bytes(long))
    assert "shorter than its header" in variant("short", raw[:100])
    assert "not a policy segment" in variant("other", b"X" * len(raw))
    assert "unreadable" in describe(read_segment(tmp_path / "absent"))


@pytest.mark.skipif(
    not Path("/usr/lib/python3/dist-packages/mininet").is_dir(),
    reason="Debian's mininet package is not installed",
)
def test_without_a_checkout_the_emulation_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed wheel carries controller/ and agents/, not mininet/: one line, no
    ModuleNotFoundError (which the CLI would read as a missing extra)."""
    import sys

    from controller.emulate import mn

    monkeypatch.setattr(mn, "ROOT", tmp_path)
    monkeypatch.delitem(sys.modules, mn.PACKAGE, raising=False)
    with pytest.raises(InputError, match="runs from a checkout of the repository"):
        mn.load_network_module()
