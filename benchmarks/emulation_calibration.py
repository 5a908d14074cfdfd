"""Calibration of the cost model against the emulation (docs/emulation.md, "Calibration").

    sudo .venv/bin/python benchmarks/emulation_calibration.py [--slowdown K]
        [--bytes N,N,...] [--repeat R] [--topology testbed]

Runs ``heroserve emulate`` once (one bring-up, every size) and prints, for each group of the
plan it makes that aggregates in the network (flat INA, hierarchical), a Markdown table:
measured INA and ring times beside the cost model's predictions for the same emulated links,
and the ratio INA/ring measured against predicted. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slowdown", default="100000")
    p.add_argument("--bytes", default="16384,65536,262144,1048576")
    p.add_argument("--repeat", default="3")
    p.add_argument("--topology", default="testbed")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "controller.cli", "emulate", "--topology", a.topology,
               "--slowdown", a.slowdown, "--bytes", a.bytes, "--repeat", a.repeat,
               "--json", str(out)]  # fmt: skip
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        print(r.stdout)
        if r.returncode or not out.exists():
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        got = json.loads(out.read_text())
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    groups = sorted({(m["group"], m["scheme"]) for m in got if m["scheme"] in ("ina", "hier")})
    for group, scheme in groups:
        by = {(m["scheme"], m["nbytes"]): m for m in got if m["group"] == group}
        print(f"group {group} ({scheme}), slowdown {a.slowdown}, {a.repeat} repeats, "
              f"commit {commit}\n")  # fmt: skip
        print(f"| bytes | {scheme} meas. ms | {scheme} pred. ms | ring meas. ms | ring pred. ms "
              f"| {scheme}/ring meas. | {scheme}/ring pred. | meas./pred. {scheme} "
              "| meas./pred. ring |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for nbytes in sorted({n for _, n in by}):
            agg, ring = by.get((scheme, nbytes)), by.get(("ring", nbytes))
            if not agg or not ring:
                continue
            mi, pi = agg["seconds"], agg["predicted_s"]
            mr, pr = ring["seconds"], ring["predicted_s"]
            print(
                f"| {nbytes} | {mi * 1e3:.1f} | {pi * 1e3:.1f} | {mr * 1e3:.1f} | {pr * 1e3:.1f} "
                f"| {mi / mr:.2f} | {pi / pr:.2f} | {mi / pi:.2f} | {mr / pr:.2f} |"
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
