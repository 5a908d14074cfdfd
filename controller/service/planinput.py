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
    _check(data, Plan, "plan", 0)
    try:
        return Plan.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:  # the walk above should make this unreachable
        raise PlanInputError(f"plan: {exc}") from None


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _check(value: Any, tp: Any, where: str, depth: int) -> None:
    """Raise PlanInputError unless ``value`` (parsed JSON) fits type annotation ``tp``."""
    if depth > MAX_DEPTH:
        raise PlanInputError(f"{where}: nested too deeply")
    origin = typing.get_origin(tp)
    if tp is Any:
        return
    if origin in (typing.Union, types.UnionType):
        alts = typing.get_args(tp)
        if value is None:
            if type(None) not in alts:
                raise PlanInputError(f"{where}: may not be null")
            return
        first: PlanInputError | None = None
        for alt in alts:
            if alt is type(None):
                continue
            try:
                _check(value, alt, where, depth)
                return
            except PlanInputError as exc:
                first = first or exc
        assert first is not None
        raise first
    if tp is type(None):
        if value is not None:
            raise PlanInputError(f"{where}: expected null, got {_kind(value)}")
        return
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise PlanInputError(f"{where}: {str(value)[:40]!r} is not one of {list(allowed)}")
        return
    if dataclasses.is_dataclass(tp):
        _check_dataclass(value, tp, where, depth)
        return
    if origin is list:
        if not isinstance(value, list):
            raise PlanInputError(f"{where}: expected a list, got {_kind(value)}")
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            _check(v, item, f"{where}[{i}]", depth + 1)
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise PlanInputError(f"{where}: expected an object, got {_kind(value)}")
        _, item = typing.get_args(tp)
        for k, v in value.items():
            _check(v, item, f"{where}[{k[:40]!r}]", depth + 1)
        return
    if tp is str:
        if not isinstance(value, str):
            raise PlanInputError(f"{where}: expected a string, got {_kind(value)}")
        return
    if tp is bool:
        if not isinstance(value, bool):
            raise PlanInputError(f"{where}: expected true or false, got {_kind(value)}")
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlanInputError(f"{where}: expected an integer, got {_kind(value)}")
        if abs(value) >= 1 << 63:
            raise PlanInputError(f"{where}: integer {value} out of range")
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanInputError(f"{where}: expected a number, got {_kind(value)}")
        if not math.isfinite(float(value)):
            raise PlanInputError(f"{where}: {value} is not finite")
        return
    raise PlanInputError(f"{where}: unsupported type {tp!r}")  # a Plan field of a new kind


def _check_dataclass(value: Any, cls: type, where: str, depth: int) -> None:
    if not isinstance(value, dict):
        raise PlanInputError(f"{where}: expected an object, got {_kind(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            raise PlanInputError(f"{where}.{str(key)[:40]}: unknown key")
    for name, f in fields.items():
        if name not in value:
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            if not has_default:
                raise PlanInputError(f"{where}.{name}: missing")
            continue
        _check(value[name], hints[name], f"{where}.{name}", depth + 1)
