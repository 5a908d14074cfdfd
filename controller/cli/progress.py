"""One updating progress line for long work (planning a large cluster, evaluation sweeps).

Long work reports plain-word messages through a callback (``Problem.progress`` of the
planners, ``Runner(progress=...)`` of the sweeps), e.g. ``"prefill: candidate 3/20 TP=4
PP=2 (9600 GPUs)"``. :class:`ProgressLine` is such a callback. On a terminal it keeps one
line (tqdm) showing the latest message, and when the message says how far it is (``k/N``)
a bar, the count and the time left. Elsewhere (a log file, CI) it prints the messages as
lines with the elapsed time, those carrying a ``k/N`` count at most once every
``interval_s`` seconds (and always the last, ``N/N``), so a log gets a few lines, not
hundreds.
"""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

from tqdm import tqdm

_FRACTION = re.compile(r"\b(\d+)/(\d+)\b")
NOT_TTY_INTERVAL_S = 10.0  # a log line per 10 s of counted work is enough to see it move
_COUNTED = "{desc} {bar:16} {n}/{total} [{elapsed}<{remaining}]"
_UNCOUNTED = "{desc} [{elapsed}]"


def fraction(msg: str) -> tuple[int, int] | None:
    """The first ``k/N`` in ``msg`` with 0 <= k <= N and N > 0, else None."""
    for m in _FRACTION.finditer(msg):
        k, n = int(m.group(1)), int(m.group(2))
        if n > 0 and 0 <= k <= n:
            return k, n
    return None


class ProgressLine:
    """A progress callback: ``line("message k/N ...")``; :meth:`close` when done."""

    def __init__(
        self,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float = NOT_TTY_INTERVAL_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s
        self.t0 = time.perf_counter()
        self._last_counted = -float("inf")
        self.printed = 0  # lines written when not on a terminal
        self._bar: tqdm | None = None
        if self.tty:
            self._bar = tqdm(
                total=None, file=self.stream, bar_format=_UNCOUNTED, leave=False, dynamic_ncols=True
            )

    def __call__(self, msg: str) -> None:
        msg = " ".join(msg.split())  # one line, whatever the caller's indentation
        frac = fraction(msg)
        if self._bar is not None:
            self._show(msg, frac)
            return
        now = time.perf_counter()
        if frac is not None:
            last = frac[0] == frac[1]
            if not last and now - self._last_counted < self.interval_s:
                return
            self._last_counted = now
        print(f"[{now - self.t0:7.1f}s] {msg}", file=self.stream, flush=True)
        self.printed += 1

    def _show(self, msg: str, frac: tuple[int, int] | None) -> None:
        bar = self._bar
        assert bar is not None
        if frac is None:
            bar.bar_format = _UNCOUNTED
        else:
            k, n = frac
            if bar.total != n or k < bar.n:  # a new count starts: restart its clock
                bar.reset(total=n)
            bar.bar_format = _COUNTED
            bar.n = k
        bar.set_description_str(msg, refresh=False)
        bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
