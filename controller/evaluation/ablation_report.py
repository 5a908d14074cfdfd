"""docs/fidelity.md's ablation section: every scenario's ablation rows (``evaluation.ablation``),
predicted and simulated (``evaluation.ablation_sim``), and per scenario a line that names the
steps that move H, generated from the same figures so it claims no more than the table.

``heroserve fidelity --section ablation`` rewrites this section alone in an existing report
(``replace_section``): the rest of the report takes about a quarter of an hour.

Holds ``HEADING``, ``section``, ``section_span`` and ``replace_section``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from controller.errors import InputError
from controller.evaluation.ablation import STEPS, Row, ablation
from controller.evaluation.ablation_sim import (
    REL_TOL,
    SAME,
    SEEDS,
    Job,
    SimCell,
    ablation_problem,
    simulate,
)
from controller.evaluation.maxrate import MAX_DOUBLINGS
from controller.evaluation.scenarios import LIVES, MIN_REQUESTS, scenario
from controller.evaluation.sweep import Runner

HEADING = "## Where the ratio comes from: one change at a time"
PRED_TOL = 0.005  # a predicted ratio this close to 1 is reported as no change


def _x(v: float | None) -> str:
    return f"{v:.3f}x" if v is not None else "-"


def _sim_h(c: SimCell) -> str:
    if c.rate is None:
        return c.why
    cap = f"; {c.capped} point(s) undecided at the cap" if c.capped else ""
    return f"{c.rate:.4g} ({c.rate_min:.4g}-{c.rate_max:.4g}{cap})"


def _sim_x(v: float | None, ci: tuple[float, float] | None, verdict: str) -> str:
    """A simulated ratio with its interval and verdict (``maxrate.compare``)."""
    if v is None or ci is None:
        return "-"
    if verdict == SAME:
        return "1.000x (same deployment)"
    return f"{v:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}] {verdict}"


def _sim_moves(c: SimCell) -> bool:
    return c.previous_verdict in ("gain", "loss")


def _moves(v: float | None, tol: float) -> bool:
    return v is not None and abs(v - 1.0) > tol


def _summary(name: str, rows: Sequence[Row], cells: Sequence[SimCell]) -> str:
    """One line: the rows whose H moves (predicted beyond ``PRED_TOL``, or simulated with an
    interval that excludes 1), then the others by what is known of them: no change either
    way, the predicted one only (not simulated), neither."""
    moved, still, predicted_only, unknown = [], [], [], []
    for i, (r, c) in enumerate(zip(rows, cells, strict=True)):
        if i == 0:
            continue
        tag = r.name if i < len(STEPS) else f"{r.name} (against the full planner)"
        if _moves(r.vs_previous, PRED_TOL) or _sim_moves(c):
            moved.append(f"{tag}: {_x(r.vs_previous)} predicted, "
                         f"{_sim_x(c.vs_previous, c.previous_ci, c.previous_verdict)} "
                         "simulated")  # fmt: skip
        elif r.vs_previous is None:
            unknown.append(tag)
        elif c.vs_previous is None:
            predicted_only.append(tag)
        else:
            still.append(tag)
    full, sim = rows[len(STEPS) - 1], cells[len(STEPS) - 1]
    out = (f"- **{name}**: DistServe to HeroServe {_x(full.vs_distserve)} predicted, "
           f"{_sim_x(sim.vs_distserve, sim.distserve_ci, sim.distserve_verdict)} "
           "simulated. ")  # fmt: skip
    out += ("Moves H: " + "; ".join(moved) + ". " if moved
            else "No row moves H beyond the tolerances where its ratio is known. ")  # fmt: skip
    if still:
        out += ("No change, predicted (within the tolerance) and simulated (no difference "
                "or the same deployment): " + ", ".join(still) + ". ")  # fmt: skip
    if predicted_only:
        out += (f"Within {PRED_TOL:.1%} predicted, not simulated: "
                + ", ".join(predicted_only) + ". ")  # fmt: skip
    if unknown:
        out += "No ratio (a side without a plan): " + ", ".join(unknown) + "."
    return out.rstrip()


def _job(case: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One scenario's ablation rows (scenario name, overrides that size its cluster),
    planned here, as ``Job.to_dict`` writes them: ``Runner.call`` plans scenarios on separate
    cores and keeps the results in its journal."""
    name, over = case
    s = scenario(name, **over)
    fixed = {**over, "fixed_roles": True} if s.topology == "testbed" else None
    rows = ablation(s.cluster(), s.model_spec(), s.load(), s.sla(),
                    fixed_roles=scenario(name, **fixed).cluster() if fixed else None)  # fmt: skip
    per_row = [over] * len(rows)
    if fixed:
        per_row[-1] = fixed
    return Job(name, rows, per_row).to_dict()


def section(
    cases: Sequence[tuple[str, dict[str, Any]]],
    runner: Runner,
    max_requests: int,
    say: Callable[[str], None] = lambda m: None,
    command: str = "heroserve fidelity",
    requests: int | None = None,
) -> list[str]:
    """The section's lines for ``cases`` (scenario name, overrides that size its cluster):
    each scenario's rows planned, then every distinct deployment simulated in one sweep;
    ``requests``: the requests of a point's first run where the cases' overrides set them
    (for the text; None: the scenario's own, ``Scenario.requests_at``)."""
    t0 = time.perf_counter()
    say(
        f"fidelity 2/2: the ablation's plans of {len(cases)} scenarios on {runner.workers} "
        "worker(s)"
    )
    where = f"{runner.journal.path}" if runner.journal is not None else "an ablation job"
    docs = runner.call(_job, list(cases), "fidelity: ablations planned", ablation_problem)
    jobs = [Job.from_dict(d, where) for d in docs]
    cells = simulate(jobs, runner, max_requests, say)
    first = (f"{requests:,} requests (`--requests`)" if requests else
             f"the requests arriving in {LIVES} request lives at its rate, at least "
             f"{MIN_REQUESTS:,}, as `heroserve evaluate` runs them")  # fmt: skip
    out = [f"{HEADING}\n"]
    out.append(
        "From DistServe's search to HeroServe's, each row adding one change to the row above "
        "(controller/evaluation/ablation.py); then the full planner with the other INA lane "
        "format and, on the testbed, with the paper's fixed role split, whose ratios are "
        "against the full planner's row. *H* is the predicted H of Eq. 1 (pipelined mode). "
        "*simulated H* is the largest total rate (req/s) at which the step's plan meets the "
        "SLA's attainment (90%) in the simulator: the mean over seeds "
        f"{', '.join(map(str, SEEDS))}, with their minimum and maximum in brackets, each "
        "seed's rate found on its own by the rule of controller/evaluation/maxrate.py (rates "
        "doubled from the predicted H until a miss, then bisected until the bracket is within "
        f"{REL_TOL:.0%}; a rate meets the target only when the 95% Wilson interval of the "
        "attainment of the later half of the run's requests lies above it and the run, "
        "carried on at the slope between its halves to the cap's length, neither falls below "
        "it nor outgrows the SLA's bounds; it misses when the interval lies below, and "
        f"otherwise runs again with twice the requests, up to {2**MAX_DOUBLINGS}x its first "
        f"run's ({first}), where the interval alone decides and one still "
        "holding the target counts as a miss; the online scheduler off, so "
        "every group runs the scheme its plan chose). A simulated ratio is the ratio of the "
        "means, with the interval every seed's bracket allows (the smallest lo over the "
        "largest hi, to the largest hi over the smallest lo): a *gain* or a *loss* only when "
        "that interval excludes 1, else *no difference*. Rows whose plans are the same "
        "deployment share one search (*same deployment*, exactly 1). A step whose points "
        f"would run more than {max_requests:,} requests at its predicted H is not simulated "
        "(its cell says so; `--sim-requests` sets the budget).\n"
    )
    out.append(
        "| scenario | step | H (req/s) | GPUs | vs the row above | vs distserve | "
        "simulated H (req/s) | simulated vs the row above | simulated vs distserve |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for job, cs in zip(jobs, cells, strict=True):
        for r, c in zip(job.rows, cs, strict=True):
            h = f"{r.rate:.4g}" if r.rate is not None else "no plan"
            if r.plan is not None and r.plan.time_limit_reached:
                h += " (time limit)"  # the best the step's search found within the limit
            prev = _sim_x(c.vs_previous, c.previous_ci, c.previous_verdict)
            ds = _sim_x(c.vs_distserve, c.distserve_ci, c.distserve_verdict)
            out.append(f"| {job.scenario} | {r.name} | {h} | {r.gpus or '-'} | "
                       f"{_x(r.vs_previous)} | {_x(r.vs_distserve)} | {_sim_h(c)} | "
                       f"{prev} | {ds} |")  # fmt: skip
    out.append(
        f"\nWhat each step contributes (a predicted ratio within {PRED_TOL:.1%} of 1 and a "
        "simulated one whose interval holds 1 count as no change):\n"
    )
    out += [_summary(job.scenario, job.rows, cs) for job, cs in zip(jobs, cells, strict=True)]
    took = time.perf_counter() - t0
    out.append(f"\n*This section: {took:.0f} s of wall time, {runner.done} simulations on "
               f"{runner.workers} worker(s){runner.resumed()}, by `{command}`.*\n")  # fmt: skip
    return out


def section_span(text: str) -> tuple[int, int]:
    """Where the ablation section of ``text`` (a report) starts and ends; InputError if it
    has none."""
    start = text.find(f"\n{HEADING}\n")
    if start < 0:
        raise InputError("--out has no ablation section to replace; run without --section")
    end = text.find("\n## ", start + 1)
    return start + 1, len(text) if end < 0 else end


def replace_section(text: str, lines: Sequence[str]) -> str:
    """``text`` (a report) with its ablation section replaced by ``lines``."""
    start, end = section_span(text)
    return text[:start] + "\n".join(lines) + text[end:]
