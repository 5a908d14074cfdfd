"""Resolve a command line's ``--workload``: a generator's name (``chatbot``,
``summarization``) or a trace file (``.csv``, ``.json``). Holds :func:`resolve_workload` and
:func:`plan_workload` (what a plan's own ``workload`` field may name: a generator only)."""

from __future__ import annotations

from pathlib import Path

from controller.errors import InputError
from controller.workload.base import Workload
from controller.workload.generators import WORKLOADS
from controller.workload.traces import load_trace


def resolve_workload(spec: str, seed: int = 0) -> Workload:
    """The workload ``spec`` names: a generator's (sampled with ``seed``) or a trace file's;
    InputError for anything else."""
    if spec in WORKLOADS:
        return WORKLOADS[spec](seed=seed)
    if Path(spec).suffix in (".csv", ".json"):
        return load_trace(spec)
    raise InputError(f"unknown workload {spec!r}: use chatbot, summarization or a .csv/.json trace")


def plan_workload(spec: str, seed: int = 0) -> Workload:
    """The generator a plan's own ``workload`` field names. A plan never opens a file
    (docs/design.md §9): the trace of a plan made on one is given with ``--workload``.
    The InputError does not quote the field (it is the plan's content)."""
    if spec in WORKLOADS:
        return WORKLOADS[spec](seed=seed)
    raise InputError(
        f"the plan's workload is not a generator ({', '.join(WORKLOADS)}): a plan never opens "
        "a file; give the trace with --workload"
    )
