"""The layout rules of docs/design.md ("Layout") that `lint-imports` does not check: no import
circle between modules, modules under 500 lines (the exceptions named, with why), nothing
that points outside the repository, the one interface Mininet's scripts take from the
controller, and the planner's classes composed rather than inherited from several bases.
The layering itself is the import-linter contracts in pyproject.toml."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
from support import ROOT

PACKAGES = ("controller", "agents")
MAX_LINES = 500
# Longer modules, each with the reason it stays whole.
LONG_MODULES: dict[str, str] = {}
# the files a reader of the repository reads: sources of every language, docs, build files
# (.ci's scripts have no suffix)
SOURCE_SUFFIXES = (".py", ".md", ".cc", ".h", ".c", ".txt", ".p4", ".proto", ".sh", ".txtpb", "")
# What mininet/ may import from the controller: the emulated network's plain-data spec.
MININET_INTERFACE = {"controller.emulate.spec"}


def _sources() -> dict[str, Path]:
    """Module name -> file, for the project's own packages (generated stubs excluded)."""
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT)
            if "_gen" in rel.parts or rel.parts[:2] == ("agents", "proto"):
                continue
            name = ".".join(rel.with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def imported(path: Path, module: str, modules: set[str]) -> set[str]:
    """The project modules ``module`` (the file ``path``) imports, at any depth of the file
    (a function-level import runs too). ``from pkg import name`` is the submodule
    ``pkg.name`` where there is one, else the package itself (its ``__init__`` runs)."""
    is_pkg = path.name == "__init__.py"
    here = module if is_pkg else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = [s for s in subs if s in modules] or [base]
        else:
            continue
        out |= {t for t in targets if t in modules and t != module}
    return out


def import_graph() -> nx.DiGraph:
    mods = _sources()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for m, p in mods.items():
        g.add_edges_from((m, t) for t in imported(p, m, set(mods)))
    return g


def test_the_import_graph_reader_sees_a_circle() -> None:
    """The reader below finds what it must: a hand-made pair of modules importing each other
    is one circle, a package importing its submodule is an arrow."""
    g = nx.DiGraph()
    g.add_edges_from([("a.x", "a.y"), ("a.y", "a.x"), ("a", "a.x")])
    circles = [c for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [{"a.x", "a.y"}]
    mods = _sources()
    # a function-level `from controller.cli.common import resolve_inputs` and a module-level
    # `from controller.planner.options import PlannerOptions`
    deps = imported(mods["controller.cli.plan"], "controller.cli.plan", set(mods))
    assert {"controller.cli.common", "controller.planner.options"} <= deps


def test_no_import_circle_between_modules() -> None:
    g = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], f"import circles: {circles}"


def test_modules_stay_under_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in [*_sources().values(), *(ROOT / "mininet").glob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert set(long) <= set(LONG_MODULES), f"over {MAX_LINES} lines: {long}"


def _generated(p: Path) -> bool:
    """Build outputs inside the tree (gRPC stubs, caches), which copy their sources' text."""
    rel = p.relative_to(ROOT).parts
    return rel[:2] == ("agents", "proto") or "__pycache__" in rel or "_gen" in rel


def wide_classes(source: str) -> list[str]:
    """The classes of a module's ``source`` that have more than one base class."""
    return [
        n.name
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and len(n.bases) > 1
    ]


def test_planner_classes_have_at_most_one_base() -> None:
    """The planner's evaluator is built from pricers it is given (docs/planner.md, "The
    evaluator"), not a diamond of mixins over shared state: no class in controller/planner
    has two bases. The reader itself sees a two-base class."""
    assert wide_classes("class A(B, C):\n    pass\n\nclass D(E):\n    pass\n") == ["A"]
    wide = {
        f"{p.relative_to(ROOT)}: {name}"
        for p in sorted((ROOT / "controller" / "planner").rglob("*.py"))
        for name in wide_classes(p.read_text())
    }
    assert wide == set(), f"classes with more than one base: {sorted(wide)}"


def test_nothing_points_outside_the_repository() -> None:
    """Code, docs and tests cite the repository's own docs/design.md, never a design file
    or an issue tracker a reader of the repository cannot follow."""
    outside = re.compile(r"DESIGN\.md|[Ii]ssues? \d|\.\./shared/")
    hits = []
    tops = ("controller", "agents", "csrc", "mininet", "docs", "tests", "benchmarks", "tools")
    for top in (*tops, "proto", "p4", ".ci"):
        for p in (ROOT / top).rglob("*"):
            if (
                p.suffix in SOURCE_SUFFIXES
                and p != Path(__file__)
                and p.is_file()
                and not _generated(p)
            ):
                for k, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                    if outside.search(line):
                        hits.append(f"{p.relative_to(ROOT)}:{k}")
    readme = (ROOT / "README.md").read_text()
    hits += ["README.md"] if outside.search(readme) else []
    assert hits == []
    assert (ROOT / "docs" / "design.md").is_file()


def test_mininet_takes_only_the_stated_interface_of_the_controller() -> None:
    used = set()
    for p in (ROOT / "mininet").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("controller"):
                used.add(node.module)
            elif isinstance(node, ast.Import):
                used |= {a.name for a in node.names if a.name.startswith("controller")}
    assert used <= MININET_INTERFACE, used
