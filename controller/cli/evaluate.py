"""``heroserve evaluate --scenario NAME [--out DIR]``: the paper's §V on the project's
cluster model (Fig. 7-10 as CSV and PNG, and a note with the measured ratios)."""

from __future__ import annotations

import argparse

from controller.errors import InputError
from controller.inputs.args import (
    add_journal,
    add_ray,
    add_workers,
    bounded,
    make_dir,
    output_dir,
    seed,
)
from controller.inputs.limits import MAX_SERVERS, MAX_SIM_REQUESTS

HELP = "reproduce the paper's evaluation (Fig. 7-10) on a scenario"


def add_args(p: argparse.ArgumentParser) -> None:
    from controller.evaluation.scenarios import SCENARIOS

    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--scenario", required=True, help=" | ".join(SCENARIOS))
    p.add_argument(
        "--out", type=output_dir, default=None, help="output folder (default: eval/<scenario>)"
    )
    add_workers(p, "simulation processes")
    add_ray(p)
    add_journal(p, "journal.db in --out")
    p.add_argument(
        "--requests",
        type=bounded(int, 1, MAX_SIM_REQUESTS),
        default=None,
        help="requests per simulation point (default: those arriving in 30 request lives "
        "at the point's rate, at least 2000)",
    )
    p.add_argument(
        "--servers",
        type=bounded(int, 1, MAX_SERVERS),
        default=None,
        help="track scenarios: servers in the cluster (default 1200)",
    )
    p.add_argument(
        "--planners",
        default=None,
        help="comma-separated planners (default: heroserve and the 3 baselines)",
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    p.add_argument(
        "--online-scheduler",
        action="store_true",
        help="HeroServe's points run its online scheduler (docs/policy-table.md)",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="simulate on the fast path (no link contention; docs/simulator.md, The fast "
        "path): a 1,200-server point in about a minute",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(a: argparse.Namespace) -> int:
    from controller.cli.progress import ProgressLine
    from controller.evaluation.journal import Journal
    from controller.evaluation.run import evaluate
    from controller.evaluation.scenarios import scenario
    from controller.evaluation.sweep import Runner

    planners = tuple(x.strip() for x in a.planners.split(",")) if a.planners else None
    s = scenario(a.scenario, requests=a.requests, servers=a.servers, planners=planners)
    if s.topology != "testbed" and s.servers:
        unit = 6 if s.topology == "2tracks" else 16
        if s.servers % unit:
            raise InputError(f"--servers must be a multiple of {unit} for {s.topology}")
    if a.fast and a.online_scheduler:
        raise InputError("--fast does not run the online scheduler")
    out = make_dir(a.out or f"eval/{s.name}", "--out")
    line = None if a.quiet else ProgressLine()
    say = line or (lambda m: None)
    journal = Journal(a.journal or out / "journal.db", a.fresh)
    try:
        with Runner(a.workers, a.ray, say, journal) as runner:
            summary = evaluate(s, out, runner, say, a.seed, a.online_scheduler, a.fast)
    finally:
        journal.close()
        if line is not None:
            line.close()
    print((out / "notes.md").read_text())
    print(
        f"written to {out}/: journal.db max_rate.csv attainment.csv attainment.png latency.csv "
        f"ina_throughput.csv notes.md plans/" + (" kv_memory.csv" if s.kv_rate_per_gpu else "")
    )
    return 0 if summary else 1
