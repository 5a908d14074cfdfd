"""``heroserve fidelity``: write docs/fidelity.md, the paper's claims beside the project's
figures (``controller/evaluation/fidelity.py`` computes them); ``--section ablation``
rewrites only the ablation section of an existing report (``evaluation/ablation_report.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.errors import InputError
from controller.inputs.args import (
    add_journal,
    add_ray,
    add_workers,
    bounded,
    input_dir,
    output_file,
    write_text,
)
from controller.inputs.limits import MAX_SIM_REQUESTS


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = "the paper's claims beside the project's figures (docs/fidelity.md)"
    p.add_argument(
        "--out",
        type=output_file,  # checked now, not after the report's minutes of work
        default="fidelity.md",
        # not docs/fidelity.md: a run must not overwrite the repository's report unasked,
        # and an installed wheel has no docs/ beside the working directory
        help="where to write the report (the repository's is docs/fidelity.md)",
    )
    p.add_argument(
        "--eval-dir",
        type=input_dir,
        default="eval",
        help="where `heroserve evaluate` wrote its scenarios",
    )
    p.add_argument(
        "--servers",
        type=bounded(int, 16, 1200),
        default=1200,  # the size docs/fidelity.md reports, and the paper's Figs. 7-8
        help="servers of the track clusters (a multiple of their unit: 6 and 16)",
    )
    p.add_argument("--quick", action="store_true", help="the testbed only")
    add_workers(p, "processes planning the scenarios and simulating the ablation's plans")
    add_ray(p)
    add_journal(p, "beside --out, named after it: fidelity-journal.db")
    p.add_argument(
        "--sim-requests",
        type=bounded(int, 1, MAX_SIM_REQUESTS),
        default=None,
        help="the ablation simulates a plan only if a point at its predicted rate runs at "
        "most this many requests (default: the report's own, SIM_REQUESTS of "
        "controller/evaluation/fidelity.py)",
    )
    p.add_argument(
        "--requests",
        type=bounded(int, 1, MAX_SIM_REQUESTS),
        default=None,
        help="requests of each ablation point's first run, doubled while the max-rate rule is "
        "undecided (default: the scenario's, as `heroserve evaluate` runs them); fewer make "
        "a quick check, not the report's figures",
    )
    p.add_argument(
        "--section",
        choices=["ablation"],
        default=None,
        help="rewrite only this section of the report already at --out",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(a: argparse.Namespace) -> int:
    from controller.cli.progress import ProgressLine
    from controller.evaluation.ablation_report import section_span
    from controller.evaluation.fidelity import SIM_REQUESTS, ablation_only, report
    from controller.evaluation.journal import Journal
    from controller.evaluation.sweep import Runner

    sim_requests = a.sim_requests or SIM_REQUESTS
    out = Path(a.out)
    old = None
    if a.section:  # read before the minutes of work, so a missing report fails at once
        try:
            old = out.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"--out: cannot read {out}: {type(e).__name__}") from None
        section_span(old)  # a report without the section fails now, not after the work
    journal = Journal(a.journal or out.with_name(f"{out.stem}-journal.db"), a.fresh)
    # after every check that may refuse the command: the heartbeat thread ends in `finally`
    line = None if a.quiet else ProgressLine()  # stages and a heartbeat (cli/progress.py)
    say = line or (lambda m: None)
    if len(journal):  # --fresh has emptied it
        say(f"fidelity: {len(journal)} finished jobs in {journal.path}; those of this command "
            "on this code are read back (--fresh runs them all)")  # fmt: skip
    try:
        with Runner(a.workers, a.ray, say, journal) as runner:
            if old is not None:
                text = ablation_only(old, a.servers, a.quick, say, runner, sim_requests, a.requests)
            else:
                text = report(
                    a.servers, Path(a.eval_dir), a.quick, say, runner, sim_requests, a.requests
                )
    finally:
        journal.close()
        if line is not None:
            line.close()
    write_text(out, text, "--out")
    print(f"written to {a.out}")
    return 0
