"""A hierarchical-INA policy from the controller's stream to NCCL's CollNet Direct.

A minimal Control service (the real controller's hier plans are the control plane's tests)
sends heroserve-gpu-agent one full update whose table has a hier policy with two rails; the
agent converts it (SCHEME_HIER, Policy.rails) into the JSON form, validates and publishes
it; the tuner plugin, driven as NCCL would drive it, maps the hier choice to CollNet Direct.
A hier policy without rails is refused by the agent's validator and acknowledged with ok=false.
Skipped without `make cxx` or with a proto that predates SCHEME_HIER.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from support import ROOT
from support.gpu_agent import AGENT, PLUGIN, Proc, wait_until

pb = pytest.importorskip("agents.proto.heroserve.v1.control_pb2")
pb_grpc = pytest.importorskip("agents.proto.heroserve.v1.control_pb2_grpc")

pytestmark = [
    pytest.mark.skipif(
        not (AGENT.exists() and PLUGIN.exists()), reason="C++ GPU agent not built (make cxx)"
    ),
    pytest.mark.skipif(
        "rails" not in pb.Policy.DESCRIPTOR.fields_by_name, reason="proto without SCHEME_HIER"
    ),
]

GROUP = "decode/5/0"
COLLNET_DIRECT, RING = 2, 1  # NCCL's algorithm indices


def hier_table(rails: list[tuple[int, str]]) -> pb.PolicyTable:
    t = pb.PolicyTable(group_id=GROUP, version=1, apply_from_seq=0, window_s=1.0, gamma=0.0)
    t.links.add(id="g0|s1", capacity=1e10)
    t.links.add(id="g0|g1", capacity=1e10)
    hier = t.policies.add(id=0, scheme=pb.SCHEME_HIER, links=["g0|s1"], cost=0.0)
    for shard, switch in rails:
        hier.rails.add(shard=shard, switch=switch)
    t.policies.add(id=1, scheme=pb.SCHEME_RING, links=["g0|g1"], cost=0.0)
    return t


class OneUpdateControl(pb_grpc.ControlServicer):
    """Registers anyone, streams one full update, records acknowledgements."""

    def __init__(self, table: pb.PolicyTable) -> None:
        self.update = pb.PolicyUpdate(
            epoch=1, full=True, gpu_policy=pb.GpuPolicy(node_id="srv-h", tables=[table])
        )
        self.acks: list[tuple[int, bool, str]] = []
        self.closing = threading.Event()

    def Register(self, request, context):  # noqa: ANN001, ANN201, N802
        return pb.RegisterResponse(session_id="s1", current_epoch=1, telemetry_interval_s=0.2)

    def Subscribe(self, request, context):  # noqa: ANN001, ANN201, N802
        yield self.update
        while context.is_active() and not self.closing.wait(0.05):
            pass

    def Ack(self, request, context):  # noqa: ANN001, ANN201, N802
        self.acks.append((request.epoch, request.ok, request.error))
        return pb.AckResponse()

    def ReportTelemetry(self, request, context):  # noqa: ANN001, ANN201, N802
        return pb.TelemetryAck()


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"pyhier{os.getpid()}x{time.monotonic_ns() % 1000000}."
    yield p
    for f in Path("/dev/shm").glob(f"heroserve-{p}*"):
        f.unlink()


def serve(control: OneUpdateControl) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControlServicer_to_server(control, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def start_agent(tmp_path: Path, prefix: str, port: int) -> Proc:
    args = [str(AGENT), f"--controller=127.0.0.1:{port}", "--node-id=srv-h"]
    env = {**os.environ, "HEROSERVE_SHM_PREFIX": prefix}
    return Proc(args, env, tmp_path / "agent.log")


def test_hier_policy_reaches_the_plugin_as_collnet_direct(tmp_path: Path, prefix: str) -> None:
    control = OneUpdateControl(hier_table([(0, "s1"), (1, "s2")]))
    server, port = serve(control)
    agent = start_agent(tmp_path, prefix, port)
    driver = None
    try:
        wait_until(lambda: control.acks, what=f"an ack\n{agent.text()}")
        assert control.acks[0] == (1, True, ""), control.acks
        driver = Proc(
            [sys.executable, "-m", "agents.gpu.tuner_driver", str(PLUGIN)],
            {
                **os.environ,
                "HEROSERVE_SHM_PREFIX": prefix,
                "HEROSERVE_GROUP": GROUP,
                "PYTHONPATH": str(ROOT),
            },  # fmt: skip
            tmp_path / "driver.log",
            stdin=True,
        )
        # Equal links, gamma 0, nothing shared: hier (id 0) and ring (id 1) take turns, ties
        # going to the lower id.
        out = driver.ask("run 4 1000000")
        assert out["agree"], out
        assert [(c[2], c[3]) for c in out["choices"]] == [
            (0, COLLNET_DIRECT), (1, RING), (0, COLLNET_DIRECT), (1, RING)
        ]  # fmt: skip
    finally:
        if driver is not None:
            driver.stop()
        control.closing.set()
        assert agent.stop() == 0, agent.text()
        server.stop(None)
    published = json.loads(_payload(prefix))  # what the agent put in shared memory
    (table,) = published["tables"]
    assert table["policies"][0]["scheme"] == "hier"
    assert table["policies"][0]["switch"] == ""
    assert table["policies"][0]["rails"] == [
        {"shard": 0, "switch": "s1"},
        {"shard": 1, "switch": "s2"},
    ]
    assert "rails" not in table["policies"][1]


def test_hier_policy_without_rails_is_refused_and_acked_not_ok(tmp_path: Path, prefix: str) -> None:
    control = OneUpdateControl(hier_table([]))
    server, port = serve(control)
    agent = start_agent(tmp_path, prefix, port)
    try:
        wait_until(lambda: control.acks, what=f"an ack\n{agent.text()}")
        epoch, ok, error = control.acks[0]
        assert (epoch, ok) == (1, False)
        assert "a hier policy needs a non-empty rails list" in error
    finally:
        control.closing.set()
        assert agent.stop() == 0, agent.text()
        server.stop(None)


def _payload(prefix: str) -> str:
    """The JSON payload of the group's segment (csrc/include/heroserve/shm.h: the header's
    length at byte 32, the payload after the header and 32 counter slots, 64-byte aligned)."""
    raw = (Path("/dev/shm") / f"heroserve-{prefix}{GROUP.replace('/', '.')}").read_bytes()
    length = int.from_bytes(raw[32:40], "little")
    header = 64 + 32 * (32 + 256 * 16)  # Header fields + kMaxProcs ProcSlots
    start = (header + 63) // 64 * 64
    return raw[start : start + length].decode()
