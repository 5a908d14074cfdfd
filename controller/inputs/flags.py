"""Command-line flags made from the fields of a frozen dataclass, so that an option is written
once (docs/inputs.md, "Flags from dataclasses").

A field is a flag when it is declared with :func:`option`, which records its help text, its
unit and its bounds in the field's metadata; other fields are the program's own knobs. From
the field :func:`add_flags` derives:

- the flag, ``--`` and the field's name with ``-`` for ``_`` (``flag=`` names another);
- ``choices`` from a ``Literal[...]`` type, a number's check from its type and bounds
  (:func:`controller.inputs.args.bounded`: finite, within ``low``/``high``), ``parse=`` for
  any other type (``TYPE``: a string to the value, raising ``argparse.ArgumentTypeError``);
- ``store_true`` for a ``bool`` field defaulting to False, ``--no-NAME`` for one defaulting
  to True; ``many=True``: a repeatable flag, its values handed to ``convert``;
- the default from the field's default, and a field without one is a required flag;
- the help text: ``help``, then in brackets the unit and the default (``(s; default: 60)``);
  ``default_help`` words a default the value does not say (``all of them`` for None).

A field whose type is a dataclass with flags of its own adds those (``PlannerOptions.net``
adds ``NetParams``' ``--cost-mode`` and ``--ina-lanes``). :func:`build` makes the dataclass
back from the parsed namespace. A bad value is refused by argparse before any dataclass is
made: one line naming the flag, exit 2 (:class:`controller.inputs.args.OneLineParser`).

This module and the dataclasses it reads are light (no networkx, numpy or planner): every
``--help`` is built from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass
from typing import Any

from controller.inputs.args import bounded


@dataclass(frozen=True)
class Flag:
    """A field's command-line side (``option``'s arguments)."""

    help: str
    unit: str | None = None
    flag: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    default_help: str | None = None
    many: bool = False
    convert: Callable[[list], Any] | None = None

    def name(self, field: str) -> str:
        return self.flag or "--" + field.replace("_", "-")


def option(
    default: Any = MISSING,
    *,
    help: str,
    default_factory: Any = MISSING,
    **flag: Any,
) -> Any:
    """A dataclass field that is also a command-line flag (the keywords: :class:`Flag`)."""
    meta = {"flag": Flag(help=help, **flag)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> Flag | None:
    return f.metadata.get("flag")


def _unwrap(tp: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _nested(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that are dataclasses with flags of their own."""
    hints = _hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = _unwrap(hints[f.name])
        if flag_of(f) is None and dataclasses.is_dataclass(tp) and has_flags(tp):
            out[f.name] = tp
    return out


def has_flags(cls: type) -> bool:
    return any(flag_of(f) for f in dataclasses.fields(cls)) or bool(_nested(cls))


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def help_text(fl: Flag, default: Any) -> str:
    """The flag's help: its text, then the unit and the default in brackets."""
    parts = [fl.unit] if fl.unit else []
    if fl.default_help is not None:
        parts.append(f"default: {fl.default_help}")
    elif default not in (None, MISSING) and not isinstance(default, bool) and not fl.many:
        parts.append(f"default: {_shown(default)}")
    return f"{fl.help} ({'; '.join(parts)})" if parts else fl.help


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def dest(f: dataclasses.Field) -> str:
    """The namespace attribute of a field's flag: argparse's, from the flag's name."""
    fl = flag_of(f)
    assert fl is not None
    return fl.name(f.name).lstrip("-").replace("-", "_")


def add_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    exclude: Iterable[str] = (),
) -> None:
    """Add a flag for every field of ``cls`` declared with :func:`option` (and of its
    dataclass fields), but those named in ``exclude``."""
    skip = set(exclude)
    hints = _hints(cls)
    nested = _nested(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name in nested:
            add_flags(p, nested[f.name], skip)
            continue
        fl = flag_of(f)
        if fl is None:
            continue
        tp = _unwrap(hints[f.name])
        default = _default(f)
        kw: dict[str, Any] = {"dest": dest(f), "help": help_text(fl, default)}
        name = fl.name(f.name)
        if tp is bool:
            if default is True and fl.flag is None:
                name = "--no-" + f.name.replace("_", "-")
                kw["dest"] = name[2:].replace("-", "_")
            p.add_argument(name, action="store_true", **kw)
            continue
        if default is MISSING:
            kw["required"] = True
        else:
            kw["default"] = [] if fl.many else default
        if fl.many:
            kw["action"] = "append"
        if fl.metavar:
            kw["metavar"] = fl.metavar
        if fl.parse is not None:
            kw["type"] = fl.parse
        elif typing.get_origin(tp) is typing.Literal:
            kw["choices"] = typing.get_args(tp)
        elif tp in (int, float):
            kw["type"] = bounded(tp, fl.low, fl.high, low_open=fl.low_open)
        elif tp is not str:
            raise TypeError(f"{cls.__name__}.{f.name}: give parse= for a {tp} flag")
        p.add_argument(name, **kw)


def build(cls: type, ns: argparse.Namespace, **given: Any) -> Any:
    """``cls`` from the parsed flags (those :func:`add_flags` added); ``given`` sets fields
    the command line does not (``seed=``), the rest keep their defaults."""
    kw: dict[str, Any] = {}
    nested = _nested(cls)
    for f in dataclasses.fields(cls):
        if f.name in given:
            kw[f.name] = given[f.name]
        elif f.name in nested:
            kw[f.name] = build(nested[f.name], ns)
        elif (fl := flag_of(f)) is not None:
            default = _default(f)
            if default is True and fl.flag is None and _hints(cls)[f.name] is bool:
                kw[f.name] = not getattr(ns, "no_" + f.name)
            elif hasattr(ns, dest(f)):
                v = getattr(ns, dest(f))
                kw[f.name] = fl.convert(v) if fl.many and fl.convert else v
    return cls(**kw)
