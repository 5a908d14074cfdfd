"""Online scheduler (docs/design.md §8): hand-worked numbers, versions, and the shared vectors.

The shared vector files are checked three ways: the committed files still match what the
Python reference produces, and the C++ core (through the ctypes binding) reproduces their
choices exactly and their costs within 1e-9 relative. The hierarchical-INA file
(online_scheduler_hier.json) needs a core that knows scheme "hier".
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re

import pytest
from support import ROOT

from controller.scheduler.online import OnlineScheduler, TableError, parse_table, sharing_ratio

# tests/vectors, not beside this file: csrc/CMakeLists.txt points the C++ tests there too
VECTORS = ROOT / "tests" / "vectors" / "online_scheduler.json"
VECTORS_HIER = VECTORS.with_name("online_scheduler_hier.json")
GBPS = 1e9 / 8


def table(version: int = 1, apply_from_seq: int = 0, c0: float = 0.0, c1: float = 0.0) -> dict:
    return {
        "group_id": "decode/0/0",
        "version": version,
        "apply_from_seq": apply_from_seq,
        "window_s": 0.001,
        "gamma": 0.5,
        "links": [
            {"id": "g0|s1", "capacity": 100 * GBPS},
            {"id": "g1|s1", "capacity": 50 * GBPS},
            {"id": "g0|g1", "capacity": 50 * GBPS},
        ],
        "policies": [
            {"id": 0, "scheme": "ina", "switch": "s1", "links": ["g0|s1", "g1|s1"], "cost": c0},
            {"id": 1, "scheme": "ring", "links": ["g0|g1", "g1|s1"], "cost": c1},
        ],
        "utilisation": {"g0|s1": 0.2, "g1|s1": 0.4, "g0|g1": 0.1},
    }


def test_sharing_ratio_hand_worked() -> None:
    t = parse_table(table())
    assert sharing_ratio(t, t.utilisation, 0, 1) == pytest.approx(0.4 / 0.5)
    assert sharing_ratio(t, t.utilisation, 1, 0) == pytest.approx(0.4 / 0.6)
    assert sharing_ratio(t, [0.0, 0.0, 0.0], 0, 1) == 0.0  # 0/0 read as 0


def test_select_hand_worked() -> None:
    s = OnlineScheduler(table())
    # delta = 2^20 B / (1e-3 s * 6.25e9 B/s) = 0.16777216 for both policies: tie -> id 0
    assert s.select(1 << 20) == 0
    assert s.last_cost == pytest.approx(0.16777216, rel=1e-15)
    assert s.costs == pytest.approx([0.16777216, 0.16777216 * 0.8], rel=1e-15)
    assert s.select(1 << 20) == 1  # ring now cheaper: 0.134 + 0.168 < 0.168 + 0.168
    assert s.last_cost == pytest.approx(0.16777216 * 1.8, rel=1e-15)
    assert s.costs[0] == pytest.approx(0.16777216 * (1 + 0.4 / 0.6), rel=1e-15)
    assert s.seq == 2


def test_observe_applies_eq18_and_decay() -> None:
    s = OnlineScheduler(table(c0=1.0, c1=2.0))
    s.select(0)
    s.observe_utilisation({"g0|s1": 0.5, "g1|s1": 0.3, "other|link": 0.9})
    assert s.costs == pytest.approx([0.5 * 1 + 0.5 * 0.5, 0.5 * 2 + 0.5 * 0.3])
    assert s.penalty[0][1] == pytest.approx(0.5 * 0.8 + 0.5 * 1.0)
    with pytest.raises(TableError, match="outside"):
        s.observe_utilisation({"g0|s1": 1.5})


def test_versions_switch_at_agreed_boundary() -> None:
    s = OnlineScheduler()
    with pytest.raises(RuntimeError, match="no policy table"):
        s.select(1)
    assert s.install(table(1, 0))
    assert s.install(table(2, 3, c0=5.0))
    assert not s.install(table(2, 9))  # stale
    for _ in range(3):
        s.select(1000)
        assert s.version == 1
    assert s.select(1000) == 1
    assert s.version == 2
    assert s.late_tables == 0
    assert s.install(table(3, 1))
    assert s.late_tables == 1


def test_newer_version_supersedes_queued_older() -> None:
    s = OnlineScheduler(table(1, 0))
    s.install(table(2, 5))
    s.install(table(3, 2))
    for _ in range(8):
        s.select(10)
    assert s.version == 3


@pytest.mark.parametrize(
    "path,value,word",
    [
        (("gamma",), 1.5, "gamma"),
        (("window_s",), 0.0, "window_s"),
        (("policies", 1, "scheme"), "tree", "scheme"),
        (("policies", 1, "links"), ["zz"], "unknown link"),
        (("policies", 1, "id"), 0, "increasing"),
        (("version",), -1, "version"),
        (("links", 0, "capacity"), 0, "capacity"),
        (("utilisation",), {"g0|s1": 2.0}, "outside"),
    ],
)
def test_bad_tables_are_rejected_with_the_field_named(path, value, word) -> None:
    t = table()
    node = t
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(TableError, match=word):
        parse_table(t)


def affine_table(lat0=1e-4, bw1=None) -> dict:
    """Two policies on disjoint links (so no penalties): INA over a 100 Gb/s link with 100 us
    of latency, ring over a 50 Gb/s link with none."""
    t = {
        "group_id": "decode/0/1",
        "version": 1,
        "apply_from_seq": 0,
        "window_s": 0.001,
        "gamma": 0.5,
        "links": [
            {"id": "g0|s1", "capacity": 100 * GBPS},
            {"id": "g0|g1", "capacity": 50 * GBPS},
        ],
        "policies": [
            {"id": 0, "scheme": "ina", "switch": "s1", "links": ["g0|s1"], "cost": 0.0,
             "latency_s": lat0},
            {"id": 1, "scheme": "ring", "links": ["g0|g1"], "cost": 0.0},
        ],
    }  # fmt: skip
    if bw1 is not None:
        t["policies"][1]["bandwidth"] = bw1
    return t


def test_latency_makes_the_faster_link_lose_small_transfers() -> None:
    # Eq. 16 with T_u = 1 ms:
    #   policy 0 (INA): delta_0 = (1e-4 s + D / 12.5e9 B/s) / 1e-3 s = 0.1 + D / 12.5e6
    #   policy 1 (ring): delta_1 = (0 + D / 6.25e9 B/s) / 1e-3 s = D / 6.25e6
    # delta_0 = delta_1  <=>  0.1 = D / 6.25e6 - D / 12.5e6 = D / 12.5e6  <=>  D* = 1.25e6 B.
    # Below D* the ring wins although INA's link is twice as fast; above it INA wins.
    cases = [
        (65536, 1, 0.01048576),  # delta_1 = 0.01048576 < delta_0 = 0.10524288
        (1_000_000, 1, 0.16),  # 0.16 < 0.1 + 0.08 = 0.18
        (1_200_000, 1, 0.192),  # 0.192 < 0.196, just below D*
        (1_300_000, 0, 0.204),  # 0.1 + 0.104 = 0.204 < 0.208, just above D*
        (1_500_000, 0, 0.22),  # 0.22 < 0.24
        (16 << 20, 0, 0.1 + 16 * 2**20 / 12.5e6),  # 1.44217728 < 2.68435456
    ]
    for nbytes, want, delta in cases:
        s = OnlineScheduler(affine_table())  # zero load for every size
        assert s.select(nbytes) == want, nbytes
        assert s.last_cost == pytest.approx(delta, rel=1e-12), nbytes
        assert s.costs[want] == s.last_cost
        assert s.costs[1 - want] == 0.0  # disjoint links: f = W = 0
    # Without the latency the faster link wins at every size (the old Eq. 16).
    for nbytes, _, _ in cases:
        assert OnlineScheduler(affine_table(lat0=0.0)).select(nbytes) == 0
    # An explicit bandwidth replaces the bottleneck: at 25 Gb/s the ring's crossover moves to
    # 0.1 = D / 3.125e6 - D / 12.5e6 = 3 D / 12.5e6, D* = 416 666.67 B.
    s = OnlineScheduler(affine_table(bw1=25 * GBPS))
    assert s.select(400_000) == 1  # 0.128 < 0.132
    s = OnlineScheduler(affine_table(bw1=25 * GBPS))
    assert s.select(450_000) == 0  # 0.136 < 0.144


def test_default_fields_reproduce_the_bottleneck_delta_bit_for_bit() -> None:
    plain = table()
    explicit = table()
    caps = {lk["id"]: lk["capacity"] for lk in explicit["links"]}
    for p in explicit["policies"]:
        p["latency_s"] = 0.0
        p["bandwidth"] = min(caps[lid] for lid in p["links"])
    a, b = OnlineScheduler(plain), OnlineScheduler(explicit)
    bottleneck = 50 * GBPS  # both policies: min(100, 50) and min(50, 50) Gb/s
    for nbytes in (0, 1, 4096, 1 << 20, 3_333_333, 256 << 20):
        costs_before = list(a.costs) if a.table else [0.0, 0.0]
        ca, cb = a.select(nbytes), b.select(nbytes)
        assert ca == cb
        assert a.last_cost == b.last_cost
        assert a.costs == b.costs
        # the original expression, exactly: J = b_c* + D / (T_u * bottleneck)
        assert a.last_cost == costs_before[ca] + nbytes / (0.001 * bottleneck)
    t = parse_table(plain)
    assert [(p.latency_s, p.bandwidth) for p in t.policies] == [(0.0, bottleneck)] * 2


@pytest.mark.parametrize(
    "field,value,word",
    [
        ("latency_s", -1e-6, "latency_s must be >= 0"),
        ("latency_s", math.nan, "latency_s must be finite"),
        ("latency_s", math.inf, "latency_s must be finite"),
        ("latency_s", "1e-6", "latency_s must be a number"),
        ("latency_s", True, "latency_s must be a number"),
        ("bandwidth", 0, "bandwidth must be > 0"),
        ("bandwidth", -5e9, "bandwidth must be > 0"),
        ("bandwidth", math.inf, "bandwidth must be finite"),
        ("bandwidth", math.nan, "bandwidth must be finite"),
        ("bandwidth", None, "bandwidth must be a number"),
    ],
)
def test_bad_time_model_fields_are_rejected_with_the_field_named(field, value, word) -> None:
    t = table()
    t["policies"][1][field] = value
    with pytest.raises(TableError, match=f"policy 1: {word}"):
        parse_table(t)


def _replay(make, case: dict) -> None:
    s = make()
    for k, (ev, ex) in enumerate(zip(case["events"], case["expect"], strict=True)):
        where = f"{case['name']} event {k}"
        if "install" in ev:
            assert s.install(ev["install"]) == ex["accepted"], where
            continue
        if "select" in ev:
            assert s.select(ev["select"]) == ex["choice"], where
            assert math.isclose(s.last_cost, ex["cost"], rel_tol=1e-9), where
            assert s.version == ex["version"], where
        else:
            s.observe_utilisation(ev["observe"])
        assert len(s.costs) == len(ex["costs"]), where
        for a, b in zip(s.costs, ex["costs"], strict=True):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or a == b, where


def test_vector_file_matches_reference() -> None:
    data = json.loads(VECTORS.read_text())
    assert len(data["cases"]) >= 5
    for case in data["cases"]:
        _replay(OnlineScheduler, case)
    hier = json.loads(VECTORS_HIER.read_text())["cases"]
    assert {c["name"] for c in hier} == {"hier_crossover_hand", "hier_0_3p", "hier_1_8p"}
    for case in hier:
        _replay(OnlineScheduler, case)
    # The hand case's crossover (gen_online_scheduler.hier_table): flat INA at 64 KiB, hier at
    # 1 MiB, then the ring once the observed load sits on the switches' links.
    hand = next(c for c in hier if c["name"] == "hier_crossover_hand")
    assert [e.get("choice") for e in hand["expect"]] == [None, 1, 0, None, 2, 2]


def test_vector_generator_is_reproducible(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_vectors", VECTORS.parent / "gen_online_scheduler.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OUT = tmp_path / "v.json"
    mod.OUT_HIER = tmp_path / "h.json"
    mod.main()
    assert json.loads(mod.OUT.read_text()) == json.loads(VECTORS.read_text())
    assert json.loads(mod.OUT_HIER.read_text()) == json.loads(VECTORS_HIER.read_text())


def test_cpp_core_matches_vectors() -> None:
    from agents.gpu.policy_core import CoreUnavailable, PolicyCore

    try:
        PolicyCore()
    except CoreUnavailable as exc:
        pytest.skip(f"C++ policy core not built: {exc}")
    data = json.loads(VECTORS.read_text())
    for case in data["cases"]:
        _replay(PolicyCore, copy.deepcopy(case))


def test_cpp_core_matches_hier_vectors() -> None:
    from agents.gpu.policy_core import CoreError, CoreUnavailable, PolicyCore

    try:
        core = PolicyCore()
    except CoreUnavailable as exc:
        pytest.skip(f"C++ policy core not built: {exc}")
    cases = json.loads(VECTORS_HIER.read_text())["cases"]
    try:
        core.install(copy.deepcopy(cases[0]["events"][0]["install"]))
    except CoreError as exc:
        if "scheme must be ina, ring or nvls" in str(exc):
            pytest.skip(f"the C++ core predates scheme hier: {exc}")
        raise
    for case in cases:
        _replay(PolicyCore, copy.deepcopy(case))


def _hier(**policy: object) -> dict:
    t = table()
    t["policies"][0] = {
        "id": 0,
        "scheme": "hier",
        "switch": "",
        "rails": [{"shard": 0, "switch": "s1"}, {"shard": 1, "switch": "s2"}],
        "links": ["g0|s1", "g1|s1"],
        "cost": 0.0,
        **policy,
    }
    return t


def test_hier_policy_rules() -> None:
    p = parse_table(_hier()).policies[0]
    assert (p.scheme, p.switch, p.rails) == ("hier", "", ((0, "s1"), (1, "s2")))
    for bad, message in (
        (_hier(switch="s1"), "policy 0: a hier policy's switch must be empty"),
        (_hier(rails=[]), "policy 0: a hier policy needs a non-empty rails list"),
        (_hier(rails=[{"shard": 1, "switch": "s2"}]), "rails[0].shard is 1: rails must list"),
        (_hier(rails=[{"shard": 0, "switch": ""}]), "rails[0].switch must be a non-empty"),
        (_hier(rails=[{"shard": -1, "switch": "s"}]), "rails[0].shard must be a uint32"),
        (_hier(rails=[{"shard": k, "switch": "s"} for k in range(65)]), "more than 64 rails"),
        (_hier(scheme="ina", switch="s1"), "policy 0: rails are for hier policies only"),
        (_hier(paths={"g0": ["g0"] * 65}), "the path of g0 has more than 64 nodes"),
        (_hier(paths={"g0": "s1"}), "paths values must be lists"),
    ):
        with pytest.raises(TableError, match=re.escape(message)):
            parse_table(bad)
    many = table()
    many["policies"] = [
        {"id": i, "scheme": "ring", "links": ["g0|g1"], "cost": 0.0} for i in range(257)
    ]
    with pytest.raises(TableError, match="policies lists 257 policies, more than 256"):
        parse_table(many)
