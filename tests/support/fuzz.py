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

HANG_S = 10  # no command may take longer to answer bad input
# A log record (agents/logs.py, text format) may precede the error line of a server command.
_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def fire(*_: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


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
