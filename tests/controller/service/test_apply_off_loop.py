"""An ApplyPlan body is parsed off the controller's event loop (controller/service/servicer.py):
while one is being parsed, other calls are answered. The parse is held on an event, so the
test waits on conditions only; the RPC timeouts are hang guards."""

from __future__ import annotations

import threading

import grpc
import pytest

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service import planinput
from controller.service.sample import sample_plan
from controller.service.server import ThreadedServer

GUARD_S = 60  # a hang guard, not a measurement


def test_other_calls_are_answered_while_a_plan_is_parsed(
    srv: ThreadedServer, chan: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    real = planinput.parse_plan_text  # the schema's parse, the heavy part

    def held(text, source="plan"):  # noqa: ANN001, ANN202 - the real one's signature
        entered.set()
        assert release.wait(GUARD_S), "never released"
        return real(text, source)

    monkeypatch.setattr(planinput, "parse_plan_text", held)
    admin = pb_grpc.AdminStub(chan)
    reply: list[pb.ApplyPlanResponse] = []
    body = pb.ApplyPlanRequest(plan_json=sample_plan().to_json())
    t = threading.Thread(target=lambda: reply.append(admin.ApplyPlan(body, timeout=GUARD_S)))
    t.start()
    try:
        assert entered.wait(GUARD_S)
        # The parse is in progress: the loop still answers (on the loop it would wait for it).
        st = admin.GetState(pb.GetStateRequest(), timeout=GUARD_S / 2)
        assert st.epoch == 0 and st.plan_id == ""
    finally:
        release.set()
        t.join(GUARD_S)
    assert reply and reply[0].epoch == 1
    assert srv.server.core.epoch == 1
