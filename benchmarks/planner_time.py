"""Planning time and peak memory of the HeroServe planner on the testbed and on the 2tracks
and 8tracks 1200-server clusters (9,600 GPUs each). Prints wall times, their ratio to the
testbed's, and the process's peak resident memory. Targets: testbed < 1 s, each
track cluster < 60 s, memory < 4 GiB.

    .venv/bin/python benchmarks/planner_time.py [--skip-large]
"""

from __future__ import annotations

import argparse
import resource
import time

from controller.models import model_spec
from controller.planner import plan
from controller.topology import testbed
from controller.topology.generators import eight_tracks, two_tracks
from controller.workload import chatbot, default_sla


def timed(label: str, make, model: str, scale: str) -> float:
    t0 = time.perf_counter()
    g = make()
    t1 = time.perf_counter()
    p = plan(g, model_spec(model), chatbot(), default_sla("chatbot", scale))
    t2 = time.perf_counter()
    print(
        f"{label:>10}: build {t1 - t0:6.2f} s, plan {t2 - t1:7.2f} s "
        f"(TP/PP prefill {p.prefill.tp}x{p.prefill.pp}, decode {p.decode.tp}x{p.decode.pp}, "
        f"{p.predicted.gpus_used} GPUs, H {p.predicted.rate:.3f} req/s, "
        f"{p.predicted.rate_per_gpu:.4f} req/s per GPU)"
    )
    return t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-large", action="store_true")
    a = ap.parse_args()
    small = min(timed("testbed", testbed, "OPT-66B", "testbed") for _ in range(3))
    print(f"testbed best of 3: {small:.2f} s (target < 1 s)")
    if not a.skip_large:
        for label, make in (("2tracks", two_tracks), ("8tracks", eight_tracks)):
            large = timed(label, make, "OPT-175B", "large")
            print(
                f"{label}: {large:.1f} s (target < 60 s; the paper reports ~600 s), "
                f"{large / small:.0f}x the testbed"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak resident memory: {peak:.2f} GiB (target < 4 GiB)")


if __name__ == "__main__":
    main()
