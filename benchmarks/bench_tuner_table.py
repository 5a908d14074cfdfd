"""getCollInfo's latency when the writer of a group's segment pads its table (csrc/README.md,
"Shared memory": the payload limit ``kMaxPayloadBytes``).

Prints, first, the source of the limit: the largest payload the controller can produce, 4
versions (the GPU agent keeps 4) of a table with 3 policies (``build_tables``: the planned
scheme, flat INA, ring) for a 128-GPU group (the catalog's largest TP is 96, its heads) with
8-node routes and every id at ``MAX_ID_CHARS``. Then runs build/csrc/bench_tuner_table
against this build's tuner plugin: median and p99 ns per AllReduce decision with a normal
table, the same table republished with new bytes before each decision, and a valid table
padded with blanks to 1 MiB, to the limit and to 256 MiB, republished with new bytes before
each decision, each with ratios against the normal table in the same run. ``--baseline
PLUGIN`` runs the same cases against another build of the plugin (e.g. main's, before the
limit) for comparison.

Usage: .venv/bin/python benchmarks/bench_tuner_table.py [--decisions N] [--baseline PLUGIN]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.inputs.limits import MAX_ID_CHARS  # noqa: E402

BUILD = ROOT / "build" / "csrc"
BINARY = BUILD / "bench_tuner_table"
PLUGIN = BUILD / "libnccl-tuner-heroserve.so"
VERSIONS_KEPT = 4  # csrc/agent/daemon.cc kKeepVersions
SCHEMES = ("hier", "ina", "ring")  # controller/service/tables.py build_tables: 3 at most
LARGEST_GROUP = 128  # GPUs: above the model catalog's largest TP (OPT-175B, 96 heads)
ROUTE_NODES = 8  # GPU, NVLink switch, NIC, leaf, spine, core, ... to the aggregation switch


def _node(kind: str, i: int) -> str:
    return f"{kind}{i}-".ljust(MAX_ID_CHARS, "x")


def largest_payload_bytes() -> int:
    """Bytes of the largest payload the controller can produce (the limit's source)."""
    gpus = [_node("gpu", i) for i in range(LARGEST_GROUP)]
    hops = [_node(f"n{h}-", 0) for h in range(ROUTE_NODES - 1)]
    chain = {f"{hops[h]}|{hops[h + 1]}" for h in range(len(hops) - 1)}
    links = sorted({f"{g}|{hops[0]}" for g in gpus} | chain)

    def table(version: int) -> dict:
        policies = [
            {
                "id": i,
                "scheme": s,
                "switch": hops[-1] if s == "ina" else "",
                "links": links,
                "paths": {g: [g, *hops] for g in gpus},
                "cost": 0.123456789012345,
                "latency_s": 1.234567890123e-05,
                "bandwidth": 123456789012.345,
            }
            for i, s in enumerate(SCHEMES)
        ]
        return {
            "group_id": "decode/1023/15",
            "version": version,
            "apply_from_seq": 123456789,
            "window_s": 1.0,
            "gamma": 0.5,
            "links": [{"id": lk, "capacity": 123456789012.5} for lk in links],
            "policies": policies,
            "utilisation": {lk: 0.123456789 for lk in links},
        }

    doc = {
        "writer_generation": "3f9c0a1e77d2b845",
        "tables": [table(v) for v in range(VERSIONS_KEPT)],
    }
    return len(json.dumps(doc))


def run(plugin: Path, decisions: int) -> str:
    cmd = [str(BINARY), str(plugin), str(decisions)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decisions", type=int, default=2000, help="decisions per normal case")
    ap.add_argument("--baseline", type=Path, help="another build of the plugin to compare")
    args = ap.parse_args()
    if args.decisions < 10:
        print("--decisions must be at least 10", file=sys.stderr)
        return 2
    for path in (BINARY, PLUGIN):
        if not path.exists():
            print(f"{path} is not built: run `make cxx` first", file=sys.stderr)
            return 2
    if args.baseline and not args.baseline.is_file():
        print(f"--baseline {args.baseline}: not a file", file=sys.stderr)
        return 2
    largest = largest_payload_bytes()
    print(
        f"largest_controller_payload_bytes={largest} ({largest / 2**20:.2f} MiB: "
        f"{VERSIONS_KEPT} versions x {len(SCHEMES)} policies x {LARGEST_GROUP} GPUs x "
        f"{ROUTE_NODES}-node routes, ids of {MAX_ID_CHARS} characters)"
    )
    print(f"# this build ({PLUGIN})")
    print(run(PLUGIN, args.decisions), end="")
    if args.baseline:
        print(f"# baseline ({args.baseline})")
        print(run(args.baseline, args.decisions), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
