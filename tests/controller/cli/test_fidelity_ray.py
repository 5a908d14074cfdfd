"""``heroserve fidelity --ray``: the scenarios planned on a Ray cluster; without Ray
installed, one line and exit 2 before any work."""

import importlib.util

import pytest

from controller.cli import main


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed")
def test_ray_without_the_extra_is_one_line(tmp_path, capsys):
    rc = main(["fidelity", "--quick", "--ray", "local", "--out", str(tmp_path / "f.md")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [
        "heroserve fidelity: error: --ray needs the optional extra: pip install 'heroserve[ray]'"
    ]
    assert not (tmp_path / "f.md").exists()
