"""tools/engines.sh: where no usable CPython is found it says so in one line and exits 2
before it creates anything (a name that exists but fails to run, like pyenv's shim for a
version it has not selected, counts as not found)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "engines.sh"


@pytest.mark.parametrize("python", ["/nonexistent/python3.12", "shim"])
def test_no_usable_python_is_one_line_and_exit_2(tmp_path: Path, python: str) -> None:
    if python == "shim":  # exists, fails the way pyenv's shim does
        shim = tmp_path / "python3.12"
        shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
        shim.chmod(0o755)
        python = str(shim)
    out = tmp_path / "engines"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and python in r.stderr
    assert "PYTHON=" in r.stderr  # how to provide one
    assert not out.exists()
