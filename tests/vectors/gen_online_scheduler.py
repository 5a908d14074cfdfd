"""Generate tests/vectors/online_scheduler.json from the Python reference scheduler.

The file is shared by tests/test_online_scheduler.py and csrc/tests/test_vectors.cc: the C++
policy core must reproduce every choice exactly and every cost within 1e-9 relative.

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
) -> dict[str, Any]:
    """``time_model``: give the tables latency_s / bandwidth fields drawn from this generator
    (a separate one, so the cases without them stay as they were)."""
    group = "prefill/0/0"
    t1 = random_table(rng, n_links, n_policies, 1, 0, group)
    if time_model is not None:
        t1 = with_time_model(time_model, t1)
    events: list[dict[str, Any]] = [{"install": t1}]
    version = 1
    link_ids = [lk["id"] for lk in t1["links"]]
    for step in range(steps):
        r = rng.random()
        if r < 0.75:
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
    OUT.write_text(
        json.dumps(
            {"format": 1, "generator": "tests/vectors/gen_online_scheduler.py", "cases": cases},
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
