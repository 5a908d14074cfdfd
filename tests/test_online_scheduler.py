"""Online scheduler (DESIGN.md §8): hand-worked numbers, versions, and the shared vectors.

The shared vector file is checked three ways: the committed file still matches what the
Python reference produces, and the C++ core (through the ctypes binding) reproduces its
choices exactly and its costs within 1e-9 relative.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import pytest

from controller.scheduler.online import OnlineScheduler, TableError, parse_table, sharing_ratio

VECTORS = Path(__file__).parent / "vectors" / "online_scheduler.json"
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


def test_vector_generator_is_reproducible(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_vectors", VECTORS.parent / "gen_online_scheduler.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.OUT = tmp_path / "v.json"
    mod.main()
    assert json.loads(mod.OUT.read_text()) == json.loads(VECTORS.read_text())


def test_cpp_core_matches_vectors() -> None:
    from agents.gpu.policy_core import CoreUnavailable, PolicyCore

    try:
        PolicyCore()
    except CoreUnavailable as exc:
        pytest.skip(f"C++ policy core not built: {exc}")
    data = json.loads(VECTORS.read_text())
    for case in data["cases"]:
        _replay(PolicyCore, copy.deepcopy(case))
