"""The one validation layer for input files: bounded reading, parsing and a typed schema.

Every topology, plan and trace file goes through :func:`read_document` (size bound before
reading, strict UTF-8, JSON or YAML with duplicate keys, YAML aliases and deep nesting
refused) and then a :class:`Spec` that checks types, finite numbers within ranges, list
lengths and string lengths, and rejects unknown keys by name::

    links[3].latncy_us: unknown key (did you mean latency_us?)

Errors are :class:`controller.errors.InputError` naming the offending item's place
(``where``): one line and exit 2 from the CLI, INVALID_ARGUMENT from the controller.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.errors import InputError
from controller.inputs.limits import MAX_DEPTH, MAX_STRING


def at(where: str, key: str) -> str:
    """The place of ``key`` inside the mapping at ``where``: ``links[3].gbps``."""
    return f"{where}.{key}" if where else key


def item(where: str, i: int) -> str:
    return f"{where}[{i}]"


def fail(where: str, message: str) -> InputError:
    return InputError(f"{where}: {message}" if where else message)


class SchemaError(InputError):
    """A value that does not match its spec. The place is built on the way out (each
    container adds its key or index), so checking a valid document formats no string."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segments: list[str] = []  # innermost first: ".gbps", "[3]", ".links"

    def inside(self, segment: str) -> SchemaError:
        self.segments.append(segment)
        return self

    @property
    def where(self) -> str:
        return "".join(reversed(self.segments)).lstrip(".")

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.segments else self.message


def shown(v: object) -> str:
    """A value as an error message shows it: short, one line."""
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def unknown_key(key: str, allowed: Mapping[str, Any] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]}?)"
    return f"unknown key; allowed: {', '.join(allowed)}"


def number(x: float) -> str:
    """A bound or value in a message: integers exactly, others in 6 significant digits."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return str(int(x))
    return f"{x:g}"


def lower_bound(low: float, low_open: bool, kind: type) -> str:
    """How a message words a lower bound: "positive", "non-negative", "at least 2"."""
    if low == 0:
        return "positive" if low_open else "non-negative"
    if kind is int and low == 1 and not low_open:
        return "positive"
    return f"{'above' if low_open else 'at least'} {number(low)}"


def _key_segment(k: object) -> str:
    return f".{k}" if isinstance(k, str) else f"[{k!r}]"


class Spec:
    """What a value must be. ``check`` returns the value as the program uses it (ints as int,
    numbers as float, mappings as plain dicts or dataclasses) or raises SchemaError."""

    what = "a value"

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def validate(self, value: Any, where: str = "") -> Any:
        """``check``, with errors placed under ``where``."""
        try:
            return self.check(value)
        except SchemaError as e:
            if where:
                e.inside("." + where)
            raise


@dataclass(frozen=True)
class Number(Spec):
    """A finite number in ``[low, high]`` (``low_open``: ``(low, high]``). Booleans are not
    numbers; with ``integer`` a float with a fraction is an error, never truncated."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False

    @property
    def what(self) -> str:  # type: ignore[override]
        return "an integer" if self.integer else "a number"

    def check(self, value: Any) -> int | float:
        if value.__class__ not in (int, float):  # numpy scalars from in-process plans pass
            if value.__class__ is bool or not isinstance(value, numbers.Real):
                raise SchemaError(f"must be {self.what}, got {shown(value)}")
            value = int(value) if isinstance(value, numbers.Integral) else float(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise SchemaError(f"must be a finite number, got {value}")
            if self.integer:
                if not value.is_integer():
                    raise SchemaError(f"must be an integer, got {value}")
                value = int(value)
        low = self.low
        if low is not None and (value <= low if self.low_open else value < low):
            kind = int if self.integer else float
            raise SchemaError(
                f"must be {lower_bound(low, self.low_open, kind)}, got {number(value)}"
            )
        if self.high is not None and value > self.high:
            raise SchemaError(f"must be at most {number(self.high)}, got {number(value)}")
        return value if self.integer else float(value)


@dataclass(frozen=True)
class Str(Spec):
    """A string: one of ``choices``, or matching ``pattern`` (whole), at most ``max_len``."""

    choices: tuple[str, ...] | None = None
    pattern: str | None = None
    max_len: int = MAX_STRING
    min_len: int = 0
    what: str = "a string"

    def __post_init__(self) -> None:
        # most strings (ids in paths, GPU lists) only need their length checked
        object.__setattr__(self, "plain", self.choices is None and self.pattern is None)

    def check(self, value: Any) -> str:
        if value.__class__ is str and self.plain and self.min_len <= len(value) <= self.max_len:
            return value
        if value.__class__ is not str:
            if self.choices:
                raise SchemaError(f"must be one of {', '.join(self.choices)}, got {shown(value)}")
            raise SchemaError(f"must be {self.what}, got {shown(value)}")
        if self.choices is not None and value not in self.choices:
            raise SchemaError(f"must be one of {', '.join(self.choices)}, got {shown(value)}")
        if len(value) > self.max_len:
            raise SchemaError(f"longer than {self.max_len} characters")
        if len(value) < self.min_len:
            raise SchemaError("must not be empty")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise SchemaError(f"{shown(value)} is not {self.what}")
        return value


@dataclass(frozen=True)
class Bool(Spec):
    what = "true or false"

    def check(self, value: Any) -> bool:
        if value.__class__ is not bool:
            raise SchemaError(f"must be true or false, got {shown(value)}")
        return value


@dataclass(frozen=True)
class Nullable(Spec):
    spec: Spec

    def check(self, value: Any) -> Any:
        return None if value is None else self.spec.check(value)


@dataclass(frozen=True)
class ListOf(Spec):
    """A list of at most ``max_len`` items (checked before any item is looked at)."""

    item: Spec
    max_len: int
    min_len: int = 0

    def check(self, value: Any) -> list[Any]:
        if value.__class__ is not list:
            raise SchemaError(f"must be a list, got {shown(value)}")
        if len(value) > self.max_len:
            raise SchemaError(f"{len(value)} items, at most {self.max_len} allowed")
        if len(value) < self.min_len:
            raise SchemaError(f"needs at least {self.min_len} item(s)")
        item = self.item
        if isinstance(item, Str) and item.plain:  # a list of ids: one pass, no calls
            lo, hi = item.min_len, item.max_len
            if all(v.__class__ is str and lo <= len(v) <= hi for v in value):
                return list(value)
        check = item.check
        out = []
        i = 0
        try:
            for i, v in enumerate(value):  # noqa: B007 (i names the failing item)
                out.append(check(v))
        except SchemaError as e:
            raise e.inside(f"[{i}]") from None
        return out


@dataclass(frozen=True)
class MapOf(Spec):
    """A mapping whose keys are free (``key`` checks them), e.g. member GPU -> path."""

    key: Str
    value: Spec
    max_len: int

    def check(self, value: Any) -> dict[str, Any]:
        if value.__class__ is not dict:
            raise SchemaError(f"must be a mapping, got {shown(value)}")
        if len(value) > self.max_len:
            raise SchemaError(f"{len(value)} entries, at most {self.max_len} allowed")
        out = {}
        k: Any = None
        try:
            for k, v in value.items():
                self.key.check(k)
                out[k] = self.value.check(v)
        except SchemaError as e:
            raise e.inside(_key_segment(k)) from None
        return out


@dataclass(frozen=True)
class Key:
    """One key of a :class:`Record`; a key that is not ``required`` may be absent."""

    spec: Spec
    required: bool = False


@dataclass(frozen=True)
class Record(Spec):
    """A mapping with a fixed set of keys: an unknown key is an error naming it (with the
    closest known key), a missing required key too. ``build`` turns the checked dict into
    the program's object (a dataclass, say)."""

    keys: Mapping[str, Key]
    build: Callable[[dict[str, Any]], Any] | None = None
    what: str = "a mapping"

    def check(self, value: Any) -> Any:
        if value.__class__ is not dict:
            raise SchemaError(f"must be {self.what}, got {shown(value)}")
        keys = self.keys
        if not keys.keys() >= value.keys():
            k = next(k for k in value if k not in keys)
            raise SchemaError(unknown_key(str(k), tuple(keys))).inside(_key_segment(k))
        out = {}
        for k, key in keys.items():
            if k in value:
                try:
                    out[k] = key.spec.check(value[k])
                except SchemaError as e:
                    raise e.inside("." + k) from None
            elif key.required:
                raise SchemaError(f"missing {k!r}")
        return self.build(out) if self.build is not None else out


@dataclass(frozen=True)
class Tagged(Spec):
    """A mapping whose ``tag`` key picks the Record it must be (a node's ``kind``)."""

    tag: str
    variants: Mapping[str, Record]

    def check(self, value: Any) -> Any:
        if value.__class__ is not dict:
            raise SchemaError(f"must be a mapping, got {shown(value)}")
        if self.tag not in value:
            raise SchemaError(f"missing {self.tag!r}")
        t = value[self.tag]
        if t.__class__ is not str or t not in self.variants:
            raise SchemaError(f"must be one of {', '.join(self.variants)}, got {shown(t)}").inside(
                "." + self.tag
            )
        return self.variants[t].check(value)


@dataclass(frozen=True)
class PlainData(Spec):
    """Any JSON value (null, true/false, finite number, string, list, string-keyed mapping),
    at most ``max_items`` values and ``max_depth`` levels: free-form data such as a plan's
    options, checked without recursion."""

    max_items: int
    max_depth: int = 8

    def check(self, value: Any) -> Any:
        stack: list[tuple[Any, str, int]] = [(value, "", 0)]
        count = 0
        while stack:
            v, w, depth = stack.pop()
            count += 1
            if count > self.max_items:
                raise SchemaError(f"more than {self.max_items} values")
            if depth > self.max_depth:
                raise SchemaError(f"nested deeper than {self.max_depth} levels").inside(w)
            if v is None or isinstance(v, bool):
                continue
            if isinstance(v, int | float | str):
                if isinstance(v, float) and not math.isfinite(v):
                    raise SchemaError(f"must be a finite number, got {v}").inside(w)
                if isinstance(v, str) and len(v) > MAX_STRING:
                    raise SchemaError(f"longer than {MAX_STRING} characters").inside(w)
                continue
            if isinstance(v, list):
                stack.extend((x, f"{w}[{i}]", depth + 1) for i, x in enumerate(v))
            elif isinstance(v, dict):
                for k, x in v.items():
                    if not isinstance(k, str):
                        raise SchemaError(f"key {shown(k)} is not a string").inside(w)
                    stack.append((x, f"{w}.{k}", depth + 1))
            else:
                raise SchemaError(f"must be plain data, got {shown(v)}").inside(w)
        return value


class Unique:
    """Remembers the ids seen so far and names the first place of a duplicate."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[str, str] = {}

    def add(self, key: str, where: str) -> None:
        first = self.seen.get(key)
        if first is not None:
            raise fail(where, f"duplicate {self.what} {key!r} (also {first})")
        self.seen[key] = where


# -- reading files ---------------------------------------------------------------------------
def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The text of a regular file of at most ``max_bytes`` bytes (UTF-8, BOM allowed). The
    size is checked before reading and again while reading (``/proc`` files lie about it)."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(f"{what} file {str(p)!r} does not exist")
        if not p.is_file():
            raise InputError(f"{what} file {str(p)!r} is not a regular file")
        if p.stat().st_size > max_bytes:
            raise InputError(
                f"{p}: {p.stat().st_size} bytes, a {what} file may have at most {max_bytes}"
            )
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"{p}: cannot read {what} file ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise InputError(f"{p}: a {what} file may have at most {max_bytes} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text (byte {e.start})") from None


def parse_document(text: str, source: str, yaml_ok: bool) -> Any:
    """JSON (or, with ``yaml_ok``, YAML: JSON is YAML) with duplicate keys, YAML aliases and
    nesting deeper than MAX_DEPTH refused, and non-finite JSON literals left to the schema."""
    if not yaml_ok:
        return parse_json(text, source)
    _scan_yaml(text, source)
    try:
        return yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML ({_first_line(e)})") from None
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an int of 10^5 digits
        raise InputError(f"{source}: not valid YAML ({_first_line(e)})") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise InputError(f"{source}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except _DuplicateKey as e:
        raise InputError(f"{source}: duplicate key {e.args[0]!r} in a JSON object") from None
    except RecursionError:
        raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise InputError(f"{source}: not valid JSON ({_first_line(e)})") from None


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NODE_START = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
_NODE_END = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _scan_yaml(text: str, source: str) -> None:
    """One pass over the YAML events (libyaml's parser is iterative and cheap) before any
    object is built: nesting within MAX_DEPTH, no aliases (a few nested aliases make a
    document of billions of nodes), scalar keys, no duplicate key in a mapping."""
    # per open collection: [is_mapping, next node is a key, keys seen]
    stack: list[list[Any]] = []
    try:
        for ev in yaml.parse(text, Loader=_YAML_LOADER):
            if isinstance(ev, yaml.AliasEvent):
                raise InputError(
                    f"{source}: line {ev.start_mark.line + 1}: YAML aliases (*{ev.anchor}) "
                    "are not supported: write the value out"
                )
            if isinstance(ev, _NODE_START):
                if stack and stack[-1][0]:
                    top = stack[-1]
                    if top[1]:
                        if not isinstance(ev, yaml.ScalarEvent):
                            raise InputError(
                                f"{source}: line {ev.start_mark.line + 1}: a mapping key must "
                                "be a plain string"
                            )
                        if ev.value in top[2]:
                            raise InputError(
                                f"{source}: line {ev.start_mark.line + 1}: duplicate key "
                                f"{ev.value!r}"
                            )
                        top[2].add(ev.value)
                    top[1] = not top[1]
                if not isinstance(ev, yaml.ScalarEvent):
                    stack.append([isinstance(ev, yaml.MappingStartEvent), True, set()])
                    if len(stack) > MAX_DEPTH:
                        raise InputError(
                            f"{source}: line {ev.start_mark.line + 1}: nested deeper than "
                            f"{MAX_DEPTH} levels"
                        )
            elif isinstance(ev, _NODE_END):
                stack.pop()
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return " ".join(lines[:3])[:200] if lines else type(e).__name__


def read_document(path: str | Path, what: str, max_bytes: int, max_yaml_bytes: int) -> Any:
    """Read and parse a JSON or YAML file (``.json``: JSON only; ``.yaml``/``.yml``: YAML,
    with the smaller bound ``max_yaml_bytes`` as YAML parses about 50x slower)."""
    p = Path(path)
    is_json = p.suffix.lower() == ".json"
    text = read_text(p, what, max_bytes if is_json else min(max_bytes, max_yaml_bytes))
    return parse_document(text, str(p), yaml_ok=not is_json)
