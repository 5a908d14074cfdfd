"""The controller's gRPC control plane (docs/design.md §9): see ``server.main``."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """``heroserve controller ...``; returns the exit status."""
    from controller.service.server import main as _main

    return _main(argv)
