"""Mutation check of the planner's guarantees: break each rule on purpose, run the tests that
guard it, and print whether a test failed (the mutant is killed) or not (it survived).

Each mutant is one textual change to a copy of ``controller/`` (the repository itself is never
touched): the union of HeroServe's and DistServe's candidates, the server-packed second start
of HeroServe's grouping, the Ethernet-only fallback of NVLink-relayed flat INA, Eq. 6's min
over receivers, the hierarchical-INA option and the direction of Eq. 17's penalty. A copy
without any change runs first and must pass; the script exits 1 when that baseline fails or
any mutant survives.

    .venv/bin/python benchmarks/mutants.py [--tests tests/controller/planner/...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUARANTEES = "tests/controller/planner/test_planner_guarantees.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository
    before: str  # must occur exactly once
    after: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "candidates without DistServe's (no union)",
        "controller/planner/search.py",
        "return sorted(set(out) | set(local), key=",
        "return sorted(set(out), key=",
        (f"{GUARANTEES}::test_heroserve_candidates_contain_distservices",),
    ),
    Mutant(
        "grouping without the packed second start",
        "controller/planner/heroserve.py",
        "        [reps[i : i + per] for i in range(0, len(reps), per)],\n    ]",
        "    ]",
        (f"{GUARANTEES}::test_heroserve_grouping_never_worse_than_the_packed_order",),
    ),
    Mutant(
        "flat INA without the Ethernet-only fallback",
        "controller/planner/allreduce.py",
        "        if self.ctx.policy.ina_relay:\n            q = ina_pattern(self.ctx.eth_fabric",
        "        if False:\n            q = ina_pattern(self.ctx.eth_fabric",
        (f"{GUARANTEES}::test_flat_ina_never_above_the_ethernet_only_routes",),
    ),
    Mutant(
        "Eq. 6 as max-max",
        "controller/planner/pipeline.py",
        "return float(np.min(np.max(lat + slope * nbytes, axis=0)))",
        "return float(np.max(np.max(lat + slope * nbytes, axis=0)))",
        (f"{GUARANTEES}::test_pipeline_hop_is_min_over_receivers_of_max_over_senders",),
    ),
    Mutant(
        "hierarchical INA never priced",
        "controller/planner/allreduce.py",
        "            if self.ctx.policy.hier:\n",
        "            if False:\n",
        (
            "tests/controller/planner/test_planner.py::test_cross_server_groups_take_ina_when_cheaper",
        ),
    ),
    Mutant(
        "Eq. 17 penalty as W(c, c*), not W(c*, c)",
        "controller/scheduler/online.py",
        "                self.costs[i] = self.costs[i] + dstar * row[i]",
        "                self.costs[i] = self.costs[i] + dstar * self.penalty[i][best]",
        ("tests/controller/scheduler/test_online_scheduler.py::test_select_hand_worked",),
    ),
)


def _copy(dst: Path) -> None:
    for part in ("controller", "tests"):
        shutil.copytree(ROOT / part, dst / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def _run(tree: Path, tests: list[str]) -> tuple[bool, float]:
    """True when every test passed; and the seconds it took."""
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    return r.returncode == 0, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", nargs="*", default=None, help="run these instead of each guard")
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="heroserve-mutants-") as tmp:
        tree = Path(tmp)
        _copy(tree)
        every = sorted({t for m in MUTANTS for t in m.tests})
        ok, secs = _run(tree, a.tests or every)
        print(f"{'baseline (no mutant)':45s} {'passes' if ok else 'FAILS':8s} {secs:6.1f} s")
        bad += not ok
        for m in MUTANTS:
            src = tree / m.path
            text = src.read_text()
            if text.count(m.before) != 1:
                print(f"{m.name:45s} {'STALE':8s} (its text is not in {m.path} exactly once)")
                bad += 1
                continue
            src.write_text(text.replace(m.before, m.after))
            try:
                ok, secs = _run(tree, a.tests or list(m.tests))
            finally:
                src.write_text(text)
            print(f"{m.name:45s} {'SURVIVED' if ok else 'killed':8s} {secs:6.1f} s")
            bad += ok
    print(f"{len(MUTANTS)} mutants, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
