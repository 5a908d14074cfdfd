"""HeroServe agents: the switch agent (P4Runtime), the executable switch, the Python side of
the GPU agent, and what agents and controller share (generated stubs, agent client, log and
help formats, shipped data)."""

from importlib.metadata import PackageNotFoundError, version

try:  # pyproject.toml's version, as installed (editable in a checkout, or from the wheel)
    __version__ = version("heroserve")
except PackageNotFoundError:  # source tree on sys.path without an installation
    __version__ = "0+unknown"
