"""Benchmark of the policy core: ns per selection and updates per second.

Runs the C++ benchmark binary (build/csrc/bench_policy_core, built by `make cxx`) for 16 and
256 policies on 1 and 2 threads, then times the Python reference on the same 16-policy
table for scale. Target: under 100 ns per selection with 16 policies.

With the tuner plugin built it also prints ns per getCollInfo (mean, median, p99) with a
healthy segment, one republished before every call (read and parse), a garbled one, and a
stalled one (an agent killed mid-publish left the seqlock odd): first look at a new odd
value (the bounded 2 us wait) and steady state; and the agent's publish time for a typical
table and for 1 MiB. Target: a collective decided within 10 us of the segment
read, stalled segment included (`stalled_decision_within_10us`).

Usage: .venv/bin/python benchmarks/bench_policy_core.py [iterations]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.scheduler.online import OnlineScheduler  # noqa: E402

BINARY = ROOT / "build" / "csrc" / "bench_policy_core"


def python_ns_per_selection(n: int = 16, iters: int = 20000) -> float:
    links = [{"id": f"n{i}|n{i + 1}", "capacity": 12.5e9 * (1 + i % 4)} for i in range(n + 1)]
    policies = [
        {"id": i, "scheme": "ring", "links": [links[i]["id"], links[i + 1]["id"]], "cost": 0.0}
        for i in range(n)
    ]
    s = OnlineScheduler(
        {
            "group_id": "bench/0/0",
            "version": 1,
            "apply_from_seq": 0,
            "window_s": 0.001,
            "gamma": 0.5,
            "links": links,
            "policies": policies,
        }
    )
    t0 = time.perf_counter()
    for i in range(iters):
        s.select(4096 << (i & 15))
    return (time.perf_counter() - t0) / iters * 1e9


def main() -> int:
    iters = sys.argv[1] if len(sys.argv) > 1 else "2000000"
    if not BINARY.exists():
        print(f"{BINARY} is not built: run `make cxx` first", file=sys.stderr)
        return 2
    plugin = ROOT / "build" / "csrc" / "libnccl-tuner-heroserve.so"
    cmd = [str(BINARY), iters] + ([str(plugin)] if plugin.exists() else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out, end="")
    cpp16 = None
    for line in out.splitlines():
        if line.startswith("select_ns policies=16 threads=1"):
            cpp16 = float(line.rsplit("=", 1)[1])
    py = python_ns_per_selection()
    print(f"python_reference policies=16 ns_per_selection={py:.0f}")
    if cpp16:
        verdict = "meets" if cpp16 < 100 else "MISSES"
        print(f"speedup_cpp_over_python={py / cpp16:.0f}x; {verdict} the 100 ns target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
