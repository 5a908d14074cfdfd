"""Kill the controller process and start it again on the same database: agents reconnect
with backoff and resynchronise, the epoch continues, slot allocations are intact (§9)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from support import ROOT
from support.waiting import wait_for

from agents.client import AgentClient, Backoff, PolicyState
from agents.gpu.shmview import read_segment
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan, sample_topology, save_sample_topology
from controller.service.slots import SlotPool
from controller.service.store import Store


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
    store = Store(db, readonly=True)  # beside the running controller, which holds the db
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

        # The same command line again (--plan v1) while the database holds v2, applied through
        # Admin: the database is the truth, v2 stays (v1 used to come back).
        proc = start(db, port, log, plan)
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
        assert "superseded it: serving" in text
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


# --- a controller that lost its database --------------------------------


def _server(db: Path, listen: str = "127.0.0.1:0"):  # noqa: ANN202
    from controller.service.core import Options
    from controller.service.server import ControllerServer, ThreadedServer

    opts = Options(apply_margin=5, telemetry_interval_s=0.2)
    return ThreadedServer(
        ControllerServer(Store(db), listen, options=opts, topology=sample_topology())
    )


def _apply(srv, reverse: bool = False) -> int:  # noqa: ANN001
    p = sample_plan(ina_groups=1, ring_groups=0, workers=4)
    if reverse:  # same group, members in another order: new table content, a new version
        p.prefill.groups[0].gpus.reverse()
    return srv.call(lambda: srv.server.core.apply_plan(p.to_json()))[0]


def _versions_up_to_3(srv) -> None:  # noqa: ANN001
    for reverse in (False, True, False):
        _apply(srv, reverse)
    assert srv.server.core.state.table_by_name["prefill/0/0"].version == 3


def test_python_agent_gets_versions_above_what_it_held(tmp_path: Path) -> None:
    a = _server(tmp_path / "a.db")
    port = a.port
    _versions_up_to_3(a)
    gpu = Agent(
        port,
        pb.NodeIdentity(node_id="p0", kind=pb.NODE_KIND_GPU),
        pb.GpuInventory(gpus=[pb.GpuInfo(gpu_id="p0-g1")]),
    )
    b = None
    try:
        wait_for("epoch 3", lambda: gpu.epoch == 3)
        gen_a = gpu.client.state.generation
        assert gen_a == a.server.core.generation
        a.stop()
        # The database is gone: a new controller on the same address, a different plan.
        b = _server(tmp_path / "b.db", f"127.0.0.1:{port}")
        assert b.server.core.generation != gen_a
        assert _apply(b, reverse=True) == 1  # B's own count, and its own version 1
        # The agent told B it holds version 3 of generation A: B re-issues the table above it.
        wait_for("resync", lambda: gpu.client.state.generation == b.server.core.generation)
        wait_for("epoch 2 of B", lambda: gpu.epoch == 2)
        t = gpu.client.state.tables["prefill/0/0"]
        # B's content (members reversed: the ring fallback goes p0-g0 -> s1 -> p0-g3).
        assert t.version == 4 and list(t.policies[1].paths["p0-g0"].nodes) == [
            "p0-g0",
            "s1",
            "p0-g3",
        ]
        assert b.server.core.store.table_floor("prefill/0/0") == 3
        wait_for("ack", lambda: b.server.core.store.agent("p0").acked_epoch == 2)
        # From then on B counts as usual.
        assert _apply(b) == 3
        wait_for("epoch 3 of B", lambda: gpu.epoch == 3)
        assert gpu.client.state.tables["prefill/0/0"].version == 5
    finally:
        gpu.stop()
        if b is not None:
            b.stop()


def test_gpu_agent_never_acks_a_table_it_ignores(tmp_path: Path) -> None:
    """The C++ daemon after the controller lost its database: it used to keep its higher old
    version silently and acknowledge the new controller's epochs."""
    from support.gpu_agent import AGENT, PLUGIN, Proc, agent_env, segment, start_agent

    if not (AGENT.exists() and PLUGIN.exists()):
        pytest.skip("C++ GPU agent not built (make cxx)")
    prefix = f"pytest{os.getpid()}r{time.monotonic_ns() % 1000000}."
    a = _server(tmp_path / "a.db")
    port = a.port
    _versions_up_to_3(a)
    agent = start_agent(tmp_path, prefix, f"127.0.0.1:{port}")
    driver = b = None

    def acked(srv, epoch: int) -> bool:  # noqa: ANN001
        rec = srv.server.core.store.agent("p0")
        return rec is not None and rec.acked_epoch >= epoch

    def newest() -> dict:
        got = read_segment(segment(prefix))  # the checked read the plugin's layout defines
        assert not got.error, got.error
        return got.tables[-1]

    try:
        wait_for(f"ack of epoch 3\n{agent.text()}", lambda: acked(a, 3), timeout=15)
        driver = Proc(
            [sys.executable, "-m", "agents.gpu.tuner_driver", str(PLUGIN), "--ranks", "2"],
            {**agent_env(prefix), "PYTHONPATH": str(ROOT)},
            tmp_path / "driver.log",
            stdin=True,
        )
        first = driver.ask("run 20 1048576")
        assert {c[1] for c in first["choices"]} == {3}
        a.stop()
        b = _server(tmp_path / "b.db", f"127.0.0.1:{port}")
        assert _apply(b, reverse=True) == 1
        # B learns version 3 and sequence 19 from the registration and re-issues the table
        # as version 4 from collective 19 + 1 + 5 = 25; the agent acks only what it applied.
        wait_for(f"ack of B's epoch 2\n{agent.text()}", lambda: acked(b, 2), timeout=15)
        t = newest()
        assert t["version"] == 4 and t["apply_from_seq"] == 25
        assert t["policies"][1]["paths"]["p0-g0"] == ["p0-g0", "s1", "p0-g3"]  # B's content
        assert "controller generation changed" in agent.text()
        assert "is below version 3 already published: refused" in agent.text()
        # The plugin, running all along, switches to B's table at the announced collective.
        second = driver.ask("run 10 1048576")
        assert second["agree"], second
        assert [(c[0], c[1]) for c in second["choices"]] == [
            (s, 3 if s < 25 else 4) for s in range(20, 30)
        ]
        assert _apply(b) == 3
        wait_for("ack of B's epoch 3", lambda: acked(b, 3), timeout=15)
        assert newest()["version"] == 5
    finally:
        if driver is not None:
            driver.stop()
        assert agent.stop() == 0, agent.text()
        if b is not None:
            b.stop()
        for f in Path("/dev/shm").glob(f"heroserve-{prefix}*"):
            f.unlink()


def test_startup_plan_applies_only_what_the_database_never_held(tmp_path: Path) -> None:
    """docs/control-plane.md "Restart": the database is the truth."""
    from controller.service.core import Controller

    db, topo = tmp_path / "c.db", sample_topology()
    v1, v2, v3 = (sample_plan(tag=t).to_json() for t in ("v1", "v2", "v3"))
    c = Controller(Store(db), topology=topo)
    first = c.apply_startup_plan(v1)
    assert first.endswith("applied at epoch 1 (the database held no plan)")
    _, pid2 = c.apply_plan(v2)  # through Admin
    c.store.close()
    c = Controller(Store(db), topology=topo)  # restarted with the same --plan v1
    msg = c.apply_startup_plan(v1)
    assert "was applied at epoch 1 and plan " + pid2 + " superseded it" in msg
    assert (c.epoch, c.state.plan_id) == (2, pid2)
    assert c.apply_startup_plan(v2) == (
        f"--plan {pid2} is the plan the database holds (epoch 2): unchanged"
    )
    assert c.epoch == 2
    msg = c.apply_startup_plan(v3)  # a plan the database never held: applied
    assert msg.endswith(f"applied at epoch 3 (the database held plan {pid2})")
    assert c.epoch == 3
