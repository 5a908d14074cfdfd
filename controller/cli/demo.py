"""``heroserve demo`` (docs/emulation.md): bring up controller, switches and agents on this
machine (the cluster ``heroserve emulate`` builds, links unshaped), show a plan arriving at
every agent, the policy tables in shared memory and the switches' entries, and take it all
down on exit, on an error or on Ctrl-C."""

from __future__ import annotations

import argparse
import time

from controller.cli.emulate import (
    common_args,
    failures_reported,
    prepare,
    report_leftovers,
    setup_logging,
    start_cluster,
)
from controller.inputs.args import bounded


def add_args(p: argparse.ArgumentParser) -> None:
    common_args(p)
    p.add_argument(
        "--hold",
        type=bounded(float, 0.0, 86400.0),
        default=0.0,
        help="seconds to keep the cluster up after showing it; Ctrl-C ends it (default: 0)",
    )


def run(a: argparse.Namespace) -> int:
    return failures_reported("demo", _demo, a)


def _demo(a: argparse.Namespace) -> int:
    from agents.gpu.shmview import describe, read_segment
    from controller.emulate.cluster import SHM_DIR, handle_signals

    setup_logging(a)
    g, spec, plan, notes = prepare(a, 1.0)
    print(f"demo {spec.tag}: topology {g.name}; links unshaped")
    for n in notes:
        print(n)
    with handle_signals(), start_cluster(a, g, spec, plan) as c:
        for note in c.notes:
            print(note)
        st = c.state()
        print(f"\ncontroller {c.controller_addr}: epoch {st.epoch}, plan {st.plan_id[:12]}")
        for ag in sorted(st.agents, key=lambda x: x.identity.node_id):
            kind = "switch" if ag.identity.kind == 1 else "gpu"
            print(f"  {kind:6} agent {ag.identity.node_id:10} acknowledged epoch {ag.acked_epoch}")
        print("\npolicy tables in shared memory (GPU agents -> NCCL tuner plugin):")
        for name, size in c.shm_segments():
            seen = describe(read_segment(SHM_DIR / name))
            print(f"  /dev/shm/{name}  {size} bytes: {seen}")
        for s, d in sorted(c.switch_entries().items()):
            groups: dict[int, list[int]] = {}
            for key, _act, params in d["aggregation_table"]:
                groups.setdefault(key[0], []).append(params[0])
            # worker_port: each worker bound to its ingress port, where the data plane has it
            bound = f", {len(d['worker_port'])} worker_port" if "worker_port" in d else ""
            print(f"\nswitch {s} ({c.net.p4runtime(s)}): {len(d['l2_forward'])} l2_forward, "
                  f"{len(d['result_rewrite'])} result_rewrite{bound} entries")  # fmt: skip
            for gid, slots in sorted(groups.items()):
                ports = d["multicast_groups"].get(str(gid), [])
                print(f"  INA group {gid}: {len(slots)} aggregation entries, slots "
                      f"{min(slots)}..{max(slots)}, results to ports {ports}")  # fmt: skip
        print("\n/metrics (heroserve_*):")
        for line in c.metrics().splitlines():
            if line.startswith("heroserve_") and "_created" not in line:
                print("  " + line)
        if a.hold:
            print(f"\nholding for {a.hold:g}s (Ctrl-C ends it)")
            time.sleep(a.hold)
    return report_leftovers(spec.tag)
