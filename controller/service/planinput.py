"""Plan JSON from the wire or a file, checked before anything reads it.

``ApplyPlan`` bodies and ``--plan`` files are hostile until checked: :func:`parse_plan`
bounds the size and the encoding, then hands the text to the project's one plan schema
(:func:`controller.inputs.plan_checks.parse_plan`: strict JSON, types and ranges derived from the
Plan dataclasses, unknown keys refused, every GPU used once, groups matching instances), so a
plan gets the same answer here as from every other command. A refusal is
:class:`~controller.errors.InputError` naming the item (``plan: prefill.groups[0].gpus:
...``). What only the controller needs (INA worker counts, node names, rails) follows in
:func:`controller.service.admission.validate`, and the plan against its cluster in
:func:`controller.inputs.plan_checks.check_plan_on_topology`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from controller.errors import InputError
from controller.inputs.limits import MAX_PLAN_BYTES as SCHEMA_MAX_PLAN_BYTES
from controller.inputs.plan_checks import parse_plan as parse_plan_text
from controller.plan import Plan

# The plan files' own limit (controller/inputs/limits.py), so a plan gets the same answer from
# the controller as from every other command; the controller's gRPC receive limit
# (controller.service.server.MAX_MESSAGE_BYTES) follows it.
MAX_PLAN_BYTES = SCHEMA_MAX_PLAN_BYTES
Parsed = tuple[Plan, str]  # what parse_plan_canonical returns: the plan and its canonical JSON


def parse_plan(text: str | bytes, source: str = "plan") -> Plan:
    """The :class:`Plan` in ``text`` (JSON), or :class:`InputError` naming the problem
    (after ``source``: "plan" for a request, the file for ``--plan``)."""
    return parse_plan_canonical(text, source)[0]


def parse_plan_canonical(text: str | bytes, source: str = "plan") -> Parsed:
    """:func:`parse_plan` and the plan's canonical JSON, the text ``Plan.to_json(indent=None)``
    gives (what the plan id hashes), written without ``dataclasses.asdict``'s deep copies (a
    tenth of an ApplyPlan of 1,000 GPUs)."""
    if len(text) > MAX_PLAN_BYTES:
        raise InputError(f"{source}: {len(text)} bytes, above the limit of {MAX_PLAN_BYTES}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    if "\x00" in text:
        raise InputError(f"{source}: holds a NUL character, not JSON text")
    plan = parse_plan_text(text, source)
    return plan, json.dumps(plain(plan))


def plain(value: Any) -> Any:
    """``value`` as ``dataclasses.asdict`` gives it for JSON, sharing the leaves instead of
    copying them (the result is only serialised)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value] if value and _nested(value[0]) else value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()} if _has_nested(value) else value
    return value


def _nested(v: Any) -> bool:
    return dataclasses.is_dataclass(v) or isinstance(v, list | tuple | dict)


def _has_nested(d: dict) -> bool:
    return any(_nested(v) for v in d.values())
