"""The command line starts at once: help and ``validate`` import only what they use
(controller/cli/__init__.py). Each case runs ``heroserve`` in a fresh interpreter and lists
the modules it imported (``sys.modules``), checked against modules it must not import: the
planner's search stack (scipy, OR-Tools, k-means, numba through the simulator), matplotlib,
the planners, simulator, seed planners and evaluation. A module imported again at the top of
a subcommand (or of a package ``__init__`` a light module sits in) fails here;
benchmarks/startup.py measures what it costs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import ROOT

# Never for help or validate: the heavy third-party stacks, and the controller's modules
# that plan, simulate or evaluate (a package's light modules, such as
# controller.planner.options, are allowed: the flags are made from them).
HEAVY = [
    "scipy",
    "numba",
    "ortools",
    "k_means_constrained",
    "matplotlib",
    "sklearn",
    "tqdm",
    "cryptography",
    "controller.planner.planners",
    "controller.planner.search",
    "controller.planner.evaluate",
    "controller.costmodel.network",
    "controller.topology.fabric",
    "controller.sim",
    "controller.related.common",
    "controller.related.compare",
    "controller.related.helix",
    "controller.related.colocated",
    "controller.evaluation",
    "controller.export.layout",
    "controller.emulate",
    "controller.service",
]
# Help needs no extra at all (docs/install.md): not even the graph or the arrays.
HELP_HEAVY = [
    *HEAVY,
    "networkx",
    "numpy",
    "yaml",
    "controller.workload",
    "controller.topology.graph",
]
# A topology or plan file is checked on its graph: networkx, and nothing of the workloads.
VALIDATE_HEAVY = [*HEAVY, "numpy", "yaml", "controller.workload"]

_RUN = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from controller.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(sys.argv[1:])
        except SystemExit as e:
            rc = e.code
    print(json.dumps([rc, sorted(sys.modules)]))
    """
)


def imported(*args: str) -> tuple[int, list[str]]:
    r = subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rc, modules = json.loads(r.stdout.splitlines()[-1])
    return rc, modules


def forbidden(modules: list[str], heavy: list[str]) -> list[str]:
    return sorted(m for m in modules for h in heavy if m == h or m.startswith(h + "."))


@pytest.mark.parametrize(
    "args",
    [("--help",), ("validate", "--help"), ("plan", "--help"), ("compare", "--help"),
     ("simulate", "--help"), ("export", "--help"), ("evaluate", "--help"),
     ("fidelity", "--help"), ("pki", "--help"), ("topology", "--help")],
)  # fmt: skip
def test_help_imports_nothing_heavy(args: tuple[str, ...]) -> None:
    rc, modules = imported(*args)
    assert rc == 0
    assert forbidden(modules, HELP_HEAVY) == []


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from controller.models import model_spec
    from controller.planner import plan
    from controller.topology import fig2, topology_to_dict
    from controller.workload import chatbot, default_sla

    d = tmp_path_factory.mktemp("startup")
    topo = d / "fig2.json"
    topo.write_text(json.dumps(topology_to_dict(fig2())))
    p = plan(fig2(), model_spec("OPT-13B"), chatbot(), default_sla("chatbot", "testbed"))
    path = d / "plan.json"
    p.save(path)
    return {"topology": topo, "plan": path}


@pytest.mark.parametrize("kind", ["topology", "plan"])
def test_validate_imports_the_graph_only(kind: str, files: dict[str, Path]) -> None:
    rc, modules = imported("validate", str(files[kind]))
    assert rc == 0
    assert forbidden(modules, VALIDATE_HEAVY) == []
    assert "networkx" in modules  # a topology is checked as the graph every command reads


def test_a_heavy_import_is_caught(tmp_path: Path) -> None:
    """The check fails on what it is for: a subcommand that imports scipy at its top."""
    pkg = tmp_path / "controller" / "cli"
    pkg.mkdir(parents=True)
    shadow = (ROOT / "controller" / "cli" / "validate.py").read_text()
    (pkg / "validate.py").write_text(shadow + "\nimport scipy.optimize  # noqa: E402, F401\n")
    code = _RUN.replace(
        "from controller.cli import main",
        "import controller.cli\n"
        f"controller.cli.__path__.insert(0, {str(pkg)!r})\n"
        "from controller.cli import main",
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "validate", "--help"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    modules = json.loads(r.stdout.splitlines()[-1])[1]
    assert "scipy.optimize" in forbidden(modules, HELP_HEAVY)
