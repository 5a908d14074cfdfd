"""``heroserve admin`` and server reflection: ``admin apply`` moves
running agents to a new epoch without a controller restart; a reflection client lists the
controller's services."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from agents.client import AgentClient, Backoff, PolicyState
from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.cli import main
from controller.cli.pki import init_ca, issue
from controller.service.sample import sample_plan, sample_topology
from controller.service.server import ControllerServer, ThreadedServer, Tls
from controller.service.store import Store

SWITCHES = ("s1", "s2")


def _until(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Agent:
    """A switch agent's control-plane side (no switch behind it), recording its states."""

    def __init__(self, target: str, node: str, tls=None) -> None:  # noqa: ANN001
        self.states: list[PolicyState] = []
        inv = pb.SwitchInventory(device_id=1, aggregator_slots=64)
        self.client = AgentClient(
            target,
            pb.NodeIdentity(node_id=node, kind=pb.NODE_KIND_SWITCH),
            lambda: inv,
            lambda old, new, upd: self.states.append(new),
            tls=tls,
            backoff=Backoff(initial=0.05, maximum=0.4),
        )
        self.thread = threading.Thread(target=self.client.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.client.stop()
        self.thread.join(10)


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(2, switches=SWITCHES)
        )
    )
    s.call(lambda: s.server.core.apply_plan(sample_plan(2, switches=SWITCHES).to_json()))
    yield s
    s.stop()


def test_admin_apply_moves_running_agents_to_a_new_epoch(
    srv: ThreadedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{srv.port}"
    agents = [Agent(target, sw) for sw in SWITCHES]
    try:
        _until(lambda: all(a.client.state.epoch == 1 for a in agents), "epoch 1")
        # the new plan drops INA group prefill/1/0, which s2 aggregated (s1 keeps prefill/0/0)
        s2_before = {a.group_name for a in agents[1].client.state.switch_groups.values()}
        assert s2_before == {"prefill/1/0"}
        new = sample_plan(1, switches=SWITCHES, tag="smaller")
        path = tmp_path / "new.json"
        new.save(path)
        assert main(["admin", "--controller", target, "apply", str(path), "--wait", "20"]) == 0
        out = capsys.readouterr().out
        assert "applied at epoch 2" in out and "all 2 connected agents acknowledged epoch 2" in out
        s1, s2 = agents
        assert s1.client.state.epoch == 2 and s2.client.state.epoch == 2
        assert {a.group_name for a in s1.client.state.switch_groups.values()} == {"prefill/0/0"}
        assert s2.client.state.switch_groups == {}
        # same sessions: moved by the stream, not by a reconnect or a controller restart
        assert [a.client.connects for a in agents] == [1, 1]
        assert srv.server.core.epoch == 2

        assert main(["admin", "--controller", target, "state"]) == 0
        out = capsys.readouterr().out
        assert "epoch      2" in out and "2 registered, 2 connected, 2 at the epoch" in out
        assert main(["admin", "--controller", target, "agents"]) == 0
        rows = [r.split() for r in capsys.readouterr().out.splitlines()[2:]]
        assert [r[:5] for r in rows] == [
            ["s1", "switch", "yes", "2", "yes"],
            ["s2", "switch", "yes", "2", "yes"],
        ]
        assert main(["admin", "--controller", target, "slots"]) == 0
        out = capsys.readouterr().out
        # both registered 64 slots; prefill/0/0 holds the 8 its plan asks for, from 0;
        # prefill/1/0's range on s2 was freed with the old plan
        assert "s1: 8 of 64 aggregator slots allocated" in out
        assert "s2: 0 of 64 aggregator slots allocated" in out
        assert [ln.split() for ln in out.splitlines() if ln.startswith("prefill/")] == [
            ["prefill/0/0", "0", "7", "8"]
        ]
    finally:
        for a in agents:
            a.stop()


def test_reflection_lists_and_describes_the_services(srv: ThreadedServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"heroserve.v1.Control", "heroserve.v1.Admin", "grpc.health.v1.Health"} <= services
        fd = db.FindFileContainingSymbol("heroserve.v1.Admin")
        admin = next(s for s in fd.service if s.name == "Admin")
        assert {m.name for m in admin.method} == {"ApplyPlan", "GetState", "GetSlots"}


def test_admin_over_mutual_tls_needs_the_admin_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "pki"
    init_ca(d)
    srv_cert = issue(d, "controller", server=True, hosts=["127.0.0.1"])
    issue(d, "heroserve-admin")
    issue(d, "s1")
    tls = Tls(srv_cert.cert.read_bytes(), srv_cert.key.read_bytes(), (d / "ca.crt").read_bytes())
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", tls=tls, topology=sample_topology()
        )
    )
    try:
        plan = tmp_path / "p.json"
        sample_plan().save(plan)

        def admin(name: str, *argv: str) -> int:
            flags = ["--tls-cert", str(d / f"{name}.crt"), "--tls-key", str(d / f"{name}.key")]
            flags += ["--tls-ca", str(d / "ca.crt")]
            return main(["admin", "--controller", f"127.0.0.1:{s.port}", *flags, *argv])

        assert admin("heroserve-admin", "apply", str(plan)) == 0
        assert "applied at epoch 1" in capsys.readouterr().out
        assert admin("s1", "state") == 2
        err = capsys.readouterr().err
        assert "PERMISSION_DENIED" in err and len(err.strip().splitlines()) == 1
    finally:
        s.stop()


def test_bad_input_and_no_controller(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["admin", "apply", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["admin", "--tls-cert", "x.pem", "state"]) == 2
    assert "needs all of" in capsys.readouterr().err
    # a port past 65535 is refused, not wrapped (99999 would dial 34463)
    for addr, says in (
        ("127.0.0.1:99999", "port 99999 is not in 1..65535"),
        ("127.0.0.1:0", "port 0 is not in 1..65535"),
        ("not an address", "spaces or control characters"),
        ("127.0.0.1", "is not HOST:PORT"),
    ):
        assert main(["admin", "--controller", addr, "state"]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    # nothing listens on port 1 of loopback
    assert main(["admin", "--controller", "127.0.0.1:1", "state"]) == 1
    err = capsys.readouterr().err
    assert "unreachable" in err and len(err.strip().splitlines()) == 1
