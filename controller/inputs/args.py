"""Command-line values: argparse types that check ranges and paths, shared by every command,
and a parser that reports a bad argument in one line (exit 2) instead of usage text.

Bounds come from ``controller/inputs/limits.py`` and are shown in the error, so a user sees
what is allowed: ``argument --rate: must be at most 1000000, got 1e+300``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from controller.errors import InputError
from controller.inputs.limits import MAX_PARALLEL, MAX_SEED, MAX_SWEEP_WORKERS
from controller.inputs.schema import lower_bound, number


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises InputError for a bad command line, so the command prints one
    line ``prog: error: <what>`` and returns 2 (no usage block: ``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see {self.prog} --help)")


def bounded(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
) -> Callable[[str], int | float]:
    """An argparse type: a finite ``kind`` (int or float) in ``[low, high]`` (``(low, high]``
    with ``low_open``). An int may be written 1e6 when it is whole."""

    def parse(s: str) -> int | float:
        try:
            v: int | float = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {s}")
        if kind is int:
            try:
                v = int(s)
            except ValueError:
                if not float(s).is_integer():
                    raise argparse.ArgumentTypeError(f"must be an integer, got {s}") from None
                v = int(float(s))
        if low is not None and (v <= low if low_open else v < low):
            raise argparse.ArgumentTypeError(f"must be {lower_bound(low, low_open, kind)}, got {s}")
        if high is not None and v > high:
            raise argparse.ArgumentTypeError(f"must be at most {number(high)}, got {s}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


seed = bounded(int, 0, MAX_SEED)


def add_workers(p: argparse.ArgumentParser, what: str) -> None:
    """``--workers``: how many processes simulate (1 to MAX_SWEEP_WORKERS, default every
    core); ``what`` says what they simulate, in the help."""
    p.add_argument(
        "--workers",
        type=bounded(int, 1, MAX_SWEEP_WORKERS),
        default=os.cpu_count() or 1,
        help=f"{what} (default: every core)",
    )


def add_ray(p: argparse.ArgumentParser) -> None:
    """``--ray``: run the command's jobs on a Ray cluster instead of local processes."""
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the sweep on a Ray cluster ('local' starts one here); needs heroserve[ray]",
    )


def add_journal(p: argparse.ArgumentParser, where: str) -> None:
    """``--journal`` and ``--fresh``: where the command keeps the jobs it finished, so that
    run again after a crash it goes on from them (``evaluation.journal``); ``where`` is the
    default's description, in the help."""
    p.add_argument(
        "--journal",
        metavar="FILE",
        default=None,
        help=f"SQLite file of the finished jobs, read back when the same command runs again "
        f"on the same code (default: {where})",
    )
    p.add_argument(
        "--fresh", action="store_true", help="forget the journal's jobs and run every job"
    )


def parallelism(s: str) -> tuple[int, int]:
    """``TPxPP``, e.g. ``4x2``: both in [1, MAX_PARALLEL]."""
    try:
        tp, pp = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not TPxPP, e.g. 4x2") from None
    if not (1 <= tp <= MAX_PARALLEL and 1 <= pp <= MAX_PARALLEL):
        raise argparse.ArgumentTypeError(f"TP and PP must be in 1..{MAX_PARALLEL} in {s!r}")
    return tp, pp


def _writable_dir(d: Path, missing: str) -> None:
    """``d`` is a folder this process may create files in (``missing``: what to say when it
    is not there)."""
    if not d.exists():
        raise argparse.ArgumentTypeError(missing)
    if not d.is_dir():
        raise argparse.ArgumentTypeError(f"{str(d)!r} is not a directory")
    if not os.access(d, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {str(d)!r} is not writable")


def _named(s: str) -> None:
    """``s`` names a path: '' would be the current folder (``Path('')`` is ``.``), which no
    one asks for by giving nothing."""
    if not s:
        raise argparse.ArgumentTypeError("an empty path")


def output_file(s: str) -> str:
    """A file the command will write: its folder exists and is writable, and the path is not
    a folder. Checked when the command line is read, not after minutes of work."""
    _named(s)
    p = Path(s)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} is a directory, not a file")
    if p.is_fifo() or p.is_socket():  # opening a FIFO to write waits for a reader for ever
        raise argparse.ArgumentTypeError(f"{s!r} is a FIFO or socket, not a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise argparse.ArgumentTypeError(f"{s!r} is not writable")
    _writable_dir(p.parent, f"directory {str(p.parent)!r} does not exist")
    return s


def input_dir(s: str) -> str:
    """A folder the command reads if it is there (a missing one is no input): never a file,
    a FIFO or a device, which would be read as if it were the folder's absence."""
    p = Path(s)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} exists and is not a directory")
    return s


def output_dir(s: str) -> str:
    """A folder the command will create (with its parents) or write into: the nearest
    existing ancestor is a writable folder."""
    _named(s)
    p = Path(s)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{s!r} exists and is not a directory")
    probe = p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    _writable_dir(probe, f"{str(probe)!r} does not exist")
    return s


def make_dir(path: str | Path, what: str) -> Path:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"{what}: cannot create directory {str(p)!r} ({e.strerror or e})"
        ) from None
    return p


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write an output file; a failure (disk full, a folder removed meanwhile) is one line."""
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise InputError(f"{what}: cannot write {str(path)!r} ({e.strerror or e})") from None


def report_error(prog: str, e: BaseException) -> int:
    """The one line a bad input gets; returns the exit status 2."""
    print(f"{prog}: error: {e}", file=sys.stderr)
    return 2
