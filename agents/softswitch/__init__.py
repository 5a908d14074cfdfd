"""Executable model of p4/heroserve_ina.p4 with a P4Runtime server (docs/design.md §10).

``main(argv)`` runs it (``heroserve softswitch``); importing this package does not import
protobuf, so the caller's protobuf runtime is untouched (see ``cli.main``).
"""

from .cli import main

__all__ = ["main"]
