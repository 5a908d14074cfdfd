"""The C++ GPU agent (heroserve-gpu-agent) and the tuner plugin under test: where the build
puts them, a child process with its log in a file, the agent started against a controller,
its shared-memory segment, and the controller-side steps the agent tests share (a switch
registered, a sample plan applied, an epoch acknowledged)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from support import CSRC_BUILD
from support.waiting import HANG_GUARD_S, wait_for

BUILD = CSRC_BUILD
AGENT = BUILD / "heroserve-gpu-agent"
PLUGIN = BUILD / "libnccl-tuner-heroserve.so"
GROUP = "prefill/0/0"

# Generated stubs: a test module importing this one is skipped where they are absent.
pb = pytest.importorskip("agents.proto.heroserve.v1.control_pb2")
pb_grpc = pytest.importorskip("agents.proto.heroserve.v1.control_pb2_grpc")


def wait_until(pred, timeout: float = HANG_GUARD_S, what: str = "condition"):  # noqa: ANN001, ANN202
    """:func:`support.waiting.wait_for` with the predicate first."""
    return wait_for(what, pred, timeout)


def register_switch(port: int, capacity: float = 12.5e9) -> None:
    """The switch s1 reports its ports (the controller takes link capacities from the
    topology, sample_topology's 12.5e9 B/s, not from these)."""
    inv = pb.SwitchInventory(device_id=1, aggregator_slots=1024, slot_bytes=128)
    for k in range(4):
        inv.ports.add(port=k + 1, peer=f"p0-g{k}", capacity=capacity)
    req = pb.RegisterRequest(identity=pb.NodeIdentity(node_id="s1", kind=pb.NODE_KIND_SWITCH))
    req.switch_inventory.CopyFrom(inv)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        pb_grpc.ControlStub(ch).Register(req, timeout=5)


def apply_plan(srv, reverse: bool = False) -> int:  # noqa: ANN001
    from controller.service.sample import sample_plan

    p = sample_plan(ina_groups=1, ring_groups=0, workers=4)
    if reverse:  # same group, different member order: a new table version
        p.prefill.groups[0].gpus.reverse()
    epoch, _ = srv.call(lambda: srv.server.core.apply_plan(p.to_json()))
    return epoch


class Proc:
    """A child process with its stderr collected in a file (read it any time)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, stdin: bool = False):
        self.log = log
        self._f = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdin else self._f,
            stderr=self._f,
            text=stdin,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ask(self, line: str) -> dict:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline()
        if not reply:
            raise AssertionError(f"{self.p.args} exited ({self.p.wait(5)}): {self.text()}")
        return json.loads(reply)

    def stop(self) -> int:
        if self.p.stdin and self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n")
                self.p.stdin.close()
                self.p.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._f.close()
        return self.p.returncode


def agent_env(prefix: str) -> dict[str, str]:
    env = dict(os.environ)
    env["HEROSERVE_SHM_PREFIX"] = prefix
    env["HEROSERVE_GROUP"] = GROUP
    return env


def start_agent(tmp_path: Path, prefix: str, controller_addr: str, *extra: str) -> Proc:
    args = [str(AGENT), "--controller", controller_addr, "--node-id", "p0"]
    args += ["--gpu", "p0-g1:0", "--telemetry-interval", "0.2", *extra]
    return Proc(args, agent_env(prefix), tmp_path / "agent.log")


def segment(prefix: str) -> Path:
    return Path("/dev/shm") / f"heroserve-{prefix}{GROUP.replace('/', '.')}"


def acked(srv, epoch: int) -> bool:  # noqa: ANN001
    rec = srv.server.core.store.agent("p0")
    return rec is not None and rec.acked_epoch >= epoch
