"""``heroserve fidelity``: write docs/fidelity.md, the paper's claims beside the project's
figures (``controller/evaluation/fidelity.py`` computes them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from controller.inputs.args import bounded, output_file, write_text

HELP = "write docs/fidelity.md: the paper's claims beside the project's"


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = "the paper's claims beside the project's figures (docs/fidelity.md)"
    p.add_argument(
        "--out",
        type=output_file,  # checked now, not after the report's minutes of work
        default="docs/fidelity.md",
        help="where to write the report",
    )
    p.add_argument(
        "--eval-dir", default="eval", help="where `heroserve evaluate` wrote its scenarios"
    )
    p.add_argument(
        "--servers",
        type=bounded(int, 16, 1200),
        default=48,
        help="servers of the track clusters (a multiple of their unit: 6 and 16)",
    )
    p.add_argument("--quick", action="store_true", help="the testbed only")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(a: argparse.Namespace) -> int:
    from controller.evaluation.fidelity import report

    def say(m: str) -> None:
        if not a.quiet:
            print(m, file=sys.stderr, flush=True)

    text = report(a.servers, Path(a.eval_dir), a.quick, say)
    write_text(Path(a.out), text, "--out")
    print(f"written to {a.out}")
    return 0
