"""Generate tests/vectors/online_scheduler.json and online_scheduler_hier.json from the Python
reference scheduler.

The files are shared by tests/controller/scheduler/test_online_scheduler.py and
csrc/tests/test_vectors.cc: the C++ policy core must reproduce every choice exactly and every
cost within 1e-9 relative. The hierarchical-INA cases (scheme "hier" with rails) are a file of
their own, so a C++ core that predates the scheme keeps passing the others.

Run: .venv/bin/python tests/vectors/gen_online_scheduler.py  (rewrites the file; the pytest
suite checks the committed file still matches the reference).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from controller.scheduler.online import OnlineScheduler  # noqa: E402

OUT = Path(__file__).with_name("online_scheduler.json")
OUT_HIER = Path(__file__).with_name("online_scheduler_hier.json")
GBPS = 1e9 / 8  # bytes/s in one Gbit/s


def two_policy_table() -> dict[str, Any]:
    """Hand-sized: INA over a 100 Gb/s uplink vs ring over two 50 Gb/s links sharing one."""
    return {
        "group_id": "decode/0/0",
        "version": 1,
        "apply_from_seq": 0,
        "window_s": 0.001,
        "gamma": 0.5,
        "links": [
            {"id": "g0|s1", "capacity": 100 * GBPS},
            {"id": "g1|s1", "capacity": 50 * GBPS},
            {"id": "g0|g1", "capacity": 50 * GBPS},
        ],
        "policies": [
            {
                "id": 0,
                "scheme": "ina",
                "switch": "s1",
                "links": ["g0|s1", "g1|s1"],
                "cost": 0.0,
                "paths": {"g0": ["g0", "s1"], "g1": ["g1", "s1"]},
            },
            {
                "id": 1,
                "scheme": "ring",
                "switch": "",
                "links": ["g0|g1", "g1|s1"],
                "cost": 0.0,
                "paths": {"g0": ["g0", "g1"], "g1": ["g1", "s1", "g0"]},
            },
        ],
        "utilisation": {"g0|s1": 0.2, "g1|s1": 0.4, "g0|g1": 0.1},
    }


def random_table(
    rng: random.Random, n_links: int, n_policies: int, version: int, apply_from_seq: int, group: str
) -> dict[str, Any]:
    links = [
        {"id": f"n{i}|n{i + 1}", "capacity": rng.choice([25, 50, 100, 200, 400, 900]) * GBPS}
        for i in range(n_links)
    ]
    policies = []
    for pid in range(n_policies):
        k = rng.randint(1, min(4, n_links))
        chosen = rng.sample(range(n_links), k)
        policies.append(
            {
                "id": pid * rng.randint(1, 3) + pid,  # increasing, with gaps
                "scheme": rng.choice(["ina", "ring", "nvls"]),
                "switch": "",
                "links": [links[c]["id"] for c in chosen],
                "paths": {},
                "cost": rng.choice([0.0, 0.0, rng.random() * 0.2]),
            }
        )
    ids = sorted({p["id"] for p in policies})
    for p, pid in zip(policies, ids, strict=False):
        p["id"] = pid
    policies = policies[: len(ids)]
    util = {
        links[i]["id"]: round(rng.random(), 6) for i in rng.sample(range(n_links), n_links // 2)
    }
    return {
        "group_id": group,
        "version": version,
        "apply_from_seq": apply_from_seq,
        "window_s": rng.choice([0.0005, 0.001, 0.01]),
        "gamma": rng.choice([0.0, 0.25, 0.5, 0.9, 1.0]),
        "links": links,
        "policies": policies,
        "utilisation": util,
    }


def with_time_model(rng: random.Random, table: dict[str, Any]) -> dict[str, Any]:
    """The same table with Eq. 16's optional ``latency_s`` / ``bandwidth`` on some policies
    (absent, explicit defaults, or drawn), so both cores exercise the affine delta."""
    caps = {lk["id"]: lk["capacity"] for lk in table["links"]}
    for p in table["policies"]:
        bottleneck = min(caps[lid] for lid in p["links"])
        r = rng.random()
        if r < 0.2:
            continue  # both absent: the bottleneck form
        if r < 0.35:
            p["latency_s"] = 0.0  # explicit defaults: same numbers as absent
            p["bandwidth"] = bottleneck
            continue
        if rng.random() < 0.8:
            p["latency_s"] = rng.choice([1e-6, 2e-5, 5.76e-4, rng.random() * 1e-3])
        if rng.random() < 0.7:
            # effective bandwidth below the bottleneck (INA's int32 lanes, ring's 2(N-1)/N)
            p["bandwidth"] = bottleneck * rng.choice([0.25, 0.5, 2 / 3, rng.uniform(0.1, 1.0)])
    return table


def latency_table() -> dict[str, Any]:
    """Hand-sized, disjoint links (no penalties): INA over 100 Gb/s with 100 us latency vs a
    ring over 50 Gb/s with none. T_u = 1 ms, so delta_0 = 0.1 + D / 12.5e6 and
    delta_1 = D / 6.25e6: the ring wins below D = 1.25e6 bytes, INA above."""
    return {
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
             "latency_s": 1e-4},
            {"id": 1, "scheme": "ring", "switch": "", "links": ["g0|g1"], "cost": 0.0,
             "bandwidth": 50 * GBPS},
        ],
    }  # fmt: skip


def hier_table() -> dict[str, Any]:
    """Hand-sized hierarchical INA on 2 servers (a, b) x 2 GPUs with two rails:
    hier (policy 0, no switch, rails s1 and s2, NVLink inside each server), flat INA on s1
    (policy 1, the rail-1 GPUs through s2) and NCCL's ring (policy 2). T_u = 1 ms. Hier moves
    half the bytes per NIC (one shard each) and pays NVLink's reduce-scatter and all-gather;
    flat INA pays the whole vector per NIC.
    delta_0 = 20 us / 1 ms + D / (1 ms * 12.5e9), delta_1 = 10 us / 1 ms + D / (1 ms * 6.25e9),
    delta_2 = 40 us / 1 ms + D / (1 ms * 8.33e9): flat INA wins below D = 125 000 bytes
    (0.01 + D / 6.25e6 = 0.02 + D / 12.5e6), hier above; the ring's latency never pays."""
    nv, nic = 150e9, 12.5e9
    links = [
        {"id": "a0|a1", "capacity": nv},
        {"id": "a0|s1", "capacity": nic},
        {"id": "a1|s2", "capacity": nic},
        {"id": "b0|b1", "capacity": nv},
        {"id": "b0|s1", "capacity": nic},
        {"id": "b1|s2", "capacity": nic},
        {"id": "s1|s2", "capacity": nic},
    ]
    return {
        "group_id": "decode/0/0",
        "version": 1,
        "apply_from_seq": 0,
        "window_s": 0.001,
        "gamma": 0.5,
        "links": links,
        "policies": [
            {"id": 0, "scheme": "hier", "switch": "",
             "rails": [{"shard": 0, "switch": "s1"}, {"shard": 1, "switch": "s2"}],
             "links": ["a0|a1", "a0|s1", "a1|s2", "b0|b1", "b0|s1", "b1|s2"],
             "paths": {"a0": ["a0", "s1"], "a1": ["a1", "s2"], "b0": ["b0", "s1"],
                       "b1": ["b1", "s2"]},
             "cost": 0.0, "latency_s": 2e-5, "bandwidth": nic},
            {"id": 1, "scheme": "ina", "switch": "s1",
             "links": ["a0|s1", "a1|s2", "b0|s1", "b1|s2", "s1|s2"],
             "paths": {"a0": ["a0", "s1"], "a1": ["a1", "s2", "s1"], "b0": ["b0", "s1"],
                       "b1": ["b1", "s2", "s1"]},
             "cost": 0.0, "latency_s": 1e-5, "bandwidth": nic / 2},
            {"id": 2, "scheme": "ring", "switch": "",
             "links": ["a0|a1", "a1|s2", "b0|b1", "b1|s2"],
             "paths": {"a0": ["a0", "a1"], "a1": ["a1", "s2", "b1"], "b0": ["b0", "b1"],
                       "b1": ["b1", "s2", "a1"]},
             "cost": 0.0, "latency_s": 4e-5, "bandwidth": nic * 2 / 3},
        ],
        "utilisation": {"a1|s2": 0.2, "s1|s2": 0.5},
    }  # fmt: skip


def with_hier(rng: random.Random, table: dict[str, Any]) -> dict[str, Any]:
    """Make some of a random table's policies hierarchical (no switch, 1-4 rails)."""
    for p in table["policies"]:
        if rng.random() < 0.4:
            p["scheme"] = "hier"
            p["switch"] = ""
            p["rails"] = [{"shard": k, "switch": f"s{k + 1}"} for k in range(rng.randint(1, 4))]
    return table


def run_case(name: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    s = OnlineScheduler()
    expect = []
    for ev in events:
        if "install" in ev:
            expect.append({"accepted": s.install(ev["install"])})
        elif "select" in ev:
            choice = s.select(ev["select"])
            expect.append(
                {
                    "choice": choice,
                    "cost": s.last_cost,
                    "costs": list(s.costs),
                    "version": s.version,
                }
            )
        else:
            s.observe_utilisation(ev["observe"])
            expect.append({"costs": list(s.costs)})
    return {"name": name, "events": events, "expect": expect}


def random_case(
    rng: random.Random,
    name: str,
    n_links: int,
    n_policies: int,
    steps: int,
    time_model: random.Random | None = None,
    hier: random.Random | None = None,
) -> dict[str, Any]:
    """``time_model``: give the tables latency_s / bandwidth fields drawn from this generator
    (a separate one, so the cases without them stay as they were); ``hier``: make some
    policies hierarchical, drawn from this generator."""
    group = "prefill/0/0"
    t1 = random_table(rng, n_links, n_policies, 1, 0, group)
    if time_model is not None:
        t1 = with_time_model(time_model, t1)
    if hier is not None:
        t1 = with_hier(hier, t1)
    events: list[dict[str, Any]] = [{"install": t1}]
    version = 1
    link_ids = [lk["id"] for lk in t1["links"]]
    selected = False  # an observation needs a table in force: the first select activates it
    for step in range(steps):
        r = rng.random()
        if r < 0.75 or (r < 0.93 and not selected):
            selected = True
            events.append(
                {
                    "select": rng.choice(
                        [4096, 65536, 1 << 20, 16 << 20, 256 << 20, rng.randint(1, 1 << 28)]
                    )
                }
            )
        elif r < 0.93:
            events.append(
                {
                    "observe": {
                        lid: round(rng.random(), 6)
                        for lid in rng.sample(link_ids, len(link_ids) // 2 + 1)
                    }
                }
            )
        else:
            version += 1
            # same links so later observations stay meaningful; applies a few selections ahead
            t = random_table(rng, n_links, n_policies, version, step + rng.randint(0, 5), group)
            if time_model is not None:
                t = with_time_model(time_model, t)
            if hier is not None:
                t = with_hier(hier, t)
            events.append({"install": t})
            if rng.random() < 0.3:
                events.append({"install": t1})  # stale: must be ignored
    return run_case(name, events)


def main() -> None:
    rng = random.Random(20260521)
    cases = []
    t = two_policy_table()
    cases.append(
        run_case(
            "two_policies_hand",
            [
                {"install": t},
                {"select": 1 << 20},
                {"select": 1 << 20},
                {"select": 8 << 20},
                {"observe": {"g0|s1": 0.5, "g1|s1": 0.3}},
                {"select": 4 << 20},
            ],
        )
    )
    tie = two_policy_table()
    tie["links"][1]["capacity"] = 100 * GBPS
    tie["links"][2]["capacity"] = 100 * GBPS
    tie["utilisation"] = {}
    cases.append(
        run_case(
            "tie_lowest_id", [{"install": tie}, {"select": 1000}, {"select": 1000}, {"select": 0}]
        )
    )
    v2 = two_policy_table()
    v2["version"] = 2
    v2["apply_from_seq"] = 3
    v2["policies"][1]["cost"] = 0.0
    v2["policies"][0]["cost"] = 5.0
    cases.append(
        run_case(
            "version_switch_at_boundary",
            [
                {"install": two_policy_table()},
                {"select": 1 << 20},
                {"install": v2},
                {"select": 1 << 20},
                {"select": 1 << 20},
                {"select": 1 << 20},
                {"select": 1 << 20},
                {"install": two_policy_table()},
            ],
        )
    )
    for k, (nl, npol, steps) in enumerate(
        [(3, 2, 40), (6, 4, 80), (10, 8, 120), (16, 16, 200), (24, 32, 150), (8, 3, 60)]
    ):
        cases.append(random_case(rng, f"random_{k}_{npol}p", nl, npol, steps))
    # Eq. 16 with latency_s / bandwidth (added later: the cases above are unchanged).
    cases.append(
        run_case(
            "latency_crossover_hand",
            [
                {"install": latency_table()},
                {"select": 65536},  # ring: 0.0104858 < 0.1052429
                {"select": 1_000_000},  # ring: 0.16 + 0.0104858 < 0.18
                {"select": 16 << 20},  # INA: 0.1 + 1.342 < 0.17 + 2.684
                {"observe": {"g0|s1": 0.3}},
                {"select": 1_500_000},
                {"select": 0},  # zero bytes still pay INA's latency
            ],
        )
    )
    trng = random.Random(20260601)
    for k, (nl, npol, steps) in enumerate([(4, 3, 60), (10, 8, 120), (16, 16, 150)]):
        cases.append(random_case(trng, f"time_model_{k}_{npol}p", nl, npol, steps, time_model=trng))
    _write(OUT, cases)
    # Hierarchical INA.
    cases = []
    cases.append(
        run_case(
            "hier_crossover_hand",
            [
                {"install": hier_table()},
                {"select": 65536},  # flat INA: 0.01 + 0.0104858 < 0.02 + 0.0052429
                {"select": 1 << 20},  # hier: 0.02 + 0.0838861 < 0.0210486 + 0.01 + 0.1677722
                {"observe": {"a0|s1": 0.5, "s1|s2": 0.9}},
                {"select": 1 << 20},
                {"select": 0},
            ],
        )
    )
    erng, hrng = random.Random(20261123), random.Random(20261124)
    for k, (nl, npol, steps) in enumerate([(6, 3, 80), (12, 8, 120)]):
        cases.append(
            random_case(erng, f"hier_{k}_{npol}p", nl, npol, steps, time_model=hrng, hier=hrng)
        )
    _write(OUT_HIER, cases)


def _write(path: Path, cases: list[dict[str, Any]]) -> None:
    path.write_text(
        json.dumps(
            {"format": 1, "generator": "tests/vectors/gen_online_scheduler.py", "cases": cases},
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {path} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
