"""HeroServe agents: the switch agent (P4Runtime), the executable switch, the Python side of
the GPU agent, and what agents and controller share (log format, help format, shipped data).

The version of the ``heroserve`` distribution (pyproject.toml reads it from here)."""

__version__ = "0.1.0"
