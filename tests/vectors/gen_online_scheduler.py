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
    rng: random.Random, name: str, n_links: int, n_policies: int, steps: int
) -> dict[str, Any]:
    group = "prefill/0/0"
    t1 = random_table(rng, n_links, n_policies, 1, 0, group)
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
