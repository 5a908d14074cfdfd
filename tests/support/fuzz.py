"""What the fuzz tests of the command line share: a deadline that turns a hang into an
exception (:func:`deadline`), the judgement of one run (:func:`judge`), and
:func:`run_captured`, one command run in this process with its output captured. Run as
``python -m support.fuzz`` it is the driver of a child process: it reads a JSON list of
argument lists on stdin, runs each through ``heroserve`` in-process and prints a JSON list of
``[status, stderr]`` (for commands that must run in a process of their own, such as
``softswitch``, which needs the pure-Python protobuf runtime)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import sys
from collections.abc import Callable, Iterator

HANG_S = 10  # no command may spend more CPU time than this answering bad input
# ... nor wait longer than this for anything (a read from a FIFO that nobody writes): a wall
# clock bound of its own, wide, because on a loaded machine 10 s of wall time is less than
# 1 s of CPU time (a case of 1.9 CPU-s took 24.7 s at load 18)
HANG_WALL_S = 120
# A log record (agents/logs.py, text format) may precede the error line of a server command.
_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(cpu_s: float, wall_s: float = HANG_WALL_S) -> Iterator[None]:
    """Raises Hang in the body after ``cpu_s`` seconds of this process's CPU time (a loop)
    or ``wall_s`` seconds of wall time (a wait), whichever comes first."""

    def on_cpu(*_: object) -> None:
        raise Hang(f"no answer within {cpu_s} CPU-s")

    def on_wall(*_: object) -> None:
        raise Hang(f"no answer within {wall_s} s of waiting")

    old = signal.signal(signal.SIGPROF, on_cpu), signal.signal(signal.SIGALRM, on_wall)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old[0])
        signal.signal(signal.SIGALRM, old[1])


def run_captured(main: Callable[[list[str]], int], argv: list[str]) -> tuple[int | str, str]:
    """(exit status, stderr) of ``main(argv)``; an exception that escapes is the status,
    named (``"Hang: ..."``, ``"ValueError: ..."``)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline(HANG_S):
            rc: int | str = main(argv)
    except SystemExit as e:  # argparse's --help and a parser that exits by itself
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException as e:  # noqa: BLE001 - the test reports whatever escapes
        rc = f"{type(e).__name__}: {str(e)[:200]}"
    return rc, err.getvalue()


def judge(rc: int | str, err: str, valid: bool, prog: str) -> str | None:
    """What is wrong with one run, or None: no traceback; valid input exits 0, bad input
    exits 2 with one line ``prog: ...`` (after log records, for a server that started)."""
    if not isinstance(rc, int):
        return f"escaped: {rc}"
    if "Traceback" in err:
        return "traceback: " + err[-300:]
    if valid:
        return None if rc == 0 else f"valid input, exit {rc}: {err[-300:]!r}"
    if rc != 2:
        return f"bad input, exit {rc}: {err[-300:]!r}"
    lines = err.splitlines()
    if not lines or not lines[-1].startswith(prog + ":"):
        return f"exit 2 without a line from {prog}: {err[-300:]!r}"
    if any(not _LOG_LINE.match(x) for x in lines[:-1]):
        return f"exit 2 with more than one line: {err[-300:]!r}"
    return None


if __name__ == "__main__":
    from controller.cli import main as heroserve

    results = [run_captured(heroserve, argv) for argv in json.load(sys.stdin)]
    json.dump(results, sys.stdout)
