"""Plan files: their schema, derived from the dataclasses of ``controller/plan.py``, and the
checks a plan must pass on its own and against a cluster.

The schema follows the dataclasses: every field is a key (a field with a default may be
absent), its annotation gives the type (``int``, ``float``, ``str``, ``bool``, ``Literal``,
``list[...]``, ``dict[str, ...]``, ``X | None``, another dataclass, ``Any`` for plain JSON
data), and any other key is refused by name. A field added to a dataclass is accepted
without touching this module; ``_FIELD_RULES`` only narrows ranges. Numbers are finite;
unless a rule says otherwise they are non-negative (times, bytes, rates and counts).

:func:`validate_plan_dict` checks a plan on its own (types, ranges, every GPU used once,
groups matching the instances, paths starting at their member, slot ranges inside the 16-bit
slot field); :func:`check_plan_on_topology` checks it against a cluster graph (every GPU,
switch and hop exists). The simulator, the controller and export call both.
:func:`check_dataplane_lanes` checks that the plan was priced for the lanes the switches
aggregate: the controller and export call it, the simulator does not (a plan priced for
other lanes is a what-if to simulate, not to serve).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import networkx as nx

from agents.ina.packet import DATAPLANE_LANE_FORMATS, DEFAULT_LANE_FORMAT
from controller.errors import InputError
from controller.inputs.documents import parse_json, read_text
from controller.inputs.limits import (
    MAX_AGGREGATOR_SLOTS,
    MAX_BATCH,
    MAX_GPUS,
    MAX_ID_CHARS,
    MAX_LIST,
    MAX_OPTION_ITEMS,
    MAX_PARALLEL,
    MAX_PATH_NODES,
    MAX_PLAN_BYTES,
    MAX_PLAN_COMMAS,
    MAX_SLA_S,
)
from controller.inputs.schema import (
    Bool,
    Key,
    ListOf,
    MapOf,
    Nullable,
    Number,
    PlainData,
    Record,
    SchemaError,
    Spec,
    Str,
    fail,
    item,
)
from controller.plan import SLA, Group, Instance, PhasePlan, Plan, Rail, SlotRange

NODE_NAME = Str(max_len=MAX_ID_CHARS, min_len=1, what="a node id")
PATH = ListOf(NODE_NAME, MAX_PATH_NODES, min_len=1)
_SLA_KEYS = {
    "ttft_s": Key(Number(low=0, low_open=True, high=MAX_SLA_S), required=True),
    "tpot_s": Key(Number(low=0, low_open=True, high=MAX_SLA_S), required=True),
    "attainment": Key(Number(low=0, low_open=True, high=1)),
}
assert set(_SLA_KEYS) == {f.name for f in dataclasses.fields(SLA)}

# Narrower specs for some fields ("Class.field"): a Spec, or a function of the field's default
# spec (to narrow a list's length and keep its items' spec); every other field gets the
# default of its annotation (see ``_spec_of``).
_FIELD_RULES: dict[str, Spec | Callable[[Any], Spec]] = {
    "Plan.sla": Record(_SLA_KEYS, build=lambda d: SLA(**d), what="a mapping (SLA)"),
    "Plan.options": PlainData(MAX_OPTION_ITEMS, mapping=True),
    "PhasePlan.tp": Number(low=1, high=MAX_PARALLEL, integer=True),
    "PhasePlan.pp": Number(low=1, high=MAX_PARALLEL, integer=True),
    "PhasePlan.batch_size": Number(low=1, high=MAX_BATCH, integer=True),
    # a phase may have no instance: the controller serves such partial plans; the simulator,
    # which needs both phases, says so itself
    "PhasePlan.instances": lambda default: dataclasses.replace(default, max_len=MAX_GPUS),
    "Instance.stages": ListOf(ListOf(NODE_NAME, MAX_PARALLEL, min_len=1), MAX_PARALLEL, min_len=1),
    "Instance.batch": Number(low=0, high=MAX_BATCH, integer=True),
    "Group.gpus": ListOf(NODE_NAME, MAX_PARALLEL, min_len=1),
    "Group.paths": MapOf(NODE_NAME, PATH, MAX_PARALLEL),
    "Group.switch": Nullable(NODE_NAME),
    "Rail.switch": NODE_NAME,
    "Rail.members": ListOf(NODE_NAME, MAX_PARALLEL, min_len=1),
    "Rail.paths": MapOf(NODE_NAME, PATH, MAX_PARALLEL),
    "Rail.shards": Number(low=1, high=MAX_PARALLEL, integer=True),
    "SlotRange.start": Number(low=0, high=MAX_AGGREGATOR_SLOTS - 1, integer=True),
    "SlotRange.count": Number(low=1, high=MAX_AGGREGATOR_SLOTS, integer=True),
    "KVTransfer.src": NODE_NAME,
    "KVTransfer.dst": NODE_NAME,
    "KVTransfer.path": PATH,
    "Predicted.gpus_used": Number(low=0, high=MAX_GPUS, integer=True),
}


def _spec_of(hint: Any, rule: str) -> Spec:
    """The spec of a type annotation (``rule`` names the field, for ``_FIELD_RULES``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise TypeError(f"{rule}: only 'X | None' unions are supported")
        return Nullable(_spec_of(rest[0], rule))
    if origin is typing.Literal:
        return Str(choices=tuple(str(a) for a in args))
    if origin is list:
        return ListOf(_spec_of(args[0], rule), MAX_LIST)
    if origin is dict:
        return MapOf(Str(), _spec_of(args[1], rule), MAX_LIST)
    if hint is Any:
        return PlainData(MAX_OPTION_ITEMS)
    if dataclasses.is_dataclass(hint):
        return dataclass_spec(hint)
    simple = {
        str: Str(),
        int: Number(low=0, high=2**53, integer=True),
        float: Number(low=0),
        bool: Bool(),
    }
    if hint in simple:
        return simple[hint]
    raise TypeError(f"{rule}: no schema for annotation {hint!r}")


@functools.cache
def dataclass_spec(cls: type) -> Record:
    """A Record of the dataclass ``cls``: its fields are the keys, those without a default
    are required, and the checked mapping is built into ``cls``."""
    hints = typing.get_type_hints(cls)
    keys: dict[str, Key] = {}
    for f in dataclasses.fields(cls):
        rule = f"{cls.__name__}.{f.name}"
        narrow = _FIELD_RULES.get(rule)
        if isinstance(narrow, Spec):
            spec = narrow
        else:
            spec = _spec_of(hints[f.name], rule)
            if narrow is not None:
                spec = narrow(spec)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        keys[f.name] = Key(spec, required=required)
    return Record(keys, build=lambda d: cls(**d), what=f"a mapping ({cls.__name__})")


# -- entry points ----------------------------------------------------------------------------
def load_plan(path: str | Path) -> Plan:
    """Read, parse and check a plan file (``heroserve plan --json`` writes them)."""
    p = Path(path)
    text = read_text(p, "plan", MAX_PLAN_BYTES)
    return parse_plan(text, str(p))


def parse_plan(text: str, source: str = "plan") -> Plan:
    """A plan from its JSON text (a file's or a gRPC request's)."""
    if text.count(",") > MAX_PLAN_COMMAS:  # a C scan, before the costly decoding
        raise InputError(f"{source}: more than {MAX_PLAN_COMMAS} values (commas)")
    return validate_plan_dict(parse_json(text, source), source)


def validate_plan_dict(d: Any, source: str = "plan") -> Plan:
    """The :class:`Plan` of a parsed plan document, checked on its own; InputError names the
    offending item (``decode.groups[2].scheme: must be one of ina, ring, hier``)."""
    try:
        plan = dataclass_spec(Plan).check(d)
    except SchemaError as e:
        top = "" if e.segments else "not a plan: "  # {} or [] is not a plan at all
        raise InputError(f"{source}: {top}{e}") from None
    try:
        _check_consistent(plan)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return plan


def _check_consistent(plan: Plan) -> None:
    # GPU -> (phase, instance, stage, position): its first place, formatted only on an error
    owner: dict[str, tuple[str, int, int, int]] = {}
    for phase in (plan.prefill, plan.decode):
        name = phase.role
        expected = "prefill" if phase is plan.prefill else "decode"
        if name != expected:
            raise fail(f"{expected}.role", f"must be {expected!r}, got {name!r}")
        for i, inst in enumerate(phase.instances):
            _check_instance(phase, i, inst, owner)
        seen: set[tuple[int, int]] = set()
        for k, gr in enumerate(phase.groups):
            where = f"{name}.groups[{k}]"
            key = (gr.instance, gr.stage)
            if key in seen:
                raise fail(where, f"a second group for instance {gr.instance} stage {gr.stage}")
            seen.add(key)
            _check_group(phase, gr, where)
    for k, t in enumerate(plan.kv_transfer):
        if owner.get(t.src, ("",))[0] != "prefill":
            raise fail(f"kv_transfer[{k}].src", f"{t.src!r} is not a prefill GPU of the plan")
        if owner.get(t.dst, ("",))[0] != "decode":
            raise fail(f"kv_transfer[{k}].dst", f"{t.dst!r} is not a decode GPU of the plan")
        if t.path[0] != t.src or t.path[-1] != t.dst:
            raise fail(f"kv_transfer[{k}].path", f"must go from {t.src!r} to {t.dst!r}")


def _place(at: tuple[str, int, int, int]) -> str:
    role, i, s, j = at
    return f"{role}.instances[{i}].stages[{s}][{j}]"


def _check_instance(
    phase: PhasePlan, i: int, inst: Instance, owner: dict[str, tuple[str, int, int, int]]
) -> None:
    if len(inst.stages) != phase.pp:
        raise fail(
            f"{phase.role}.instances[{i}].stages",
            f"{len(inst.stages)} stages, the phase's PP is {phase.pp}",
        )
    for s, stage in enumerate(inst.stages):
        if len(stage) != phase.tp:
            raise fail(
                f"{phase.role}.instances[{i}].stages[{s}]",
                f"{len(stage)} GPUs, the phase's TP is {phase.tp}",
            )
        for j, gpu in enumerate(stage):
            here = (phase.role, i, s, j)
            first = owner.setdefault(gpu, here)
            if first is not here:
                raise fail(_place(here), f"GPU {gpu!r} is used twice (also {_place(first)})")


def _check_group(phase: PhasePlan, gr: Group, where: str) -> None:
    if gr.instance >= len(phase.instances):
        raise fail(f"{where}.instance", f"no instance {gr.instance} in {phase.role}")
    stages = phase.instances[gr.instance].stages
    if gr.stage >= len(stages):
        raise fail(f"{where}.stage", f"instance {gr.instance} has no stage {gr.stage}")
    if gr.gpus != stages[gr.stage] and sorted(gr.gpus) != sorted(stages[gr.stage]):
        raise fail(f"{where}.gpus", f"must be the GPUs of instance {gr.instance} stage {gr.stage}")
    members = set(gr.gpus)
    _check_paths(gr.paths, members, f"{where}.paths")
    if gr.scheme == "ina":
        if gr.switch is None:
            raise fail(f"{where}.switch", "an INA group needs its aggregation switch")
        _check_reach(gr.paths, gr.gpus, gr.switch, f"{where}.paths")
    if gr.scheme == "hier" and not gr.rails:
        raise fail(f"{where}.rails", "a hier group needs its rails")
    _check_slots(gr.slots, f"{where}.slots")
    for r, rail in enumerate(gr.rails):
        w = item(f"{where}.rails", r)
        _check_rail(rail, members, w)


def _check_rail(rail: Rail, members: set[str], where: str) -> None:
    if rail.shard >= rail.shards:
        raise fail(f"{where}.shard", f"must be below shards ({rail.shards}), got {rail.shard}")
    for m in rail.members:
        if m not in members:
            raise fail(f"{where}.members", f"{m!r} is not a member of the group")
    _check_paths(rail.paths, set(rail.members), f"{where}.paths")
    _check_reach(rail.paths, rail.members, rail.switch, f"{where}.paths")
    _check_slots(rail.slots, f"{where}.slots")


def _check_reach(paths: dict[str, list[str]], members: list[str], switch: str, where: str) -> None:
    """Every member of an aggregation group has a path, and it reaches the switch."""
    for m in members:
        if m not in paths:
            raise fail(where, f"no path for member {m!r}")
        if switch not in paths[m]:
            raise fail(f"{where}.{m}", f"never reaches the aggregation switch {switch!r}")


def _check_paths(paths: dict[str, list[str]], members: set[str], where: str) -> None:
    for gpu, path in paths.items():
        if gpu not in members:
            raise fail(f"{where}.{gpu}", f"{gpu!r} is not a member")
        if path[0] != gpu:
            raise fail(f"{where}.{gpu}", f"must start at {gpu!r}, got {path[0]!r}")


def _check_slots(slots: SlotRange | None, where: str) -> None:
    if slots is not None and slots.start + slots.count > MAX_AGGREGATOR_SLOTS:
        raise fail(where, f"ends past slot {MAX_AGGREGATOR_SLOTS} (the slot field is 16 bits)")


def check_dataplane_lanes(plan: Plan) -> None:
    """Raise :class:`InputError` when ``plan`` was priced for an INA lane format the
    switches' program does not aggregate (``agents.ina.packet.DATAPLANE_LANE_FORMATS``):
    served, its INA groups would run on other lanes than their prices and tables assume.
    Where a plan is served (the controller's admission, the export), not where it is only
    simulated."""
    lanes = plan.options.get("ina_lanes", DEFAULT_LANE_FORMAT)
    if lanes not in DATAPLANE_LANE_FORMATS:
        shown = repr(lanes[:16]) if isinstance(lanes, str) else type(lanes).__name__
        runs = " or ".join(DATAPLANE_LANE_FORMATS)
        raise InputError(
            f"plan priced for {shown} INA lanes, but the switches' program "
            f"(p4/heroserve_ina.p4) aggregates {runs} lanes: plan again with "
            f"--ina-lanes {DEFAULT_LANE_FORMAT}"
        )


def check_plan_on_topology(plan: Plan, g: nx.Graph) -> None:
    """Every GPU of ``plan`` is a GPU of ``g``, every switch it names an INA-capable switch
    of ``g`` with room for the group's slot range, every hop of every path a link of ``g``.
    InputError names the first item that is not."""
    for phase in (plan.prefill, plan.decode):
        for i, inst in enumerate(phase.instances):
            for s, stage in enumerate(inst.stages):
                for j, gpu in enumerate(stage):
                    d = g.nodes.get(gpu, {})
                    where = f"{phase.role}.instances[{i}].stages[{s}][{j}]"
                    if d.get("kind") != "gpu":
                        raise InputError(f"{where}: GPU {gpu!r} is not in topology {g.name!r}")
                    if d.get("role", "any") not in ("any", phase.role):
                        raise InputError(
                            f"{where}: GPU {gpu!r} is reserved for {d['role']} in {g.name!r}"
                        )
        for k, gr in enumerate(phase.groups):
            where = item(f"{phase.role}.groups", k)
            if gr.switch is not None:
                _check_switch(g, gr.switch, gr.slots, f"{where}.switch")
            _check_hops(g, gr.paths, f"{where}.paths")
            for r, rail in enumerate(gr.rails):
                w = item(f"{where}.rails", r)
                _check_switch(g, rail.switch, rail.slots, f"{w}.switch")
                _check_hops(g, rail.paths, f"{w}.paths")
    for k, t in enumerate(plan.kv_transfer):
        _check_hops(g, {t.src: t.path}, item("kv_transfer", k))


def _check_switch(g: nx.Graph, sw: str, slots: SlotRange | None, where: str) -> None:
    d = g.nodes.get(sw, {})
    if d.get("kind") != "switch":
        raise InputError(f"{where}: {sw!r} is not a switch of topology {g.name!r}")
    if not d.get("ina", False):
        raise InputError(f"{where}: switch {sw!r} cannot aggregate (ina: false)")
    room = d.get("aggregator_slots", MAX_AGGREGATOR_SLOTS)
    if slots is not None and slots.start + slots.count > room:
        raise InputError(f"{where}: slots {slots.start}+{slots.count} past {sw!r}'s {room}")


def _check_hops(g: nx.Graph, paths: dict[str, list[str]], where: str) -> None:
    for key, path in paths.items():
        for u, v in zip(path, path[1:], strict=False):
            if not g.has_edge(u, v):
                raise InputError(
                    f"{where}: hop {u} - {v} of {key}'s path is not a link of {g.name!r}"
                )
