"""``heroserve controller``: run the controller, the gRPC service of the switch and GPU
agents (docs/control-plane.md). The same process as ``python -m controller.service``, whose
parser reads every argument after the command name (``heroserve controller --help``)."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    """None here: the service parses its own (``controller.service.server``)."""


def run(a: argparse.Namespace) -> int:
    from controller.service import main

    return main(a.argv)
