"""The wheel works outside the checkout: built with `uv build`,
installed into fresh virtual environments under a temporary folder, it plans, serves
`--help` and reports its version; a switch agent's installation (`heroserve[switch]`) has
no planner stack and its agent still imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from agents import __version__

UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
P4RUNTIME_SHELL = "p4runtime-shell==0.0.6"

pytestmark = pytest.mark.skipif(not Path(UV).exists(), reason="uv is not installed")


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv}: {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`uv build` from the checkout: an sdist, then the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    _run([UV, "build", "--out-dir", str(out), str(ROOT)], cwd=out)
    (whl,) = out.glob("heroserve-*.whl")
    return whl


def _venv(where: Path, *requirements: str, no_deps: tuple[str, ...] = ()) -> Path:
    _run([UV, "venv", "-q", "--python", sys.executable, str(where)], cwd=where.parent)
    py = where / "bin" / "python"
    _run([UV, "pip", "install", "-q", "--python", str(py), *requirements], cwd=where.parent)
    if no_deps:
        _run([UV, "pip", "install", "-q", "--no-deps", "--python", str(py), *no_deps], where.parent)
    return where / "bin"


def test_wheel_installs_and_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    bin_ = _venv(tmp_path / "venv", f"{wheel}[controller,switch]", no_deps=(P4RUNTIME_SHELL,))
    work = tmp_path / "work"  # the commands run here, far from the checkout
    work.mkdir()
    assert _run([str(bin_ / "heroserve"), "--version"], work).stdout.strip() == (
        f"heroserve {__version__}"
    )
    out = _run(
        [str(bin_ / "heroserve"), "plan", "--planner", "heroserve", "--json", "p.json"], work
    )
    assert "HeroServe offline plan: topology testbed" in out.stdout
    assert (work / "p.json").exists()
    assert "--tls-cert" in _run([str(bin_ / "heroserve"), "controller", "--help"], work).stdout
    version = _run([str(bin_ / "heroserve-switch-agent"), "--version"], work).stdout.strip()
    assert version == f"heroserve-switch-agent {__version__}"
    # the generated stubs, the P4Info and the .proto come from the installation
    probe = (
        "import controller, agents.resources as r; "
        "print(controller.__file__); print(r.shipped('p4/heroserve_ina.p4info.txtpb')); "
        "print(r.shipped('proto/heroserve/v1/control.proto'))"
    )
    paths = _run([str(bin_ / "python"), "-c", probe], work).stdout.split()
    for p in paths:
        assert Path(p).exists() and ROOT not in Path(p).parents, p


def test_a_switch_installation_has_no_planner_stack(wheel: Path, tmp_path: Path) -> None:
    """`heroserve[switch]` and p4runtime-shell (--no-deps, docs/install.md): the switch agent
    and the executable switch import; numpy, OR-Tools and k-means-constrained are absent."""
    bin_ = _venv(tmp_path / "venv", f"{wheel}[switch]", no_deps=(P4RUNTIME_SHELL,))
    work = tmp_path / "work"
    work.mkdir()
    probe = (
        "import os, sys, importlib.util as u\n"
        "os.environ['PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'] = 'python'\n"
        "import agents.switch.agent, agents.switch.main, agents.softswitch.server\n"
        "print(sorted(m for m in ('numpy', 'ortools', 'k_means_constrained', 'networkx')"
        " if u.find_spec(m)))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'controller'))\n"
    )
    out = _run([str(bin_ / "python"), "-c", probe], work).stdout.splitlines()
    assert out == ["[]", "[]"]
    version = _run([str(bin_ / "heroserve-switch-agent"), "--version"], work).stdout.strip()
    assert version == f"heroserve-switch-agent {__version__}"
