"""The progress line (controller/cli/progress.py): counts read from plain-word messages, one
updating line on a terminal, few lines in a log."""

from __future__ import annotations

import io

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
    line = ProgressLine(out, tty=False, interval_s=10.0)
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
