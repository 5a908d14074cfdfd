"""The ``heroserve`` command installed without the controller's extra (the bare wheel, or
``[switch]``): ``--version`` answers, and a command that needs a missing module says which
extra to install in one line and exits 2 (docs/install.md). The missing modules are
simulated in a fresh interpreter by a ``sys.meta_path`` finder that refuses them, as an
environment without the distributions would."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from support import ROOT

# The import names of the distributions each extra adds (pyproject.toml)
CONTROLLER_ONLY = (
    "networkx numpy scipy yaml k_means_constrained ortools grpc_health grpc_reflection "
    "prometheus_client cryptography matplotlib tqdm"
).split()
SWITCH = "p4 google.rpc IPython scapy p4runtime_sh".split()
INSTALLS = {"bare": CONTROLLER_ONLY + SWITCH, "switch": CONTROLLER_ONLY}

_RUN = textwrap.dedent(
    """
    import sys

    BLOCKED = set(sys.argv[1].split(","))

    class Missing:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    from controller.cli import main  # what the console script imports

    sys.exit(main(sys.argv[2:]))
    """
)


def _heroserve(install: str, *args: str) -> subprocess.CompletedProcess:
    blocked = ",".join(INSTALLS[install])
    return subprocess.run(
        [sys.executable, "-c", _RUN, blocked, *args],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_version_needs_no_extra(install: str) -> None:
    r = _heroserve(install, "--version")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith("heroserve ") and r.stdout.count("\n") == 1


@pytest.mark.parametrize("install", sorted(INSTALLS))
@pytest.mark.parametrize(
    "args", [("plan",), ("plan", "--topology", "testbed"), ("validate", "x.yaml")]
)
def test_a_command_needing_the_extra_names_it(install: str, args: tuple[str, ...]) -> None:
    r = _heroserve(install, *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "is not installed: pip install 'heroserve[controller]'" in r.stderr


@pytest.mark.parametrize("install", sorted(INSTALLS))
@pytest.mark.parametrize(
    "sub", ["plan", "compare", "simulate", "export", "evaluate", "validate", "topology", "pki"]
)
def test_help_needs_no_extra(install: str, sub: str) -> None:
    """Help is built from light modules only (controller/cli/__init__.py): it works on a
    bare install, and so does ``heroserve --help``."""
    r = _heroserve(install, sub, "--help")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.startswith(f"usage: heroserve {sub}")
    top = _heroserve(install, "--help")
    assert top.returncode == 0 and sub in top.stdout


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_the_missing_extra_is_named_with_the_subcommand(install: str) -> None:
    r = _heroserve(install, "plan")
    assert r.returncode == 2
    assert r.stderr.startswith("heroserve plan: error: ") and r.stderr.count("\n") == 1
