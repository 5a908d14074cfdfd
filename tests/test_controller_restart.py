"""Kill the controller process and start it again on the same database: agents reconnect
with backoff and resynchronise, the epoch continues, slot allocations are intact (§9)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from agents.client import AgentClient, Backoff, PolicyState
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology, save_sample_topology
from controller.slots import SlotPool
from controller.store import Store

ROOT = Path(__file__).resolve().parent.parent


def wait_for(what: str, fn: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_backoff_is_exponential_and_capped() -> None:
    b = Backoff(initial=0.1, factor=2.0, maximum=1.0, jitter=0.0)
    assert [round(b.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == pytest.approx(0.1)
    j = Backoff(initial=1.0, jitter=0.2)
    assert all(0.8 <= j.next() / d <= 1.2 for d in (1.0, 2.0, 4.0))


class Agent:
    """An in-process agent (no switch behind it) recording what it applied."""

    def __init__(
        self, port: int, ident: pb.NodeIdentity, inv: pb.SwitchInventory | pb.GpuInventory
    ) -> None:
        self.states: list[PolicyState] = []
        self.client = AgentClient(
            f"127.0.0.1:{port}",
            ident,
            lambda: inv,
            lambda old, new, upd: self.states.append(new),
            backoff=Backoff(initial=0.05, maximum=0.4),
        )
        self.thread = threading.Thread(target=self.client.run, daemon=True)
        self.thread.start()

    @property
    def epoch(self) -> int:
        return self.client.state.epoch

    def stop(self) -> None:
        self.client.stop()
        self.thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(db: Path, port: int, log: Path, plan: Path | None) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "controller.service",
        "--db",
        str(db),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    if plan is not None:
        args += ["--plan", str(plan)]
    # The sample plans' topology "sample" is no built-in: the controller needs the file.
    topo = db.parent / "sample-topology.json"
    if not topo.exists():
        save_sample_topology(topo, ina_groups=2, switches=("s1", "s2"))
    args += ["--topology", str(topo)]
    p = subprocess.Popen(args, cwd=ROOT, stderr=open(log, "ab"), stdout=subprocess.DEVNULL)  # noqa: SIM115
    return p


def apply(port: int, plan_json: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return (
            pb_grpc.AdminStub(ch)
            .ApplyPlan(pb.ApplyPlanRequest(plan_json=plan_json), timeout=10)
            .epoch
        )


def allocations(db: Path) -> dict[str, list]:
    store = Store(db)
    pool = SlotPool(store)
    out = {sw: pool.allocations(sw) for sw in pool.switches()}
    store.close()
    return out


@pytest.mark.slow
def test_controller_restart(tmp_path: Path) -> None:
    db, log = tmp_path / "c.db", tmp_path / "controller.log"
    plan = tmp_path / "plan.json"
    sample_plan(ina_groups=2, switches=("s1", "s2")).save(plan)
    port = free_port()
    proc = start(db, port, log, plan)
    sw_inv = pb.SwitchInventory(device_id=1, aggregator_slots=256)
    for k in range(4):
        sw_inv.ports.add(port=k + 1, peer=f"p0-g{k}", capacity=12.5e9)
    gpu_inv = pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id="p1-g2")])
    sw = Agent(port, pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH), sw_inv)
    gpu = Agent(port, pb.NodeIdentity(node_id="p1-g2", kind=pb.NODE_KIND_GPU), gpu_inv)
    try:
        wait_for("epoch 1 applied", lambda: sw.epoch == 1 and gpu.epoch == 1)
        assert (
            apply(port, sample_plan(ina_groups=2, switches=("s1", "s2"), tag="v2").to_json()) == 2
        )
        wait_for("epoch 2 applied", lambda: sw.epoch == 2 and gpu.epoch == 2)
        before_sw, before_gpu = sw.client.state, gpu.client.state
        assert sorted(before_sw.switch_groups) == [1] and sorted(before_gpu.tables) == [
            "prefill/1/0"
        ]
        slots_before = allocations(db)
        assert {k: [(a.start, a.count) for a in v] for k, v in slots_before.items()} == {
            "s1": [(0, 8)],
            "s2": [(8, 8)],
        }

        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # The agents notice and retry with backoff while the controller is down.
        time.sleep(1.0)
        assert sw.client.connects == 1 and gpu.client.connects == 1

        proc = start(db, port, log, None)  # no --plan: the stored one is served
        wait_for("reconnected", lambda: sw.client.connects == 2 and gpu.client.connects == 2)
        # Full state again, at the same epoch (it continues, never restarts from 0).
        wait_for("resynchronised", lambda: len(sw.states) >= 3 and len(gpu.states) >= 3)
        assert sw.states[-1].epoch == 2 and gpu.states[-1].epoch == 2
        assert sw.states[-1].switch_groups == before_sw.switch_groups
        assert gpu.states[-1].tables == before_gpu.tables
        assert allocations(db) == slots_before

        assert (
            apply(port, sample_plan(ina_groups=2, switches=("s1", "s2"), tag="v3").to_json()) == 3
        )
        wait_for("epoch 3 applied", lambda: sw.epoch == 3 and gpu.epoch == 3)
        text = log.read_text()
        assert "restored plan" in text
    finally:
        sw.stop()
        gpu.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    assert proc.returncode == 0 or proc.returncode == -signal.SIGTERM


def test_agent_waits_for_the_first_plan(tmp_path: Path) -> None:
    """A controller without a plan sends an empty full state at epoch 0 (never acked);
    the first plan then arrives as epoch 1."""
    from controller.service.server import ControllerServer, ThreadedServer

    srv = ThreadedServer(
        ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology())
    )
    gpu = Agent(
        srv.port,
        pb.NodeIdentity(node_id="p0-g0", kind=pb.NODE_KIND_GPU),
        pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id="p0-g0")]),
    )
    try:
        wait_for("empty state", lambda: len(gpu.states) == 1)
        assert gpu.states[0].epoch == 0 and gpu.states[0].tables == {}
        srv.call(lambda: srv.server.core.apply_plan(sample_plan().to_json()))
        wait_for("epoch 1", lambda: gpu.epoch == 1)
        assert sorted(gpu.client.state.tables) == ["prefill/0/0"]
        assert gpu.client.connects == 1  # no error, no reconnect
    finally:
        gpu.stop()
        srv.stop()
