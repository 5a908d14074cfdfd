"""HeroServe agents: the switch agent (P4Runtime), the executable switch, the Python side of
the GPU agent, and what agents and controller share (generated stubs, agent client, log and
help formats, shipped data).

``__version__`` is read from the installed metadata when first named (PEP 562): reading it
imports ``importlib.metadata`` (about 50 ms), which a command's ``--help`` need not pay."""

from __future__ import annotations

from functools import cache


@cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:  # pyproject.toml's version, as installed (editable in a checkout, or from the wheel)
        return version("heroserve")
    except PackageNotFoundError:  # source tree on sys.path without an installation
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
