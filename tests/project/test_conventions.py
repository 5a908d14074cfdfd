"""The conventions every command keeps: --help shows defaults, `simulate` labels simulated
and wall-clock time and units, default state lives out of the repository, the README links
only inside it, and help strings point to files that ship."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import ROOT

from controller.cli import main
from controller.service.paths import data_dir


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


@pytest.mark.parametrize(
    "argv, shows",
    [
        (["plan", "--help"], "(default: testbed)"),
        (["export", "--help"], "(default: libnccl-tuner-heroserve.so)"),
        (["controller", "--help"], "(default: 127.0.0.1:50051)"),
        (["simulate", "--help"], "(default: 2000)"),
        (["admin", "apply", "--help"], "(default: 0.0)"),
        (["pki", "issue", "--help"], "(default: 398)"),
    ],
)
def test_help_shows_defaults(argv: list[str], shows: str, capsys: pytest.CaptureFixture) -> None:
    assert shows in _help(capsys, argv)


def test_agents_help_shows_defaults() -> None:
    for module, shows in (
        ("agents.switch", "(default: 1024)"),
        ("agents.softswitch", "(default: 127.0.0.1:9559)"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert r.returncode == 0 and shows in " ".join(r.stdout.split()), module


def test_simulate_labels_simulated_and_wall_clock_time() -> None:
    from controller.cli.simulate import report

    dist = {"mean": 0.1, "p50": 0.09, "p90": 0.2, "p99": 0.3}
    res = SimpleNamespace(
        finished=10,
        requests=10,
        duration_s=12.5,
        offered_rate=2.0,
        gpus_used=4,
        attainment=0.9,
        sla={"ttft_s": 2.5, "tpot_s": 0.15},
        ttft_s=dist,
        tpot_s=dist,
        kv_transfer_s=dist,
        ina_throughput_Bps=1e9,
        allreduce_throughput_Bps=2e9,
        policy_use={},
        peak_kv_bytes_per_gpu=1e9,
        peak_kv_fraction=0.5,
        ethernet_util={"mean": 0.1, "max": 0.2, "cv": 0.3},
        events=100,
        wall_s=0.5,
        requests_per_wall_s=20.0,
    )
    text = report(res)
    assert "finished in 12.5 s simulated time" in text
    assert "100 events in 0.50 s wall-clock" in text
    assert re.search(r"^TTFT \(ms\)\s+mean\s+100\.0\s+p50\s+90\.0\s+p90\s+200\.0", text, re.M)


def test_default_state_lives_in_the_data_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/srv/data")
    assert data_dir() == Path("/srv/data/heroserve")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the spec: relative is invalid
    assert data_dir() == Path.home() / ".local/share/heroserve"
    from controller.service.server import _parser

    db = Path(_parser().parse_args([]).db)
    assert db == data_dir() / "controller.db" and ROOT not in db.parents


def test_readme_links_stay_inside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", text)
    assert targets, "the README links its docs"
    for t in targets:
        assert not re.match(r"[a-z]+://", t), f"README links outside the repository: {t}"
        assert (ROOT / t.split("#")[0]).exists(), f"README links to a missing file: {t}"
    assert "../" not in text


def test_help_strings_point_to_files_that_ship(capsys: pytest.CaptureFixture[str]) -> None:
    texts = [
        _help(capsys, [cmd, "--help"])
        for cmd in ("plan", "export", "pki", "simulate", "evaluate", "admin")
    ]
    texts.append(_help(capsys, ["--help"]))
    for text in texts:
        assert "DESIGN" not in text
        for doc in re.findall(r"docs/[\w.-]+\.md", text):
            assert (ROOT / doc).exists(), doc


def test_a_missing_extra_is_one_line_and_a_missing_own_module_is_a_bug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agents.cliutil import missing_dependency

    rc = missing_dependency(ModuleNotFoundError("no numpy", name="numpy"), "heroserve", "pip x")
    err = capsys.readouterr().err
    assert rc == 2 and err == "heroserve: error: numpy is not installed: pip x (docs/install.md)\n"
    with pytest.raises(ModuleNotFoundError):
        missing_dependency(ModuleNotFoundError(name="agents.proto"), "heroserve", "pip x")
