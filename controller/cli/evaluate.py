"""``heroserve evaluate --scenario NAME [--out DIR]``: the paper's §V on the project's
cluster model (Fig. 7-10 as CSV and PNG, and a note with the measured ratios)."""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.cli.config import EvaluateCommand
from controller.errors import InputError
from controller.inputs.args import add_journal, add_ray, add_workers, make_dir
from controller.inputs.flags import add_flags


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_flags(p, EvaluateCommand)
    g = p.add_argument_group("the sweep's processes and journal")
    add_workers(g, "simulation processes")
    add_ray(g)
    add_journal(g, "journal.db in --out")


JOURNAL = "journal.db"  # in --out unless --journal says otherwise


def written_files(out: Path, summary: dict, journal: str | None) -> list[str]:
    """What ``evaluate`` wrote into ``out``: the run's own files (``summary["written"]``) and
    the journal when it is there."""
    return ([] if journal else [JOURNAL]) + list(summary.get("written", []))


def run(a: argparse.Namespace) -> int:
    from controller.cli.progress import ProgressLine
    from controller.evaluation.journal import Journal
    from controller.evaluation.run import evaluate
    from controller.evaluation.scenarios import scenario
    from controller.evaluation.sweep import Runner
    from controller.topology.generators import TRACK_CLUSTERS

    planners = tuple(a.planners) if a.planners else None
    s = scenario(a.scenario, requests=a.requests, servers=a.servers, planners=planners)
    if s.topology in TRACK_CLUSTERS and s.servers:
        unit = TRACK_CLUSTERS[s.topology][0]
        if s.servers % unit:
            raise InputError(f"--servers must be a multiple of {unit} for {s.topology}")
    if a.fast and a.online_scheduler:
        raise InputError("--fast does not run the online scheduler")
    out = make_dir(a.out or f"eval/{s.name}", "--out")
    journal = Journal(a.journal or out / JOURNAL, a.fresh)
    # after every check that may refuse the command: the heartbeat thread ends in `finally`
    line = None if a.quiet else ProgressLine()
    say = line or (lambda m: None)
    try:
        with Runner(a.workers, a.ray, say, journal) as runner:
            summary = evaluate(s, out, runner, say, a.seed, a.online_scheduler, a.fast)
    finally:
        journal.close()
        if line is not None:
            line.close()
    print((out / "notes.md").read_text())
    print(f"written to {out}/: " + " ".join(written_files(out, summary, a.journal)))
    return 0 if summary else 1
