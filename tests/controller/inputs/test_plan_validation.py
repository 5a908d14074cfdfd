"""Plan files: the schema derived from the Plan dataclasses, the plan's own consistency and
its fit to a cluster."""

import copy
import dataclasses
import json
import math
import re
from typing import Any, Literal

import numpy as np
import pytest

from controller.errors import InputError
from controller.inputs.plan_checks import (
    check_plan_on_topology,
    dataclass_spec,
    load_plan,
    parse_plan,
    validate_plan_dict,
)
from controller.models import model_spec
from controller.plan import Plan
from controller.planner import BASELINES, PlannerOptions, plan
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    g = make_testbed(fixed_roles=True)
    args = (g, model_spec("OPT-66B"), chatbot(n=2000), default_sla("chatbot"))
    out = {}
    for n in ["heroserve", *BASELINES]:
        try:
            # the layout the cases below name: prefill 1x4 on srv0-1, decode 4x2 on srv2-3
            out[n] = plan(*args, PlannerOptions(prefill_par=(1, 4), decode_par=(4, 2)), planner=n)
        except InputError:  # distserve-paper needs nodes free to hold both roles
            pass
    return out


@pytest.fixture
def doc(plans) -> dict[str, Any]:
    return json.loads(plans["heroserve"].to_json())


def test_every_planners_plan_reads_back_equal(plans):
    for p in plans.values():
        assert validate_plan_dict(json.loads(p.to_json())) == p
        assert parse_plan(p.to_json()) == p


def test_fields_with_defaults_may_be_absent(doc, plans):
    """A plan written before rails, hier_s, batch, rate and options existed still reads."""
    for phase in ("prefill", "decode"):
        for g in doc[phase]["groups"]:
            del g["rails"], g["hier_s"]
        for i in doc[phase]["instances"]:
            del i["batch"], i["rate"]
    del doc["options"], doc["notes"]
    p = validate_plan_dict(doc)
    assert p.decode.groups[0].rails == [] and p.options == {} and p.decode.instances[0].batch == 0


def test_schema_follows_the_dataclasses():
    """Every annotation kind a Plan field uses is derived, so a new field needs no change."""

    @dataclasses.dataclass
    class Inner:
        x: int

    @dataclasses.dataclass
    class Outer:
        name: str
        kind: Literal["a", "b"]
        inner: Inner
        items: list[Inner]
        table: dict[str, list[str]]
        maybe: float | None
        flag: bool = False
        extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    spec = dataclass_spec(Outer)
    good = {"name": "n", "kind": "a", "inner": {"x": 1}, "items": [{"x": 2}],
            "table": {"k": ["v"]}, "maybe": None}  # fmt: skip
    o = spec.check(good)
    assert o == Outer("n", "a", Inner(1), [Inner(2)], {"k": ["v"]}, None)
    for change, message in [
        ({"kind": "c"}, "kind: must be one of a, b"),
        ({"inner": {"x": 1, "y": 2}}, "inner: key 2: unknown key; allowed: x"),
        ({"items": [{"x": 1.5}]}, "items[0].x: must be an integer, got 1.5"),
        ({"maybe": math.inf}, "maybe: must be a finite number, got inf"),
        ({"table": {"k": [3]}}, "table.k[0]: must be a string, got 3"),
        ({"flag": 1}, "flag: must be true or false, got 1"),
        ({"extra": {"a": [math.nan]}}, "extra.a[0]: must be a finite number, got nan"),
        ({"nmae": "x"}, "key 7: unknown key (did you mean name?)"),
    ]:
        with pytest.raises(InputError) as e:
            spec.check({**good, **change})
        assert str(e.value) == message
    with pytest.raises(InputError, match="missing 'inner'"):
        spec.check({k: v for k, v in good.items() if k != "inner"})


def _set(d: dict, path: str, value: Any) -> None:
    *head, last = path.split("/")
    for k in head:
        d = d[int(k)] if isinstance(d, list) else d[k]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("decode/groups/0/pathz", {}, "groups[0]: key 14: unknown key (did you mean paths?)"),
        ("kv_transfers", [], "not a plan: key 16: unknown key (did you mean kv_transfer?)"),
        ("decode/groups/0/scheme", "magic", "decode.groups[0].scheme: must be one of ina, ring"),
        ("decode/tp", 0.5, "decode.tp: must be an integer, got 0.5"),
        ("decode/batch_size", -3, "decode.batch_size: must be positive, got -3"),
        ("predicted/ttft_s", math.nan, "predicted.ttft_s: must be a finite number, got nan"),
        ("predicted/rate", "fast", "predicted.rate: must be a number, got a string"),
        ("sla/tpot_s", math.inf, "sla.tpot_s: must be a finite number, got inf"),
        ("sla/attainment", 1.5, "sla.attainment: must be at most 1, got 1.5"),
        ("sla/ttft", 1.0, "sla: key 4: unknown key (did you mean ttft_s?)"),
        ("decode/instances/0/stages/1/0", "srv0-gpu0", "GPU 'srv0-gpu0' is used twice"),
        ("decode/instances/0/stages/1", ["x"], "decode.instances[0].stages[1]: 1 GPUs, the phase"),
        ("decode/groups/1/gpus", ["srv3-gpu0"], "decode.groups[1].gpus: must be the GPUs of"),
        ("decode/groups/1/stage", 7, "decode.groups[1].stage: instance 0 has no stage 7"),
        ("decode/groups/1/paths/srv3-gpu0", ["s1"], "paths.srv3-gpu0: must start at 'srv3-gpu0'"),
        ("decode/groups/1/paths/srv3-gpu0", [], "paths.srv3-gpu0: needs at least 1 item"),
        ("kv_transfer/0/src", "srv2-gpu0", "kv_transfer[0].src: 'srv2-gpu0' is not a prefill GPU"),
        ("options", {"a": [[[[[[[[[1]]]]]]]]]}, "[0][0][0][0]: nested deeper than 8 levels"),
        ("options", [1], "options: must be a mapping, got a list"),
        ("notes", "a note", "notes: must be a list, got a string"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_item(doc, path, value, message):
    _set(doc, path, value)
    with pytest.raises(InputError) as e:
        validate_plan_dict(doc, source="p.json")
    assert str(e.value).startswith("p.json: ") and message in str(e.value)


def _ina(doc: dict[str, Any]) -> dict[str, Any]:
    """The testbed plan's first decode group made an INA group on s1 (GPUs 1, 3 relay from
    s2 over the s1-s2 link)."""
    g = doc["decode"]["groups"][0]
    g["scheme"], g["switch"], g["slots"] = "ina", "s1", {"start": 0, "count": 8}
    g["paths"] = {m: [m, "s1"] if m[-1] in "02" else [m, "s2", "s1"] for m in g["gpus"]}
    return doc


def test_ina_and_hier_groups_checked(doc):
    g = make_testbed(fixed_roles=True)
    p = validate_plan_dict(_ina(doc))
    check_plan_on_topology(p, g)
    for change, message in [
        (("switch", None), "decode.groups[0].switch: an INA group needs its aggregation switch"),
        (("paths", {}), "decode.groups[0].paths: no path for member 'srv2-gpu0'"),
        (("slots", {"start": 65535, "count": 2}), "slots: ends past slot 65536 (the slot field"),
        (("slots", {"start": 0, "count": 0}), "slots.count: must be positive, got 0"),
        (("scheme", "hier"), "decode.groups[0].rails: a hier group needs its rails"),
    ]:
        d = copy.deepcopy(doc)
        d["decode"]["groups"][0][change[0]] = change[1]
        with pytest.raises(InputError, match=re.escape(message)):
            validate_plan_dict(d)
    d = copy.deepcopy(doc)
    d["decode"]["groups"][0]["paths"]["srv2-gpu1"] = ["srv2-gpu1", "s2"]
    with pytest.raises(InputError, match="never reaches the aggregation switch 's1'"):
        validate_plan_dict(d)
    rail = {"switch": "s2", "shard": 0, "shards": 2, "members": ["srv2-gpu1"], "slots": None,
            "paths": {"srv2-gpu1": ["srv2-gpu1", "s2"]}}  # fmt: skip
    d = copy.deepcopy(doc)
    d["decode"]["groups"][0].update(scheme="hier", switch=None, slots=None, rails=[rail])
    check_plan_on_topology(validate_plan_dict(d), g)
    for key, value, message in [
        ("shard", 2, "rails[0].shard: must be below shards (2), got 2"),
        ("members", ["srv3-gpu1"], "rails[0].members: 'srv3-gpu1' is not a member"),
        ("paths", {"srv2-gpu1": ["srv2-gpu1"]}, "never reaches the aggregation switch 's2'"),
    ]:
        bad = copy.deepcopy(d)
        bad["decode"]["groups"][0]["rails"][0][key] = value
        with pytest.raises(InputError, match=re.escape(message)):
            validate_plan_dict(bad)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("decode/instances/0/stages/0/0", "ghost", "stages[0][0]: GPU 'ghost' is not in topology"),
        ("decode/instances/0/stages/0/0", "s1", "GPU 's1' is not in topology 'testbed-paper'"),
        ("decode/instances/0/stages/0/0", "srv1-gpu3", "'srv1-gpu3' is reserved for prefill"),
        ("decode/groups/0/switch", "srv2-nvsw", "switch: 'srv2-nvsw' is not a switch"),
        ("decode/groups/0/paths/srv2-gpu0", ["srv2-gpu0", "s2", "s1"], "hop srv2-gpu0 - s2"),
        ("decode/groups/0/slots", {"start": 32760, "count": 9}, "past 's1''s 32768"),
        ("kv_transfer/0/path", ["srv0-gpu0", "srv2-gpu0"], "kv_transfer[0]: hop srv0-gpu0"),
    ],
)
def test_a_plan_is_checked_against_its_cluster(doc, path, value, message):
    doc = _ina(doc)
    group = doc["decode"]["groups"][0]
    if path.startswith("decode/instances"):  # its group and KV transfers follow the stage
        old = doc["decode"]["instances"][0]["stages"][0][0]
        group["gpus"] = [value if x == old else x for x in group["gpus"]]
        group["paths"] = {(value if k == old else k): [value, "s1"] if k == old else p
                          for k, p in group["paths"].items()}  # fmt: skip
        doc["kv_transfer"] = [t for t in doc["kv_transfer"] if t["dst"] != old]
    if path.endswith("/switch"):  # its paths follow the switch
        group["paths"] = {m: [m, value] for m in group["gpus"]}
    _set(doc, path, value)
    p = validate_plan_dict(doc)
    with pytest.raises(InputError, match=re.escape(message)):
        check_plan_on_topology(p, make_testbed(fixed_roles=True))


def test_numpy_scalars_from_a_planner_in_process_are_numbers(doc):
    doc["decode"]["batch_size"] = np.int64(46)
    doc["predicted"]["rate"] = np.float32(3.5)
    p = validate_plan_dict(doc)
    assert p.decode.batch_size == 46 and type(p.decode.batch_size) is int


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
        (b"{}", "not a plan: missing 'planner'"),
        (b"[1, 2]", "not a plan: must be a mapping (Plan), got a list"),
        (b'{"planner": "x", "planner": "y"}', "a JSON object names a key twice"),
    ],
)
def test_plan_files_that_are_not_plans(tmp_path, text, message):
    p = tmp_path / "p.json"
    p.write_bytes(text)
    with pytest.raises(InputError, match=re.escape(message)):
        load_plan(p)
