"""Access to Mininet from the project's Python (docs/emulation.md, "Mininet").

Debian's ``mininet`` package installs its Python module for Debian's ``/usr/bin/python3``
(``/usr/lib/python3/dist-packages``), not into the project's virtual environment. Rather than
putting all of dist-packages on ``sys.path`` (its other packages would shadow or mix with the
environment's), this process loads only the ``mininet`` package from there. It is pure Python
and both interpreters are CPython 3.11 on Debian bookworm. The project's own Mininet code
lives in ``mininet/`` at the repository root (the folder shares the package's name, so it
is loaded as ``heroserve_mininet``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import shutil
import sys
import types
from pathlib import Path
from typing import Any

from controller.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
DIST_PACKAGES = ("/usr/lib/python3/dist-packages",)
PACKAGE = "heroserve_mininet"


def load_mininet() -> types.ModuleType:
    """Debian's ``mininet`` package, imported into this process (once)."""
    mod = sys.modules.get("mininet")
    if (
        mod is not None
        and getattr(mod, "__path__", None)
        and Path(list(mod.__path__)[0]).parent.as_posix() in DIST_PACKAGES
    ):
        return mod
    spec = importlib.machinery.PathFinder.find_spec("mininet", list(DIST_PACKAGES))
    if spec is None or spec.loader is None:
        raise InputError(
            "Mininet is not installed: install Debian's `mininet` package "
            "(apt-get install mininet; .ci/apt-packages.txt lists it)"
        )
    if sys.version_info[:2] != (3, 11):
        raise InputError(
            f"Debian's mininet module is built for Python 3.11; this is "
            f"{sys.version_info.major}.{sys.version_info.minor}"
        )
    for tool, package in (("mnexec", "mininet"), ("tc", "iproute2"), ("ethtool", "ethtool")):
        if shutil.which(tool) is None:
            raise InputError(f"`{tool}` not found (Debian package {package})")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mininet"] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception:
        del sys.modules["mininet"]
        raise
    return mod


def load_network_module() -> Any:
    """``mininet/network.py`` of this repository (needs :func:`load_mininet` first)."""
    load_mininet()
    # An installed wheel has no mininet/ (it packages controller/ and agents/ only).
    if not (ROOT / "mininet" / "network.py").is_file():
        raise InputError(
            f"the emulation runs from a checkout of the repository: {ROOT / 'mininet'} is missing"
        )
    if PACKAGE not in sys.modules:
        pkg = types.ModuleType(PACKAGE)
        pkg.__path__ = [str(ROOT / "mininet")]
        sys.modules[PACKAGE] = pkg
    return importlib.import_module(f"{PACKAGE}.network")
