"""Plan JSON from the wire or a file, checked before anything reads it (issue 10 item 4).

``ApplyPlan`` bodies and ``--plan`` files are hostile until checked: :func:`parse_plan` bounds
the size, parses the JSON (no NaN/Infinity), and walks the dict against the
:class:`~controller.plan.Plan` dataclasses (types from their annotations, so additive fields
are followed without an edit here; unknown keys refused), raising :class:`PlanInputError`
with the path of the offending item (``prefill.groups[0].gpus[2]: expected a string, got
5``). Semantic checks (schemes, paths, slots, the cluster) follow in
:func:`controller.service.policies.validate` and ``check_cluster``.

Note: the input-validation work (issue 10 items 8-10) is adding one schema for every plan
reader; when it lands, this module should call it instead of walking the dataclasses itself.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any, Literal

from controller.plan import Plan

# A plan for the largest built-in cluster (9,600 GPUs) is a few MB of JSON; the controller's
# gRPC receive limit (controller.service.server.MAX_MESSAGE_BYTES) is the same figure.
MAX_PLAN_BYTES = 16 << 20
MAX_DEPTH = 32  # the Plan format nests 7 deep (plan.phase.groups[i].rails[j].paths[g][k])


class PlanInputError(ValueError):
    """A plan text that is not a Plan; the message names where."""


def _reject_constant(name: str) -> float:
    raise PlanInputError(f"plan JSON holds {name}, which is not a number")


def parse_plan(text: str | bytes) -> Plan:
    """The :class:`Plan` in ``text`` (JSON), or :class:`PlanInputError` naming the problem."""
    return parse_plan_canonical(text)[0]


def parse_plan_canonical(text: str | bytes) -> tuple[Plan, str]:
    """:func:`parse_plan` and the plan's canonical JSON, ``Plan.to_json(indent=None)`` (what
    the plan id hashes), made from the checked input rather than by serialising the Plan
    again (``dataclasses.asdict`` was a third of an ApplyPlan of 1,000 GPUs)."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanInputError(f"plan is {len(text)} bytes, above the limit of {MAX_PLAN_BYTES}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanInputError(f"plan is not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        raise PlanInputError("plan holds a NUL character: not JSON text")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except PlanInputError:
        raise
    except RecursionError:
        raise PlanInputError("plan JSON is nested too deeply") from None
    except ValueError as exc:
        raise PlanInputError(f"plan is not JSON: {exc}") from None
    try:
        canonical = _check(data, Plan, 0)
    except _Bad as exc:
        raise PlanInputError(f"{exc.where('plan')}: {exc.message}") from None
    try:
        plan = Plan.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:  # the walk above should make this unreachable
        raise PlanInputError(f"plan: {exc}") from None
    return plan, json.dumps(canonical)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


class _Bad(Exception):
    """A check that failed; containers add their step to ``where`` on the way out, so the
    happy path builds no path strings."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.steps: list[str] = []

    def where(self, root: str) -> str:
        return root + "".join(reversed(self.steps))


def _check(value: Any, tp: Any, depth: int) -> Any:
    """Raise _Bad unless ``value`` (parsed JSON) fits type annotation ``tp``; return it as
    ``dataclasses.asdict`` of the parsed Plan would give it (objects of a dataclass in field
    order with defaults filled in; everything else as it is)."""
    if depth > MAX_DEPTH:
        raise _Bad("nested too deeply")
    if tp is str:  # the common cases first: this walk runs over every item of a plan
        if not isinstance(value, str):
            raise _Bad(f"expected a string, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Bad(f"expected a number, got {_kind(value)}")
        if not math.isfinite(float(value)):
            raise _Bad(f"{value} is not finite")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected an integer, got {_kind(value)}")
        if abs(value) >= 1 << 63:
            raise _Bad(f"integer {value} out of range")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise _Bad(f"expected true or false, got {_kind(value)}")
        return value
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise _Bad(f"expected a list, got {_kind(value)}")
        (item,) = typing.get_args(tp)
        if item is str:  # lists of names: the bulk of a plan
            if all(type(v) is str for v in value):
                return value
        out = []
        for i, v in enumerate(value):
            try:
                out.append(_check(v, item, depth + 1))
            except _Bad as exc:
                exc.steps.append(f"[{i}]")
                raise
        return out
    if origin is dict:
        if not isinstance(value, dict):
            raise _Bad(f"expected an object, got {_kind(value)}")
        _, item = typing.get_args(tp)
        out_d = {}
        for k, v in value.items():
            try:
                out_d[k] = _check(v, item, depth + 1)
            except _Bad as exc:
                exc.steps.append(f"[{k[:40]!r}]")
                raise
        return out_d
    if origin in (typing.Union, types.UnionType):
        alts = typing.get_args(tp)
        if value is None:
            if type(None) not in alts:
                raise _Bad("may not be null")
            return None
        first: _Bad | None = None
        for alt in alts:
            if alt is type(None):
                continue
            try:
                return _check(value, alt, depth)
            except _Bad as exc:
                first = first or exc
        assert first is not None
        raise first
    if tp is type(None):
        if value is not None:
            raise _Bad(f"expected null, got {_kind(value)}")
        return None
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise _Bad(f"{str(value)[:40]!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        return _check_dataclass(value, tp, depth)
    raise _Bad(f"unsupported type {tp!r}")  # a Plan field of a new kind


_REQUIRED = object()  # marks a field without a default


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """field -> (type, default factory or _REQUIRED) of a Plan dataclass, in field order,
    resolved once: the annotations are strings (``from __future__ import annotations``), and
    evaluating them per object cost most of an ApplyPlan."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            default: Any = f.default_factory
        elif f.default is not dataclasses.MISSING:
            default = functools.partial(lambda v: v, f.default)
        else:
            default = _REQUIRED
        out[f.name] = (hints[f.name], default)
    return out


def _check_dataclass(value: Any, cls: type, depth: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"expected an object, got {_kind(value)}")
    fields = _fields(cls)
    for key in value:
        if key not in fields:
            exc = _Bad("unknown key")
            exc.steps.append(f".{str(key)[:40]}")
            raise exc
    out: dict[str, Any] = {}
    for name, (tp, default) in fields.items():
        if name not in value:
            if default is _REQUIRED:
                exc = _Bad("missing")
                exc.steps.append(f".{name}")
                raise exc
            out[name] = _plain(default())
            continue
        try:
            out[name] = _check(value[name], tp, depth + 1)
        except _Bad as exc:
            exc.steps.append(f".{name}")
            raise
    return out


def _plain(value: Any) -> Any:
    """A dataclass default as ``dataclasses.asdict`` writes it (defaults are plain values or
    empty containers; a dataclass default would be converted)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
