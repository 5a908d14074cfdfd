"""The agents' and ``heroserve admin``'s environment fallback (docs/control-plane.md,
"Environment"): ``HEROSERVE_CONTROLLER`` and ``HEROSERVE_TLS_CERT``/``_KEY``/``_CA`` stand in
for absent flags, a flag wins, and a bad value is refused naming the variable."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.pki import CA

from agents.client import add_tls_args, controller_from_args, tls_from_args
from agents.cliutil import UsageError
from controller.cli import main


def _args(*argv: str, default: str | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--controller")
    add_tls_args(p)
    a = p.parse_args(argv)
    a.controller_default = default
    return a


def _pki(tmp_path: Path, ca: CA) -> dict[str, str]:
    cert, key = ca.issue("s1").write(tmp_path, "s1")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    return {"HEROSERVE_TLS_CERT": cert, "HEROSERVE_TLS_KEY": key,
            "HEROSERVE_TLS_CA": str(tmp_path / "ca.crt")}  # fmt: skip


def test_controller_flag_wins_over_the_variable_which_wins_over_the_default() -> None:
    env = {"HEROSERVE_CONTROLLER": "10.0.0.1:7000"}
    assert controller_from_args(_args("--controller", "10.0.0.2:7001"), env) == "10.0.0.2:7001"
    assert controller_from_args(_args(default="127.0.0.1:50051"), env) == "10.0.0.1:7000"
    assert controller_from_args(_args(default="127.0.0.1:50051"), {}) == "127.0.0.1:50051"
    assert controller_from_args(_args(default="x:1"), {"HEROSERVE_CONTROLLER": ""}) == "x:1"
    with pytest.raises(UsageError, match="--controller or HEROSERVE_CONTROLLER"):
        controller_from_args(_args(), {})  # the switch agent: no default


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("10.0.0.1:99999", "HEROSERVE_CONTROLLER '10.0.0.1:99999': port 99999"),
        ("nohost", "HEROSERVE_CONTROLLER 'nohost' is not HOST:PORT"),
        ("a:1\nforged", "HEROSERVE_CONTROLLER"),
    ],
)
def test_a_bad_controller_variable_is_named(value: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        controller_from_args(_args(default="127.0.0.1:1"), {"HEROSERVE_CONTROLLER": value})


def test_tls_files_come_from_the_variables(tmp_path: Path, ca: CA) -> None:
    env = _pki(tmp_path, ca)
    tls = tls_from_args(_args(), env)
    assert tls is not None and tls.ca == ca.pem
    assert tls.names == ("HEROSERVE_TLS_CERT", "HEROSERVE_TLS_KEY", "HEROSERVE_TLS_CA")
    # a flag wins over its variable, the others still come from theirs
    other = tmp_path / "other.crt"
    other.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    tls = tls_from_args(_args("--tls-ca", str(other)), env)
    assert tls is not None and tls.ca == other.read_bytes()
    assert tls.names[2] == "--tls-ca"
    assert tls_from_args(_args(), {}) is None


def test_bad_tls_variables_are_named(tmp_path: Path, ca: CA) -> None:
    env = _pki(tmp_path, ca)
    with pytest.raises(ValueError, match=r"missing --tls-key \(or HEROSERVE_TLS_KEY\)"):
        tls_from_args(_args(), {k: v for k, v in env.items() if k != "HEROSERVE_TLS_KEY"})
    with pytest.raises(ValueError, match="HEROSERVE_TLS_CA '/nonexistent.pem': cannot open"):
        tls_from_args(_args(), {**env, "HEROSERVE_TLS_CA": "/nonexistent.pem"})


def test_admin_refuses_bad_variables_in_one_line(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HEROSERVE_CONTROLLER", "127.0.0.1:70000")
    assert main(["admin", "state"]) == 2
    err = capsys.readouterr().err
    assert "HEROSERVE_CONTROLLER '127.0.0.1:70000'" in err and len(err.splitlines()) == 1
    monkeypatch.setenv("HEROSERVE_CONTROLLER", "127.0.0.1:1")
    for k, v in _pki(tmp_path, ca).items():
        monkeypatch.setenv(k, v)
    (tmp_path / "junk.key").write_bytes(b"secret-not-a-key")
    monkeypatch.setenv("HEROSERVE_TLS_KEY", str(tmp_path / "junk.key"))
    assert main(["admin", "state"]) == 2
    err = capsys.readouterr().err
    assert "HEROSERVE_TLS_KEY: not an unencrypted PEM private key" in err
    assert "secret" not in err and len(err.splitlines()) == 1


def _switch_agent(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    # its own process: p4runtime-shell needs the pure-Python protobuf chosen before import
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HEROSERVE_")}
    args = [sys.executable, "-m", "agents.switch.main", "--switch", "127.0.0.1:9559"]
    return subprocess.run([*args, "--device-id", "1", *argv], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("env", "argv", "says"),
    [
        ({}, (), "--controller or HEROSERVE_CONTROLLER"),
        ({"HEROSERVE_CONTROLLER": "1.2.3.4:0"}, (), "HEROSERVE_CONTROLLER '1.2.3.4:0': port 0"),
        # the flag wins over the bad variable; then the TLS variable is checked and named
        ({"HEROSERVE_CONTROLLER": "1.2.3.4:0", "HEROSERVE_TLS_CA": "/none.pem"},
         ("--controller", "1.2.3.4:5"), "missing --tls-cert (or HEROSERVE_TLS_CERT)"),
    ],
)  # fmt: skip
def test_switch_agent_takes_the_variables(
    env: dict[str, str], argv: tuple[str, ...], says: str
) -> None:
    pytest.importorskip("p4runtime_sh", reason="p4runtime-shell is installed apart")
    r = _switch_agent(env, *argv)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
