"""``heroserve softswitch``: run the executable model of the P4 INA switch, a P4Runtime
server (docs/dataplane.md). The same process as ``python -m agents.softswitch``, whose parser
reads every argument after the command name (``heroserve softswitch --help``)."""

from __future__ import annotations

import argparse


def add_args(p: argparse.ArgumentParser) -> None:
    """None here: the switch parses its own (``agents.softswitch.cli``)."""


def run(a: argparse.Namespace) -> int:
    from agents.softswitch import main

    return main(a.argv)
