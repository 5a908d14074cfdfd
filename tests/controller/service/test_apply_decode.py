"""ApplyPlan arrives as raw bytes and is decoded once, in a worker thread
(``servicer.decode_apply_plan``, registered raw by ``server.RawRequests``); a body of more
values than any plan holds is refused by its comma count before it is decoded
(``MAX_PLAN_COMMAS``, controller/inputs/limits.py)."""

from __future__ import annotations

import json

import grpc
import pytest

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.inputs import documents
from controller.inputs.limits import MAX_PLAN_COMMAS
from controller.service.sample import sample_plan
from controller.service.server import ThreadedServer

GUARD_S = 60  # a hang guard, not a measurement


def test_bytes_that_are_no_apply_plan_request_are_refused(
    srv: ThreadedServer, chan: grpc.Channel
) -> None:
    raw_call = chan.unary_unary("/heroserve.v1.Admin/ApplyPlan")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as err:
        raw_call(b"\xff\xff\xff\xff", timeout=GUARD_S)  # field 31 with a truncated varint
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "ApplyPlan: not an ApplyPlanRequest message"
    assert srv.server.core.epoch == 0


def test_a_plan_of_too_many_values_is_refused_before_it_is_decoded(
    srv: ThreadedServer, chan: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = json.loads(sample_plan().to_json())
    doc["options"]["pad"] = [0] * (MAX_PLAN_COMMAS + 1)  # MAX_PLAN_COMMAS + 1 commas more
    body = pb.ApplyPlanRequest(plan_json=json.dumps(doc))
    decoded: list[int] = []
    real = documents.json.loads
    monkeypatch.setattr(
        documents.json, "loads", lambda text, **kw: decoded.append(len(text)) or real(text, **kw)
    )
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.AdminStub(chan).ApplyPlan(body, timeout=GUARD_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"plan: more than {MAX_PLAN_COMMAS} values (commas)"
    assert decoded == []
    assert srv.server.core.epoch == 0


def test_a_valid_plan_applies_through_the_raw_handler(
    srv: ThreadedServer, chan: grpc.Channel
) -> None:
    reply = pb_grpc.AdminStub(chan).ApplyPlan(
        pb.ApplyPlanRequest(plan_json=sample_plan().to_json()), timeout=GUARD_S
    )
    assert reply.epoch == 1 and srv.server.core.epoch == 1
