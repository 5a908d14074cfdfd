"""heroserve-gpu-agent's environment fallback: HEROSERVE_CONTROLLER and HEROSERVE_TLS_* stand
in for absent flags, flags win, a bad value is refused naming the variable (exit 2).
Skipped when the C++ build is absent."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import ROOT

AGENT = ROOT / "build" / "csrc" / "heroserve-gpu-agent"
pytestmark = pytest.mark.skipif(not AGENT.exists(), reason="C++ GPU agent not built (make cxx)")
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("HEROSERVE_")}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(AGENT), "--node-id", "n1", *args],
        capture_output=True, text=True, timeout=10, env={**CLEAN, **env},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "args", "says"),
    [
        ({"HEROSERVE_CONTROLLER": "127.0.0.1:99999"}, (), "HEROSERVE_CONTROLLER '127.0.0.1:99999'"),
        ({"HEROSERVE_CONTROLLER": "a:1\x1bb"}, (), "HEROSERVE_CONTROLLER: control characters"),
        # the variable stands in for the flag: an off-loopback address needs TLS
        ({"HEROSERVE_CONTROLLER": "10.0.0.1:5"}, (), "refusing to talk to 10.0.0.1:5"),
        # the flag wins over the variable
        ({"HEROSERVE_CONTROLLER": "127.0.0.1:1"}, ("--controller", "10.0.0.2:5"), "10.0.0.2:5"),
        ({"HEROSERVE_TLS_CA": "/x.pem"}, ("--controller", "127.0.0.1:1"), "HEROSERVE_TLS_CA"),
        ({}, (), "--controller HOST:PORT is required (or HEROSERVE_CONTROLLER)"),
    ],
)
def test_variables_stand_in_for_absent_flags(
    env: dict[str, str], args: tuple[str, ...], says: str
) -> None:
    r = run(env, *args)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
