"""The ``heroserve`` command: one module of this package per subcommand.

:data:`SUBCOMMANDS` maps each subcommand, in the order ``--help`` shows them, to its one-line
summary; the subcommand's module (``controller/cli/<name>.py``) holds ``add_args(parser)``
and ``run(args) -> int``. The subcommands in :data:`OWN_PARSER` run a process with a parser of
its own (``controller``, ``softswitch``): they get every argument after their name as
``args.argv``.

The command line starts at once (benchmarks/startup.py): ``heroserve --help`` imports no
subcommand module (the summaries are here), and a subcommand builds only its own parser.
A subcommand module imports at its top only light modules (the standard library, the
argparse types of ``controller.inputs``, the option dataclasses its flags are made from);
what its work needs (the planner, the simulator, networkx, numpy) is imported in ``run``.
tests/controller/cli/test_startup.py checks it.

Bad input (:class:`controller.errors.InputError`, raised anywhere below) prints one line
naming the problem and exits with status 2; a third-party module missing (an extra not
installed) prints one line naming the extra and exits 2; Ctrl-C exits 130.

Modules shared by the subcommands: ``common`` (a command's cluster, model, workload and SLA;
a plan's cluster), ``report`` (tables for the terminal), ``progress`` (the progress line),
``related`` (the seed planners' options and colocated plans), ``configfile`` (``--config
FILE.yaml`` of plan, compare, evaluate and fidelity).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType

import agents
from agents.cliutil import DefaultsHelpFormatter, missing_dependency
from controller.cli import configfile
from controller.errors import InputError, WorkerLost
from controller.inputs.args import OneLineParser, report_error

SUBCOMMANDS: dict[str, str] = {
    "plan": "plan a disaggregated deployment and compare it with the baselines",
    "validate": "check a topology, plan or trace file as every command reads it "
    "(limits: docs/topology.md)",
    "topology": "validate a topology file or export a built-in one",
    "export": "turn a plan into a deployment file or vLLM/SGLang launch commands (docs/export.md)",
    "admin": "operate a running controller: apply a plan, show state, agents, slots",
    "pki": "make the CA and certificates for mutual TLS (docs/control-plane.md)",
    "emulate": "emulate the cluster (Mininet) and compare INA with ring all-reduces on real "
    "packets",
    "demo": "bring up controller, switches and agents on this machine and show a plan arriving",
    "controller": "run the controller: gRPC service for switch and GPU agents",
    "softswitch": "run the executable model of the P4 INA switch (P4Runtime server)",
    "simulate": "simulate a plan: SLA attainment, TTFT/TPOT, INA throughput, KV memory",
    "profile": "measure a serving engine on this hardware and write an engine profile for "
    "plan/simulate --profile",
    "evaluate": "reproduce the paper's evaluation (Fig. 7-10) on a scenario",
    "fidelity": "write docs/fidelity.md: the paper's claims beside the project's",
    "compare": "every planner, the seed papers' too, side by side on one cluster",
}
# their arguments go to the parser of the process they run, as they are
OWN_PARSER = ("controller", "softswitch")


def subcommand(name: str) -> ModuleType:
    """The module of subcommand ``name`` (``controller/cli/<name>.py``)."""
    return importlib.import_module(f"controller.cli.{name}")


class _Version(argparse.Action):
    """``--version``: the version read only when asked for (agents/__init__.py)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: object) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS,
                         help=kw.get("help"))  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"heroserve {agents.__version__}")
        parser.exit()


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``heroserve``: every subcommand is listed, only those of ``commands``
    (default: all) get their arguments, so that running one imports no other's module."""
    parser = OneLineParser(
        prog="heroserve",
        formatter_class=DefaultsHelpFormatter,
        description="HeroServe: network control plane for disaggregated LLM serving",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    full = set(SUBCOMMANDS if commands is None else commands)
    for name, summary in SUBCOMMANDS.items():
        p = sub.add_parser(
            name,
            help=summary,
            description=summary,
            formatter_class=DefaultsHelpFormatter,
            add_help=name not in OWN_PARSER,
        )
        if name in full:
            subcommand(name).add_args(p)
            if name in configfile.COMMANDS:
                configfile.add_config_arg(p)
    return parser


def config_keys_markdown() -> str:
    """The keys of the ``--config`` files, as docs/inputs.md lists them
    (``python -c 'import controller.cli as c; print(c.config_keys_markdown(), end="")'``)."""
    return configfile.schema_markdown(build_parser(configfile.COMMANDS))


def _named(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (``heroserve``'s
    own options take no value)."""
    first = next((x for x in argv if not x.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        print(f"heroserve {agents.__version__}")
        return 0
    name = _named(argv)
    prog = f"heroserve {name}" if name and argv[0] == name else "heroserve"
    try:
        if name in OWN_PARSER and argv[0] == name:
            return subcommand(name).run(argparse.Namespace(command=name, argv=argv[1:]))
        parser = build_parser([name] if name else [])
        if name in configfile.COMMANDS:  # --config FILE: the file's values, then the flags
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            args = configfile.parse_with_config(parser, sub.choices[name], argv)
        else:
            args = parser.parse_args(argv)
        return subcommand(args.command).run(args)
    except InputError as e:
        return report_error(prog, e)
    except WorkerLost as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head and the like
        return 0
    except ModuleNotFoundError as e:  # installed without the controller's extra
        return missing_dependency(e, prog, "pip install 'heroserve[controller]'")
    except KeyboardInterrupt:
        print("heroserve: interrupted", file=sys.stderr)
        return 130
