"""Start-up cost of the ``heroserve`` command line: CPU seconds (user plus system, of the child
process alone, from ``os.wait4``) of ``--help``, ``validate --help``, ``validate FILE`` (a
built-in topology exported to a file, and a small plan) and a testbed plan, beside a bare
``python -c pass`` measured in the same run (and ``import networkx``, which ``validate FILE``
needs: it checks a topology as the graph every command builds). The median of ``--runs``
runs of each; the table gives the ratio to the bare interpreter and the difference from it.
It measures, it never asserts (tests/controller/cli/test_startup.py checks what the light
commands import).

    .venv/bin/python benchmarks/startup.py [--runs 5]

Run from the repository root: the command is ``python -m controller.cli``, so the code of
this checkout is what runs, whatever ``heroserve`` script is installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "controller.cli"]


def cpu_s(argv: list[str]) -> float:
    """CPU seconds (user + system) of one run of ``argv``, output discarded; a run that fails
    stops the benchmark (a failing command's time means nothing)."""
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=null, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[1:])}: exit {proc.returncode}: {err.decode()[-400:]}")
    return usage.ru_utime + usage.ru_stime


def inputs(folder: Path) -> tuple[Path, Path]:
    """A topology file (the testbed exported) and a small plan (heroserve's on it)."""
    topo, plan = folder / "testbed.json", folder / "plan.json"
    out = subprocess.run([*CLI, "topology", "export", "testbed"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    topo.write_text(out)
    subprocess.run([*CLI, "plan", "--topology", "testbed", "--planner", "heroserve", "--quiet",
                    "--json", str(plan)], cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    return topo, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each command; the median is kept")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        topo, plan = inputs(Path(tmp))
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            # what validate FILE needs whatever it does: a topology is checked as its graph
            "python -c 'import networkx'": [sys.executable, "-c", "import networkx"],
            "heroserve --help": [*CLI, "--help"],
            "heroserve validate --help": [*CLI, "validate", "--help"],
            "heroserve plan --help": [*CLI, "plan", "--help"],
            "heroserve validate TOPOLOGY.json": [*CLI, "validate", str(topo)],
            "heroserve validate PLAN.json": [*CLI, "validate", str(plan)],
            "heroserve plan --topology testbed --planner heroserve --quiet": [
                *CLI,
                "plan",
                "--topology",
                "testbed",
                "--planner",
                "heroserve",
                "--quiet",
            ],  # fmt: skip
        }
        times = {name: [] for name in cases}
        for _ in range(max(1, a.runs)):  # interleaved, so a burst of load hits every case
            for name, argv in cases.items():
                times[name].append(cpu_s(argv))
    bare = statistics.median(times["python -c pass"])
    width = max(map(len, cases))
    print(f"CPU seconds (user+sys of the child), median of {max(1, a.runs)} runs\n")
    print(f"{'command':<{width}}  {'CPU s':>7}  {'x bare':>7}  {'- bare':>7}")
    print(f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 7}")
    for name, ts in times.items():
        m = statistics.median(ts)
        ratio = m / bare if bare > 0 else float("inf")
        print(f"{name:<{width}}  {m:7.3f}  {ratio:7.1f}  {m - bare:+7.3f}")


if __name__ == "__main__":
    main()
