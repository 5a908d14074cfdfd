"""Command lines that used to exit 0 (or 1) with nonsense: each is refused in one
line, exit 2, naming the problem, and writes nothing. The CLI fuzz draws the same values at
random (test_cli_fuzz.py); here every one runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.cli import main
from tests.controller.export.test_export import hand_plan


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("nonsense")
    plan = d / "plan.json"
    hand_plan().save(plan)
    unknown = d / "unknown.json"
    unknown.write_text(json.dumps({**json.loads(plan.read_text()), "model": "NoSuch-1B"}))
    (d / "empty.pem").write_bytes(b"")
    (d / "bin.pem").write_bytes(bytes(range(256)) * 4)
    (d / "dir").mkdir()
    return {"plan": str(plan), "unknown": str(unknown), "d": str(d)}


CASES = [
    # (argv with {plan}, {unknown}, {d}; what the line says)
    (["plan", "--topology", "fig2", "--model", "", "--quiet"], "unknown model ''"),
    (["plan", "--model", "", "--quiet"], "unknown model ''"),  # used to plan the default
    (["export", "--plan", "{plan}", "--format", "vllm", "--out", ""], "--out: an empty path"),
    (["pki", "init", ""], "an empty path"),
    (["pki", "issue", "", "--name", "n"], "an empty path"),
    (["export", "--plan", "{plan}", "--format", "vllm", "--out", "{d}/o", "--tuner-plugin", ""],
     "--tuner-plugin ''"),
    (["export", "--plan", "{plan}", "--format", "sglang", "--out", "{d}/o", "--address",
      "srv0=10.0.0.1", "--address", "srv0=10.0.0.2"], "srv0 was given an address already"),
    (["export", "--plan", "{plan}", "--format", "vllm", "--out", "{d}/o", "--address",
      "srv0=0.0.0.0"], "names no server"),
    (["export", "--plan", "{plan}", "--format", "vllm", "--out", "{d}/o", "--address",
      "srv0=255.255.255.255"], "names no server"),
    (["export", "--plan", "{plan}", "--format", "vllm", "--out", "{d}/o", "--address",
      "srv0=239.1.1.1"], "names no server"),
    (["validate", "{unknown}"], "unknown model 'NoSuch-1B'"),  # export refuses it too
    (["admin", "--controller", "127.0.0.1:1", "--tls-cert", "{d}/bin.pem", "--tls-key",
      "{d}/bin.pem", "--tls-ca", "{d}/bin.pem", "state"], "--tls-cert: not a PEM certificate"),
    (["admin", "--controller", "127.0.0.1:1", "--tls-cert", "{d}/empty.pem", "--tls-key",
      "{d}/empty.pem", "--tls-ca", "{d}/empty.pem", "state"], "not a PEM certificate"),
    (["admin", "--controller", "127.0.0.1:1", "apply", "--wait", "inf", "{plan}"],
     "--wait: must be a finite number"),
    (["admin", "--controller", "127.0.0.1:1", "apply", "--wait", "1e9", "{plan}"],
     "--wait: must be at most"),
    (["controller", "--db", "{d}/c.db", "--plan", "{d}/dir"], "is not a regular file"),
    (["controller", "--db", "{d}/c.db", "--plan", "{plan}", "--tls-cert", "{d}/dir",
      "--tls-key", "{d}/dir", "--tls-ca", "{d}/dir"], "--tls-cert '"),
]  # fmt: skip


@pytest.mark.parametrize("argv,says", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_nonsense_is_refused_in_one_line(
    argv: list[str],
    says: str,
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # '' used to mean this folder: nothing may land here
    argv = [a.format(**files) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert os.listdir(tmp_path) == []
    assert not Path(files["d"], "o").exists()
