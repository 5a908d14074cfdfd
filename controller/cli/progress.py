"""One updating progress line for long work (planning a large cluster, evaluation sweeps).

Long work reports plain-word messages through a callback (``Problem.progress`` of the
planners, ``Runner(progress=...)`` of the sweeps), e.g. ``"prefill: candidate 3/20 TP=4
PP=2 (9600 GPUs)"``. :class:`ProgressLine` is such a callback. On a terminal it keeps one
line (tqdm) showing the latest message, and when the message says how far it is (``k/N``)
a bar, the count and the time left. Elsewhere (a log file, CI) it prints the messages as
lines with the elapsed time, those carrying a ``k/N`` count at most once every
``interval_s`` seconds (and always the last, ``N/N``), so a log gets a few lines, not
hundreds.

A message of the form ``"planner 3/5: distserve-paper"`` (``STAGE``: words, a count, a colon)
starts a stage: it is always printed, with how long the run has taken, and its count is the
run's, not the stage's work. While a stage runs, a heartbeat thread prints at least every
10 s (after ``heartbeat_s``, 8 by default, of silence) a line saying which stage is running,
for how long, the latest message, and, when that message counts (``k/N``), the time left at
the pace the count has kept since it started (``heartbeat``). On a terminal the heartbeat
redraws the line instead. The clock is injectable (``clock``) so that tests advance time by hand.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

_FRACTION = re.compile(r"\b(\d+)/(\d+)\b")
NOT_TTY_INTERVAL_S = 10.0  # a log line per 10 s of counted work is enough to see it move
# the bound (#41) is a line at least every 10 s; the thread looks once a second and
# under a load of 29 on 2 cores woke up to 1.1 s late (2tracks-96, 10.1-11.1 s between
# heartbeats at 10 s), so it speaks after 8 s of silence
HEARTBEAT_S = 8.0
_POLL_S = 1.0  # the heartbeat thread looks this often; it prints only past heartbeat_s
STAGE = re.compile(r"^[A-Za-z][\w -]* (\d+)/(\d+): ")
_COUNTED = "{desc} {bar:16} {n}/{total} [{elapsed}<{remaining}]"
_UNCOUNTED = "{desc} [{elapsed}]"


def fraction(msg: str) -> tuple[int, int] | None:
    """The first ``k/N`` in ``msg`` with 0 <= k <= N and N > 0, else None."""
    for m in _FRACTION.finditer(msg):
        k, n = int(m.group(1)), int(m.group(2))
        if n > 0 and 0 <= k <= n:
            return k, n
    return None


def _span(s: float) -> str:
    """``s`` seconds as people read them: 42 s, 3 min 5 s, 1 h 02 min."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class ProgressLine:
    """A progress callback: ``line("message k/N ...")``; :meth:`close` when done. Stage
    messages (``STAGE``) and the heartbeat are described in the module docstring;
    ``heartbeat_s=None`` runs no heartbeat thread."""

    def __init__(
        self,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float = NOT_TTY_INTERVAL_S,
        heartbeat_s: float | None = HEARTBEAT_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s
        self._clock = clock
        self.t0 = self._now()
        self._last_counted = -float("inf")
        self.printed = 0  # lines written when not on a terminal
        self._lock = threading.RLock()  # the caller's thread and the heartbeat's write
        self._stage: str | None = None
        self._stage_t0 = self.t0
        self._latest: str | None = None  # the stage's latest message
        self._count: tuple[int, int, float] | None = None  # the count's (k0, N, start)
        self._frac: tuple[int, int] | None = None
        self._last_out = self.t0  # when a line was last written (or the bar redrawn)
        self._bar: tqdm | None = None
        if self.tty:
            self._bar = tqdm(
                total=None, file=self.stream, bar_format=_UNCOUNTED, leave=False, dynamic_ncols=True
            )
        self.heartbeat_s = heartbeat_s
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if heartbeat_s is not None:
            self._thread = threading.Thread(target=self._beat_loop, name="progress", daemon=True)
            self._thread.start()

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.perf_counter()

    def __call__(self, msg: str) -> None:
        msg = " ".join(msg.split())  # one line, whatever the caller's indentation
        with self._lock:
            now = self._now()
            if self.note(msg):
                self._emit(now, f"{msg} ({_span(now - self.t0)} into the run)")
                return
            frac = self._frac
            if self._bar is not None:
                self._show(msg, frac)
                self._last_out = now
                return
            if frac is not None:
                last = frac[0] == frac[1]
                if not last and now - self._last_counted < self.interval_s:
                    return
                self._last_counted = now
            self._emit(now, msg)

    def note(self, msg: str) -> bool:
        """Keep ``msg`` for the heartbeat without printing it: a stage message (``STAGE``)
        as the stage (True), any other as the stage's latest, its count's pace starting
        when the count does. Alone, it keeps detail (a planner's steps on a small cluster)
        that only a stage running long should show."""
        msg = " ".join(msg.split())
        with self._lock:
            now = self._now()
            if STAGE.match(msg):
                self._stage, self._stage_t0 = msg, now
                self._latest, self._count, self._frac = None, None, None
                return True
            self._latest, self._frac = msg, fraction(msg)
            if self._frac is not None:
                k, n = self._frac
                if self._count is None or self._count[1] != n or k < self._count[0]:
                    self._count = (k, n, now)
            return False

    def _emit(self, now: float, text: str) -> None:
        self._last_out = now
        if self._bar is not None:
            self._bar.set_description_str(text, refresh=False)
            self._bar.bar_format = _UNCOUNTED
            self._bar.refresh()
            return
        print(f"[{now - self.t0:7.1f}s] {text}", file=self.stream, flush=True)
        self.printed += 1

    def heartbeat(self) -> bool:
        """Print where the run stands if nothing was written for ``heartbeat_s``: the stage
        and how long it has run, the latest message, the time left when it counts. True
        when it printed. The heartbeat thread calls it; tests call it with a fake clock."""
        with self._lock:
            now = self._now()
            if self.heartbeat_s is None or now - self._last_out < self.heartbeat_s:
                return False
            parts = []
            if self._stage is not None:
                parts.append(f"{self._stage.rstrip()} running for {_span(now - self._stage_t0)}")
            else:
                parts.append(f"running for {_span(now - self.t0)}")
            if self._latest is not None:
                parts.append(f"last: {self._latest}")
            left = self.left(now)
            if left is not None:
                parts.append(f"about {_span(left)} left at this pace")
            self._emit(now, "still working: " + "; ".join(parts))
            return True

    def left(self, now: float) -> float | None:
        """Seconds the latest count needs at the pace it has kept since it started, or None
        when it has not moved (or no count is running)."""
        if self._frac is None or self._count is None:
            return None
        k, n = self._frac
        k0, _, start = self._count
        if k <= k0 or now <= start:
            return None
        return (n - k) * (now - start) / (k - k0)

    def _beat_loop(self) -> None:
        while not self._closed:
            self._wake.wait(_POLL_S)
            self._wake.clear()
            if not self._closed:
                self.heartbeat()

    def poke(self) -> None:
        """Wake the heartbeat thread now (tests: after advancing the fake clock)."""
        self._wake.set()

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
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
