"""The progress line (controller/cli/progress.py): counts read from plain-word messages, one
updating line on a terminal, few lines in a log."""

from __future__ import annotations

import io
import threading

from controller.cli.progress import ProgressLine, fraction


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_fraction_reads_the_first_sane_count() -> None:
    assert fraction("prefill: candidate 3/20 TP=4 PP=2") == (3, 20)
    assert fraction("latency at fixed rates: 12/12 simulations (40 so far)") == (12, 12)
    assert fraction("ratio 1/0 then 5/4 then 2/9") == (2, 9)  # 1/0 and 5/4 are no progress
    assert fraction("planning with heroserve") is None


def test_a_log_gets_a_few_lines_not_hundreds(monkeypatch) -> None:  # noqa: ANN001
    clock = Clock()
    monkeypatch.setattr("controller.cli.progress.time.perf_counter", clock)
    out = io.StringIO()
    line = ProgressLine(out, tty=False, interval_s=10.0, heartbeat_s=None)
    line("  planning with heroserve")
    for k in range(1, 301):  # 300 counted messages over 30 s
        clock.t = k * 0.1
        line(f"  prefill: candidate {k}/300 TP=4")
    line.close()
    lines = out.getvalue().splitlines()
    # the phase message, then one counted line per 10 s (at 0.1 s, 10.1 s, 20.1 s) and the last
    assert lines == [
        "[    0.0s] planning with heroserve",
        "[    0.1s] prefill: candidate 1/300 TP=4",
        "[   10.1s] prefill: candidate 101/300 TP=4",
        "[   20.1s] prefill: candidate 201/300 TP=4",
        "[   30.0s] prefill: candidate 300/300 TP=4",
    ]


def test_on_a_terminal_one_line_shows_the_count() -> None:
    out = io.StringIO()
    line = ProgressLine(out, tty=True)
    line("planning with heroserve")
    line("decode: candidate 3/8 TP=8 PP=1")
    bar = line._bar
    assert bar is not None and (bar.n, bar.total) == (3, 8)
    line("decode: candidate 8/8 TP=8 PP=2")
    assert (bar.n, bar.total) == (8, 8)
    line("prefill: candidate 1/5 TP=1 PP=1")  # a new count restarts the bar
    assert (bar.n, bar.total) == (1, 5)
    line.close()
    text = out.getvalue()
    assert "\n" not in text.rstrip("\n")  # redrawn in place with \r, never a new line
    assert "candidate 3/8" in text and "3/8 [" in text


class Watched(io.StringIO):
    """A stream that wakes whoever waits for a text to be written (no sleeps in tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.cond = threading.Condition()

    def write(self, s: str) -> int:
        with self.cond:
            n = super().write(s)
            self.cond.notify_all()
            return n

    def wait_for(self, text: str, timeout: float = 60.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: text in self.getvalue(), timeout)


def test_the_heartbeat_thread_speaks_when_a_stage_runs_past_the_period() -> None:
    clock, out = Clock(), Watched()
    line = ProgressLine(out, tty=False, heartbeat_s=10.0, clock=clock)
    try:
        line("planner 2/5: distserve")
        line("prefill: TP=4 PP=3 on 384 GPUs")
        clock.t = 9.9  # within the period: nothing to add
        assert not line.heartbeat()
        clock.t = 12.0  # past it: the thread, woken, says where the run stands
        line.poke()
        assert out.wait_for("still working")
    finally:
        line.close()
    last = out.getvalue().splitlines()[-1]
    assert last == (
        "[   12.0s] still working: planner 2/5: distserve running for 12 s; "
        "last: prefill: TP=4 PP=3 on 384 GPUs"
    )


def test_a_stage_line_always_prints_and_the_heartbeat_estimates_what_is_left() -> None:
    clock, out = Clock(), io.StringIO()
    line = ProgressLine(out, tty=False, heartbeat_s=10.0, clock=clock)
    line._thread = None  # driven by hand below: no thread to race the fake clock
    line._closed = True
    clock.t = 65.0
    line("planner 3/5: distserve-paper")
    line("decode: pod 2/10")  # the count starts at 2 at 65 s
    clock.t = 73.0
    line("decode: pod 6/10")  # rate-limited: within interval_s of the first counted line
    clock.t = 85.0
    assert line.heartbeat()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[   65.0s] planner 3/5: distserve-paper (1 min 5 s into the run)"
    # 4 pods in 20 s since the count started: the 4 left take 20 s at that pace
    assert lines[-1] == (
        "[   85.0s] still working: planner 3/5: distserve-paper running for 20 s; "
        "last: decode: pod 6/10; about 20 s left at this pace"
    )
    assert not line.heartbeat()  # it just spoke


def test_notes_print_nothing_until_a_heartbeat_quotes_them() -> None:
    # a small cluster's plan: its stage and steps kept quietly, shown only past the period
    clock, out = Clock(), io.StringIO()
    line = ProgressLine(out, tty=False, heartbeat_s=10.0, clock=clock)
    line._thread, line._closed = None, True  # driven by hand
    line.note("planner 1/5: heroserve")
    line.note("decode: TP=8 PP=1 on 16 GPUs")
    clock.t = 9.0
    assert not line.heartbeat() and out.getvalue() == ""
    clock.t = 10.0
    assert line.heartbeat()
    assert out.getvalue() == (
        "[   10.0s] still working: planner 1/5: heroserve running for 10 s; "
        "last: decode: TP=8 PP=1 on 16 GPUs\n"
    )


def test_a_refused_command_leaves_no_heartbeat_thread(capsys) -> None:
    """A plan refused after its progress line started (a model that does not fit) must stop
    the heartbeat thread: left running, it printed into a closed stream after the command."""
    import threading

    from controller.cli import main

    before = set(threading.enumerate())
    assert (
        main(["plan", "--topology", "fig2", "--model", "OPT-175B", "--planner", "heroserve"]) == 2
    )
    assert "does not fit" in capsys.readouterr().err
    assert [t for t in set(threading.enumerate()) - before if t.name == "progress"] == []
