"""What a controller can make heroserve-gpu-agent hold is bounded (docs/design.md §11).

A scripted Control service sends the agent one full update with more groups than it holds
at most (`kMaxGroups`, 256, csrc/agent/daemon.h): it publishes 256 segments, refuses the
rest and says so in its ack (ok = false, naming the cap). Then an increment removes every
group but one and adds another: the removed groups' segments are unlinked, so /dev/shm holds
exactly the groups the agent holds. Last, a version more than 2^20 above the one held (which
the tuner plugin would refuse, docs/policy-table.md) is refused in the ack. Skipped without
`make cxx`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from support.gpu_agent import AGENT, Proc, wait_until

pb = pytest.importorskip("agents.proto.heroserve.v1.control_pb2")
pb_grpc = pytest.importorskip("agents.proto.heroserve.v1.control_pb2_grpc")

pytestmark = pytest.mark.skipif(not AGENT.exists(), reason="C++ GPU agent not built (make cxx)")

MAX_GROUPS = 256  # kMaxGroups in csrc/agent/daemon.h
MAX_VERSION_JUMP = 2**20  # kMaxVersionJump in csrc/include/heroserve/policy.h
NODE = "srv-b"


def table(group: str, version: int = 1) -> pb.PolicyTable:
    t = pb.PolicyTable(group_id=group, version=version, apply_from_seq=0, window_s=1.0, gamma=0.0)
    t.links.add(id="g0|s1", capacity=1e10)
    t.links.add(id="g0|g1", capacity=1e10)
    t.policies.add(id=0, scheme=pb.SCHEME_INA, switch="s1", links=["g0|s1"], cost=0.0)
    t.policies.add(id=1, scheme=pb.SCHEME_RING, links=["g0|g1"], cost=0.0)
    return t


def group(k: int) -> str:
    return f"decode/{k}/0"


class ScriptedControl(pb_grpc.ControlServicer):
    """Registers anyone and streams its updates in order, each once the test releases it
    (`release`); records the acknowledgements."""

    def __init__(self, updates: list[pb.PolicyUpdate]) -> None:
        self.updates = updates
        self.acks: list[tuple[int, bool, str]] = []
        self.cv = threading.Condition()
        self.released = 0
        self.closing = False

    def release(self) -> None:
        with self.cv:
            self.released += 1
            self.cv.notify_all()

    def Register(self, request, context):  # noqa: ANN001, ANN201, N802
        return pb.RegisterResponse(session_id="s1", current_epoch=1, telemetry_interval_s=0.2)

    def Subscribe(self, request, context):  # noqa: ANN001, ANN201, N802
        for k, u in enumerate(self.updates):
            with self.cv:
                self.cv.wait_for(lambda k=k: self.released > k or self.closing)
                if self.closing:
                    return
            yield u
        with self.cv:
            self.cv.wait_for(lambda: self.closing or not context.is_active(), timeout=60)

    def Ack(self, request, context):  # noqa: ANN001, ANN201, N802
        with self.cv:
            self.acks.append((request.epoch, request.ok, request.error))
            self.cv.notify_all()
        return pb.AckResponse()

    def ReportTelemetry(self, request, context):  # noqa: ANN001, ANN201, N802
        return pb.TelemetryAck()

    def close(self) -> None:
        with self.cv:
            self.closing = True
            self.cv.notify_all()


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"pybound{os.getpid()}x{time.monotonic_ns() % 1000000}."
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


def segments(prefix: str) -> set[str]:
    """The groups whose segments exist (group ids with '/' as '.')."""
    lead = f"heroserve-{prefix}"
    return {f.name[len(lead) :] for f in Path("/dev/shm").glob(f"{lead}*")}


def test_groups_are_capped_and_removed_groups_segments_unlinked(
    tmp_path: Path, prefix: str
) -> None:
    n = MAX_GROUPS + 44
    full = pb.PolicyUpdate(
        epoch=1,
        full=True,
        gpu_policy=pb.GpuPolicy(node_id=NODE, tables=[table(group(k)) for k in range(n)]),
    )
    # Keep group 0, remove every other group held, add one new group.
    removed = [group(k) for k in range(1, MAX_GROUPS)]
    step = pb.PolicyUpdate(
        epoch=2,
        gpu_policy=pb.GpuPolicy(node_id=NODE, tables=[table(group(n))], removed_group_ids=removed),
    )
    too_far = pb.PolicyUpdate(
        epoch=3,
        gpu_policy=pb.GpuPolicy(node_id=NODE, tables=[table(group(0), 2 + MAX_VERSION_JUMP)]),
    )
    control = ScriptedControl([full, step, too_far])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControlServicer_to_server(control, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    agent = Proc(
        [str(AGENT), f"--controller=127.0.0.1:{port}", f"--node-id={NODE}", "--shm-capacity=4096"],
        {**os.environ, "HEROSERVE_SHM_PREFIX": prefix},
        tmp_path / "agent.log",
    )
    try:
        control.release()
        wait_until(lambda: len(control.acks) >= 1, what=f"the first ack\n{agent.text()}")
        epoch, ok, error = control.acks[0]
        assert (epoch, ok) == (1, False)
        # The first MAX_GROUPS groups in the update's order are held, the next one is named.
        assert f"group {group(MAX_GROUPS)} refused: this agent holds at most 256 groups" in error
        assert "43 more group(s) refused" in error
        assert segments(prefix) == {group(k).replace("/", ".") for k in range(MAX_GROUPS)}

        control.release()
        wait_until(lambda: len(control.acks) >= 2, what=f"the second ack\n{agent.text()}")
        assert control.acks[1] == (2, True, "")
        assert segments(prefix) == {group(0).replace("/", "."), group(n).replace("/", ".")}

        control.release()
        wait_until(lambda: len(control.acks) >= 3, what=f"the third ack\n{agent.text()}")
        epoch, ok, error = control.acks[2]
        assert (epoch, ok) == (3, False)
        assert f"v{2 + MAX_VERSION_JUMP} jumps more than {MAX_VERSION_JUMP} versions" in error
        assert "above version 1: refused" in error
    finally:
        control.close()
        assert agent.stop() == 0, agent.text()
        server.stop(None)
    assert "refused: this agent holds at most 256 groups" in agent.text()  # logged too
