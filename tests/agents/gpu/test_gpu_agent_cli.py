"""heroserve-gpu-agent as a command: options (getopt_long), errors, --help, --version, the
loopback rule and the log format shared with Python.

The agent runs against a closed loopback port, so it only starts, fails to register, logs
and retries; nothing listens. Skipped when the C++ build (`make cxx`) is absent.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import tomllib

import pytest
from support import ROOT

AGENT = ROOT / "build" / "csrc" / "heroserve-gpu-agent"
TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"

pytestmark = pytest.mark.skipif(not AGENT.exists(), reason="C++ GPU agent not built (make cxx)")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENT), *args], capture_output=True, text=True, timeout=10)


def logs_until(args: list[str], needle: str, timeout: float = 10.0) -> list[str]:
    """Starts the agent, waits until a stderr line holds `needle`, stops it (SIGTERM, exit 0)
    and returns its stderr lines."""
    p = subprocess.Popen([str(AGENT), *args], stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    end = time.monotonic() + timeout
    try:
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            if needle in line or time.monotonic() > end:
                break
    finally:
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=10)
    assert p.returncode == 0, lines
    assert any(needle in x for x in lines), lines
    return lines + (rest or "").splitlines()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--controller HOST:PORT is required"),
        (["--controller", "127.0.0.1:1"], "--node-id NODE is required"),
        (["--controller=127.evil.example:5", "--node-id=x"], "without TLS"),
        (["--controller", "10.1.2.3:50051", "--node-id", "x"], "without TLS"),
        (["--controller", "127.0.0.1", "--node-id", "x"], "has no :PORT"),
        (["--controller", "127.0.0.1:99999", "--node-id", "x"], "from 1 to 65535"),
        (["--controller", "::1:5", "--node-id", "x"], "[ADDRESS]:PORT"),
        (["--controller", "127.0.0.1:1", "--node-id", "x", "--tls-ca", "a.pem"], "all of"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--telemetry-interval=-1"], "(0, 3600]"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--telemetry-interval=nan"], "(0, 3600]"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--shm-capacity=1e6"], "whole number"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--shm-capacity=100"], "from 4096"),
        # One byte past the payload limit (shm.h kMaxPayloadBytes, 4 MiB): capacity no
        # payload can use is refused.
        (["--controller=127.0.0.1:1", "--node-id=x", "--shm-capacity=4194305"], "to 4194304"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--gpu=g0:abc"], "CUDA index"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--gpu=:1"], "GPU id is empty"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--log-format=xml"], "text or json"),
        (["--controller=127.0.0.1:1", "--node-id=x", "--log-level=loud"], "DEBUG, INFO"),
        (["--bogus"], "unknown or ambiguous option --bogus"),
        (["--insecure=yes"], "--insecure takes no value"),
        (["--controller"], "--controller needs a value"),
        (["--controller", "127.0.0.1:1", "--node-id", "x", "stray"], "unexpected argument"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode == 2, (args, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr  # one line naming the problem, not the whole usage
    assert lines[0].startswith("heroserve-gpu-agent: error: "), lines
    assert message in lines[0], lines
    assert r.stdout == ""


def test_help_shows_every_option_with_its_default() -> None:
    r = run("--help")
    assert r.returncode == 0 and r.stderr == ""
    for opt in ("--controller", "--node-id", "--gpu", "--tls-ca", "--tls-server-name",
                "--insecure", "--nvlink-peer", "--telemetry-interval", "--shm-capacity",
                "--log-format", "--log-level", "--version"):  # fmt: skip
        assert opt in r.stdout, opt
    assert "(default: 1048576)" in r.stdout  # --shm-capacity
    assert "(default: text)" in r.stdout and "(default: INFO)" in r.stdout
    assert "--opt=VALUE" in r.stdout


def test_version_is_the_projects() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout == f"heroserve-gpu-agent {version}\n"


def test_opt_equals_value_and_loopback_forms_are_accepted() -> None:
    """--opt=value parses like --opt value; [::1] and localhost count as loopback."""
    for controller in ("[::1]:1", "localhost:1", "127.3.4.5:1"):
        lines = logs_until(
            [f"--controller={controller}", "--node-id=srv-x", "--telemetry-interval=0.5"],
            "cannot register",
        )
        assert any("on loopback" in x for x in lines), lines


def test_insecure_flag_allows_a_remote_name_and_says_so() -> None:
    lines = logs_until(
        ["--controller", "127.evil.example:5", "--node-id", "x", "--insecure"], "cannot register"
    )
    warning = [x for x in lines if "insecure (no TLS)" in x]
    assert warning and "on loopback" not in warning[0], lines


def python_record(ts: str, level: str, logger: str, msg: str):  # noqa: ANN201
    """The LogRecord the Python side would have made at that instant (agents/logs.py), or
    None where that module is not on this branch yet."""
    try:
        import agents.logs  # noqa: F401
    except ImportError:
        return None
    import calendar
    import logging

    r = logging.LogRecord(logger, getattr(logging, level), "", 0, msg, None, None)
    r.created = calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(ts[20:23]) / 1e3
    return r


def test_text_log_lines_use_the_shared_format() -> None:
    lines = logs_until(["--controller=127.0.0.1:1", "--node-id=x"], "cannot register")
    for line in lines:
        m = re.fullmatch(rf"({TS}) (DEBUG|INFO|WARNING|ERROR) (heroserve\.gpu-agent) (.+)", line)
        assert m, line
        r = python_record(*m.groups())
        if r is not None:
            from agents.logs import TextFormatter

            assert TextFormatter().format(r) == line
    assert any(" WARNING heroserve.gpu-agent insecure (no TLS)" in x for x in lines)
    assert any(" ERROR heroserve.gpu-agent cannot register" in x for x in lines)


def test_json_log_lines_are_what_the_python_formatter_writes() -> None:
    lines = logs_until(
        ["--controller=127.0.0.1:1", "--node-id=x", "--log-format=json"], "cannot register"
    )
    records = [json.loads(x) for x in lines]
    for rec in records:
        assert list(rec) == ["ts", "level", "logger", "msg"], rec
        assert re.fullmatch(TS, rec["ts"]) and rec["logger"] == "heroserve.gpu-agent"
    for line, rec in zip(lines, records, strict=True):
        r = python_record(rec["ts"], rec["level"], rec["logger"], rec["msg"])
        if r is not None:  # the same record formatted by Python: identical bytes
            from agents.logs import JsonFormatter

            assert JsonFormatter().format(r) == line


def test_log_level_filters() -> None:
    lines = logs_until(
        ["--controller=127.0.0.1:1", "--node-id=x", "--log-level=error"], "cannot register"
    )
    assert lines and all(" ERROR " in x for x in lines), lines
