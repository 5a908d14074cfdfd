"""What the controller's store spends on collective sequence numbers: ``Store.note_seq`` (once
per telemetry selection and per held table at registration, inside the request's
transaction) and ``Store.last_seq`` (once per table when a plan is derived).

    .venv/bin/python benchmarks/bench_store_seq.py [--calls 20000] [--baseline DIR] [--repeats 2]

Each run is a child process on an in-memory store: 50 groups, 8 reporting agents each,
reports in transactions of 50 (a telemetry report's selections). ``--baseline DIR`` runs
another checkout's store the same way (before the per-agent reports: ``note_seq(group,
seq)``, one maximum per group), alternating with this one ``--repeats`` times, and prints
the ratio of the medians: the machine is shared, so only figures taken in the same minutes
compare. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import inspect, json, sys, time
from controller.service.store import Store
n = int(sys.argv[1])
s = Store(":memory:")
per_agent = "node_id" in inspect.signature(s.note_seq).parameters
t0 = time.perf_counter()
for k in range(0, n, 50):
    with s.transaction():
        for i in range(k, k + 50):
            g = f"prefill/{i % 50}/0"
            if per_agent:
                s.note_seq(g, f"n{i % 8}", 1000 + i, now=1000.0 + i * 1e-3)
            else:
                s.note_seq(g, 1000 + i)
t1 = time.perf_counter()
with s.transaction():
    for i in range(n):
        g = f"prefill/{i % 50}/0"
        s.last_seq(g, 2) if per_agent else s.last_seq(g)
t2 = time.perf_counter()
print(json.dumps({"note_seq_us": 1e6 * (t1 - t0) / n, "last_seq_us": 1e6 * (t2 - t1) / n}))
"""


def run(checkout: Path, calls: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(calls)],
        cwd=checkout,
        env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--baseline", type=Path, help="another checkout, run alternately")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for _ in range(a.repeats):
        runs["this"].append(run(ROOT, a.calls))
        if a.baseline:
            runs["baseline"].append(run(a.baseline, a.calls))
    med = {
        who: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for who, rs in runs.items()
        if rs
    }
    for who, m in med.items():
        note, last = m["note_seq_us"], m["last_seq_us"]
        print(f"{who:9} note_seq {note:7.1f} us/call   last_seq {last:7.1f} us/call")
    if "baseline" in med:
        for k in ("note_seq_us", "last_seq_us"):
            print(f"ratio this/baseline {k[:-3]}: {med['this'][k] / med['baseline'][k]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
