"""The shared log format: text and JSON, UTC with milliseconds."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from agents.logs import JsonFormatter, TextFormatter, formatter, utc_timestamp

# 2026-11-23T05:12:00.123Z, the instant 1795410720.123 s after the epoch
INSTANT = 1795410720.123


def _record(msg: str = "plan applied", **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("heroserve.controller", logging.INFO, __file__, 1, msg, None, None)
    rec.created = INSTANT
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_timestamp_is_utc_with_milliseconds_and_z() -> None:
    assert utc_timestamp(INSTANT) == "2026-11-23T05:12:00.123Z"
    assert utc_timestamp(0.0) == "1970-01-01T00:00:00.000Z"


def test_text_line_has_the_shared_fields_in_order() -> None:
    line = TextFormatter().format(_record(epoch=3, plan="a b"))
    want = '2026-11-23T05:12:00.123Z INFO heroserve.controller plan applied epoch=3 plan="a b"'
    assert line == want


def test_json_line_has_ts_level_logger_msg_and_extras() -> None:
    obj = json.loads(JsonFormatter().format(_record(epoch=3)))
    assert obj == {
        "ts": "2026-11-23T05:12:00.123Z",
        "level": "INFO",
        "logger": "heroserve.controller",
        "msg": "plan applied",
        "epoch": 3,
    }


def test_a_logger_writes_one_json_object_per_line() -> None:
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    h.setFormatter(formatter("json"))
    log = logging.getLogger("heroserve.test-logs")
    log.addHandler(h)
    log.propagate = False
    try:
        log.warning("first")
        log.error("second %d", 2, extra={"group": "decode/0/1"})
    finally:
        log.removeHandler(h)
    lines = buf.getvalue().splitlines()
    assert [json.loads(x)["msg"] for x in lines] == ["first", "second 2"]
    assert json.loads(lines[1])["group"] == "decode/0/1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", json.loads(lines[0])["ts"])


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="xml"):
        formatter("xml")


def test_the_controller_process_logs_json_lines(tmp_path: Path) -> None:
    """A real process: its records (the plan applied, the insecure-loopback warning when it
    starts listening) come out as JSON objects, one per line; a refusal is one plain line and
    nothing else (a controller that cannot start says only why)."""
    import signal
    import time

    from controller.service.sample import sample_plan, save_sample_topology

    plan = tmp_path / "plan.json"
    sample_plan().save(plan)
    topo = save_sample_topology(tmp_path / "topology.json")
    port = tmp_path / "port"
    argv = ["-m", "controller.service", "--db", str(tmp_path / "c.db"), "--plan", str(plan)]
    argv += ["--listen", "127.0.0.1:0", "--log-format", "json"]
    p = subprocess.Popen(
        [sys.executable, *argv, "--topology", str(topo), "--port-file", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not port.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    records = [json.loads(line) for line in err.splitlines()]
    assert all(r["logger"].startswith("heroserve.") for r in records)
    warnings = [r for r in records if r["level"] == "WARNING"]
    assert warnings and "insecure" in warnings[0]["msg"]
    # Without the sample topology the plan cannot be served: one plain line, exit 2.
    r = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("heroserve controller: the plan's topology is not a built-in")
