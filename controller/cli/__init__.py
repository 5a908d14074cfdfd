"""The ``heroserve`` command: one module of this package per subcommand.

Every subcommand module holds ``HELP`` (its one-line summary), ``add_args(parser)`` and
``run(args) -> int``; :data:`SUBCOMMANDS` lists them in the order ``--help`` shows. A module
that sets ``OWN_PARSER`` runs a process with a parser of its own (``controller``,
``softswitch``): it gets every argument after its name as ``args.argv``.

Bad input (:class:`controller.errors.InputError`, raised anywhere below) prints one line
naming the problem and exits with status 2; Ctrl-C exits 130.

Modules shared by the subcommands: ``common`` (a command's cluster, model, workload and SLA;
a plan's cluster), ``report`` (tables for the terminal), ``progress`` (the progress line),
``related`` (the seed planners' options and colocated plans).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from agents import __version__
from agents.cliutil import DefaultsHelpFormatter, missing_dependency
from controller.errors import InputError, WorkerLost
from controller.inputs.args import OneLineParser, report_error

SUBCOMMANDS = (
    "plan",
    "validate",
    "topology",
    "export",
    "admin",
    "pki",
    "emulate",
    "demo",
    "controller",
    "softswitch",
    "simulate",
    "evaluate",
    "fidelity",
    "compare",
)


def subcommand(name: str) -> ModuleType:
    """The module of subcommand ``name`` (``controller/cli/<name>.py``)."""
    return importlib.import_module(f"controller.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="heroserve",
        formatter_class=DefaultsHelpFormatter,
        description="HeroServe: network control plane for disaggregated LLM serving",
    )
    parser.add_argument("--version", action="version", version=f"heroserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        mod = subcommand(name)
        own = getattr(mod, "OWN_PARSER", False)
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.HELP,
            formatter_class=DefaultsHelpFormatter,
            add_help=not own,
        )
        mod.add_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # before the subcommands import their extras' modules
        print(f"heroserve {__version__}")
        return 0
    try:
        if argv and argv[0] in SUBCOMMANDS and getattr(subcommand(argv[0]), "OWN_PARSER", False):
            return subcommand(argv[0]).run(argparse.Namespace(command=argv[0], argv=argv[1:]))
        args = build_parser().parse_args(argv)
        return subcommand(args.command).run(args)
    except InputError as e:
        named = argv and argv[0] in SUBCOMMANDS
        return report_error(f"heroserve {argv[0]}" if named else "heroserve", e)
    except WorkerLost as e:
        print(f"heroserve {argv[0]}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head and the like
        return 0
    except ModuleNotFoundError as e:  # installed without the controller's extra
        return missing_dependency(e, "heroserve", "pip install 'heroserve[controller]'")
    except KeyboardInterrupt:
        print("heroserve: interrupted", file=sys.stderr)
        return 130
