"""``--config FILE.yaml`` of ``plan``, ``compare``, ``evaluate`` and ``fidelity``
(docs/inputs.md, "Configuration files").

The file's keys are the dests of the command's flags, and a value is checked by the very
argparse action its flag has: the same type (the bounds and parsers the options dataclasses
give, controller/inputs/flags.py), the same choices. So the flags and the file share one
schema, which :func:`keys` lists (docs/inputs.md is checked against it). Flags given on the
command line override the file.

- :func:`add_config_arg`: the ``--config`` flag;
- :func:`parse_with_config`: parse, read the file the command line names, parse again with
  the file's values as defaults;
- :func:`load`: the file, checked: a mapping of known keys to values of the right shape.

The file is hostile: bounded (:data:`MAX_CONFIG_BYTES`), read as data by ``yaml.safe_load``,
and never echoed; an error names the key (only a key spelled like a flag's dest) and the
problem, never the value, in one line (exit 2).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from agents.cliutil import UsageError, read_regular
from controller.errors import InputError

COMMANDS = ("plan", "compare", "evaluate", "fidelity")
# A configuration is a few dozen short keys; 64 KiB bounds a wrong file given as one.
MAX_CONFIG_BYTES = 64 << 10
MAX_LIST = 1000  # values of one repeatable flag
_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
_NOT_KEYS = {"help", "config", "version"}


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="read options from a YAML file whose keys are the flags' names with '_' for '-' "
        "(docs/inputs.md); flags given here override it",
    )


def keys(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a configuration file of the command parsed by ``p`` may hold: its options'
    dests, and the action that checks each."""
    return {
        a.dest: a
        for a in p._actions  # noqa: SLF001 - argparse keeps its actions there
        if a.option_strings and a.dest not in _NOT_KEYS and a.dest != argparse.SUPPRESS
    }


def _named(key: object) -> str:
    """A key as an error cites it: only a key spelled like a dest (a line of some secret file
    given as a configuration is never echoed)."""
    return repr(key) if isinstance(key, str) and _KEY.fullmatch(key) else "a key"


def _scalar(a: argparse.Action, key: str, value: object) -> Any:
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
        kind = "null" if value is None else type(value).__name__
        raise InputError(f"key {key!r}: a {kind} where {_expects(a)} is expected")
    text = str(value)
    try:
        out = a.type(text) if callable(a.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        why = str(exc).replace(repr(text), "the value").replace(text, "the value")
        why = why.removesuffix(", got the value")  # bounded()'s; the value is not echoed
        raise InputError(f"key {key!r}: {why}") from None
    if a.choices is not None and out not in a.choices:
        raise InputError(f"key {key!r}: not one of {', '.join(map(str, a.choices))}")
    return out


def _expects(a: argparse.Action) -> str:
    if a.choices is not None:
        return "one of " + ", ".join(map(str, a.choices))
    kind = getattr(a.type, "__name__", "")
    return {"int": "an integer", "float": "a number"}.get(kind, "a text")


def _many(a: argparse.Action) -> bool:
    return (
        isinstance(a, argparse._AppendAction)
        or a.nargs in ("+", "*")
        or (  # noqa: SLF001
            isinstance(a.nargs, int) and a.nargs > 1
        )
    )


def value_of(a: argparse.Action, key: str, value: object) -> Any:
    """``value`` for ``key`` as its flag's action would make it; InputError naming the key."""
    if a.nargs == 0:  # store_true / store_false
        if not isinstance(value, bool):
            raise InputError(f"key {key!r}: true or false expected")
        return value if isinstance(a, argparse._StoreTrueAction) else not value  # noqa: SLF001
    if _many(a):
        if not isinstance(value, list):
            raise InputError(f"key {key!r}: a list expected (the flag is repeatable)")
        if len(value) > MAX_LIST:
            raise InputError(f"key {key!r}: more than {MAX_LIST} values")
        return [_scalar(a, key, v) for v in value]
    return _scalar(a, key, value)


def load(path: str, p: argparse.ArgumentParser) -> dict[str, Any]:
    """The checked values of configuration file ``path`` for the command parsed by ``p``,
    keyed by dest."""
    import yaml

    try:
        raw = read_regular(path, "--config", MAX_CONFIG_BYTES)
        doc = yaml.safe_load(raw.decode("utf-8"))
    except UsageError as exc:
        raise InputError(str(exc)) from None
    except UnicodeDecodeError:
        raise InputError(f"--config {path!r} is not UTF-8 text") from None
    except yaml.YAMLError as exc:  # its message quotes the file: only the place is said
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise InputError(f"--config {path!r} is not valid YAML{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InputError(f"--config {path!r}: a mapping of option names to values expected")
    known = keys(p)
    out = {}
    for k, v in doc.items():
        if k not in known:
            raise InputError(
                f"--config {path!r}: unknown key {_named(k)} (the keys are the flags' names "
                "with '_' for '-': docs/inputs.md)"
            )
        try:
            out[k] = value_of(known[k], k, v)
        except InputError as exc:
            raise InputError(f"--config {path!r}: {exc}") from None
    return out


def _named_path(argv: Sequence[str]) -> str | None:
    """The file ``--config FILE`` or ``--config=FILE`` names in ``argv`` (before ``--``)."""
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        if tok == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith("--config="):
            return tok.partition("=")[2]
    return None


def parse_with_config(
    top: argparse.ArgumentParser, sub: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.Namespace:
    """``top.parse_args(argv)``, the file named by ``--config`` (if any) giving the defaults
    of ``sub``'s options: a flag on the command line wins (a required one may come from the
    file); a repeatable flag given there replaces the file's list rather than extending it."""
    path = _named_path(argv)
    values = _defaults(sub, path) if path else {}
    args = top.parse_args(argv)
    if getattr(args, "config", None) and args.config != path:  # spelled --conf, --confi
        values = _defaults(sub, args.config)
        args = top.parse_args(argv)
    for dest, given in values.items():
        got = getattr(args, dest, None)
        if isinstance(given, list) and isinstance(got, list) and len(got) > len(given):
            setattr(args, dest, got[len(given) :])  # appended after the file's: theirs only
    return args


def _defaults(sub: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    values = load(path, sub)
    sub.set_defaults(**values)
    for a in keys(sub).values():
        if a.dest in values:
            a.required = False  # the file gave it
    return values


def _shape(a: argparse.Action) -> str:
    if a.nargs == 0:
        return "true/false"
    one = _expects(a).removeprefix("an ").removeprefix("a ")
    return f"list of {one}s" if _many(a) else one


def _help(a: argparse.Action) -> str:
    text = (a.help or "").replace("%(default)s", str(a.default)).replace("%%", "%")
    return " ".join(text.split()).replace("|", "\\|")


def schema_markdown(top: argparse.ArgumentParser) -> str:
    """The keys of every command's configuration file, as docs/inputs.md lists them (a test
    checks the page holds exactly this), from ``top``: ``heroserve``'s parser built with
    the :data:`COMMANDS` (``controller.cli.build_parser(COMMANDS)``)."""
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    out = []
    for name in COMMANDS:
        out.append(f"`heroserve {name}`:\n\n| key | flag | value | meaning |\n|---|---|---|---|")
        for dest, a in keys(subs.choices[name]).items():
            out.append(f"| `{dest}` | `{a.option_strings[-1]}` | {_shape(a)} | {_help(a)} |")
        out.append("")
    return "\n".join(out)
