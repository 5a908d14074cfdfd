"""The one validation layer for input documents: a typed schema.

Every topology, plan and trace file is read by :mod:`controller.inputs.documents` and then
checked by a :class:`Spec` that checks types, finite numbers within ranges, list lengths and
string lengths, and refuses unknown keys::

    links[3]: unknown key (did you mean latency_us?)

Errors are :class:`controller.errors.InputError` naming the offending item's place
(``where``): one line and exit 2 from the CLI, INVALID_ARGUMENT from the controller. A
message never quotes a string the document holds that the schema refused, nor a key it does
not know (:func:`shown`): the place and the rule say what is wrong, and a file read by
mistake (a private key as a topology) is not echoed.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.errors import InputError
from controller.inputs.limits import MAX_STRING


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
    """A value as an error message shows it: short, one line; a string only as its kind and
    length (it may be any text of the file)."""
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return "a string" if v else "an empty string"
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
            raise SchemaError(f"must be one of {', '.join(self.choices)}")
        if len(value) > self.max_len:
            raise SchemaError(f"longer than {self.max_len} characters")
        if len(value) < self.min_len:
            raise SchemaError("must not be empty")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise SchemaError(f"must be {self.what}")
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
        for i, (k, v) in enumerate(value.items()):
            try:
                self.key.check(k)
            except SchemaError as e:  # a refused key is named by its position, not quoted
                raise SchemaError(f"key {i + 1}: {e.message}") from None
            try:
                out[k] = self.value.check(v)
            except SchemaError as e:  # k passed its spec (an id): named
                raise e.inside(f".{k}") from None
        return out


@dataclass(frozen=True)
class Key:
    """One key of a :class:`Record`; a key that is not ``required`` may be absent."""

    spec: Spec
    required: bool = False


@dataclass(frozen=True)
class Record(Spec):
    """A mapping with a fixed set of keys: an unknown key is an error naming its position
    (and the closest known key), a missing required key too. ``build`` turns the checked dict into
    the program's object (a dataclass, say)."""

    keys: Mapping[str, Key]
    build: Callable[[dict[str, Any]], Any] | None = None
    what: str = "a mapping"

    def check(self, value: Any) -> Any:
        if value.__class__ is not dict:
            raise SchemaError(f"must be {self.what}, got {shown(value)}")
        keys = self.keys
        if not keys.keys() >= value.keys():
            # named by position, not quoted: the key is the document's text
            i, k = next((i, k) for i, k in enumerate(value) if k not in keys)
            raise SchemaError(f"key {i + 1}: {unknown_key(str(k), tuple(keys))}")
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
    mapping: bool = False  # the value itself must be a string-keyed mapping (a plan's options)

    def check(self, value: Any) -> Any:
        if self.mapping and value.__class__ is not dict:
            raise SchemaError(f"must be a mapping, got {shown(value)}")
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
                for i, (k, x) in enumerate(v.items()):
                    if not isinstance(k, str):
                        raise SchemaError(f"key {i + 1} is not a string").inside(w)
                    # free keys are the document's text: named by position (``options{3}``)
                    stack.append((x, f"{w}{{{i + 1}}}", depth + 1))
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
