"""End to end on loopback with real processes: controller (with a plan), the executable
switch model (agents.softswitch) and the switch agent. The plan's INA groups must end up
as entries in the switch, read back through P4Runtime; a restarted agent reconciles
(stale entries deleted, missing ones added) (DESIGN.md §9, §10)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from controller._gen.heroserve.v1 import control_pb2 as pb
from controller._gen.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.service.sample import sample_plan

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PORTS = [f"{k + 1}=p0-g{k},mac=02:00:00:00:00:0{k + 1},ip=10.0.0.{k + 1}" for k in range(4)]

# Inserts a stale aggregation entry and multicast group as another primary client.
_TAMPER = """
import os, sys
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
import contextlib
import p4runtime_sh.shell as sh
from p4runtime_sh.global_options import global_options
global_options["verbose"] = False
with contextlib.redirect_stdout(sys.stderr):
    sh.setup(device_id=1, grpc_addr=sys.argv[1], election_id=(0, 9), verbose=False)
te = sh.TableEntry("aggregation_table")(action="set_slot")
te.match["group_id"] = "99"; te.match["agg_index"] = "0"
te.action["slot"] = "500"; te.action["num_workers"] = "2"; te.action["mcast_grp"] = "99"
te.insert()
sh.MulticastGroupEntry(99).add(3, 0).insert()
# A wrong value on a live key: must be modified back.
te = sh.TableEntry("aggregation_table")(action="set_slot")
te.match["group_id"] = "1"; te.match["agg_index"] = "0"
te.action["slot"] = "777"; te.action["num_workers"] = "4"; te.action["mcast_grp"] = "1"
te.modify()
sh.teardown()
"""


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_port = 0

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            [PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, env=env or dict(os.environ)
        )
        self.procs[name] = p
        return p

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name)
        p.send_signal(sig)
        p.wait(10)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for name in list(self.procs):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            self.procs.pop(name)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    yield ps
    ps.stop_all()


def wait_for(what: str, fn: Callable[[], object], timeout: float = 30.0) -> object:
    """Poll ``fn`` until it returns a truthy value (correctness, not speed: generous)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(port: int, name: str) -> float:
    """Value of an unlabelled sample on the controller's /metrics (0 if absent)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def start_controller(procs: Procs, tmp: Path, plan: Path) -> int:
    port_file = tmp / "cport"
    port_file.unlink(missing_ok=True)
    procs.metrics_port = free_port()
    procs.start(
        "controller",
        [
            "-m",
            "controller.service",
            "--db",
            str(tmp / "c.db"),
            "--plan",
            str(plan),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
            "--metrics-port",
            str(procs.metrics_port),
        ],
    )
    wait_for("controller port", port_file.exists)
    return int(port_file.read_text())


def start_softswitch(procs: Procs) -> int:
    p = procs.start(
        "softswitch", ["-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0", "--device-id", "1"]
    )
    assert p.stdout is not None
    line = p.stdout.readline().decode()
    assert line.startswith("P4RUNTIME_PORT="), line + procs.log("softswitch")
    return int(line.split("=")[1])


def start_agent(procs: Procs, sw_port: int, ctl_port: int) -> None:
    args = [
        "-m",
        "agents.switch",
        "--switch",
        f"127.0.0.1:{sw_port}",
        "--controller",
        f"127.0.0.1:{ctl_port}",
        "--device-id",
        "1",
        "--node-id",
        "s1",
        "--telemetry-interval",
        "0.2",
    ]
    for spec in PORTS:
        args += ["--port", spec]
    procs.start("agent", args)


def dump(sw_port: int) -> dict:
    out = subprocess.run(
        [PY, "-m", "agents.switch.dump", "--switch", f"127.0.0.1:{sw_port}", "--device-id", "1"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def expected_entries(groups: list[tuple[int, int, int]]) -> list:
    """(group id, slot start, count) with 4 workers, multicast group = group id."""
    return sorted(
        [[gid, i], "set_slot", [start + i, 4, gid]]
        for gid, start, count in groups
        for i in range(count)
    )


def acked(ctl_port: int) -> dict[str, int]:
    with grpc.insecure_channel(f"127.0.0.1:{ctl_port}") as ch:
        st = pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=5)
    return {a.identity.node_id: a.acked_epoch for a in st.agents}


@pytest.mark.slow
def test_plan_reaches_the_switch_and_agent_restart_reconciles(procs: Procs, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    sample_plan(ina_groups=2, workers=4).save(plan)
    ctl = start_controller(procs, tmp_path, plan)
    sw = start_softswitch(procs)
    start_agent(procs, sw, ctl)

    want = expected_entries([(1, 0, 8), (2, 8, 8)])
    wait_for("entries on the switch", lambda: dump(sw)["aggregation_table"] == want, 60)
    d = dump(sw)
    # Only group 1's workers sit behind s1's ports: one multicast group, to ports 1-4.
    assert d["multicast_groups"] == {"1": [1, 2, 3, 4]}
    assert d["result_rewrite"] == [
        [[k + 1], "set_result_dst", [0x020000000000 + k + 1, 0x0A000000 + k + 1]] for k in range(4)
    ]
    assert sorted(d["l2_forward"]) == [
        [[0x020000000000 + k + 1], "forward", [k + 1]] for k in range(4)
    ]
    wait_for("ack of epoch 1", lambda: acked(ctl).get("s1") == 1)

    # A new plan (group 2 gone, group 1 with 4 slots at 16) while the agent runs.
    p2 = sample_plan(ina_groups=1, workers=4)
    p2.prefill.groups[0].slots.start, p2.prefill.groups[0].slots.count = 16, 4  # type: ignore[union-attr]
    with grpc.insecure_channel(f"127.0.0.1:{ctl}") as ch:
        r = pb_grpc.AdminStub(ch).ApplyPlan(pb.ApplyPlanRequest(plan_json=p2.to_json()))
    assert r.epoch == 2
    # Group 1 already holds 8 slots and now wants 4: re-allocated at the preferred 16.
    want2 = expected_entries([(1, 16, 4)])
    wait_for("the new plan on the switch", lambda: dump(sw)["aggregation_table"] == want2, 60)
    wait_for("ack of epoch 2", lambda: acked(ctl).get("s1") == 2)

    # Kill the agent; tamper with the switch; restart the agent: it reconciles.
    procs.kill("agent")
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    subprocess.run(
        [PY, "-c", _TAMPER, f"127.0.0.1:{sw}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    d = dump(sw)
    assert [[99, 0], "set_slot", [500, 2, 99]] in d["aggregation_table"]
    assert d["multicast_groups"]["99"] == [3]
    start_agent(procs, sw, ctl)
    wait_for(
        "reconciled entries",
        lambda: (lambda x: x["aggregation_table"] == want2 and "99" not in x["multicast_groups"])(
            dump(sw)
        ),
        60,
    )
    assert "already runs our pipeline" in procs.log("agent")
    # Telemetry (port counters polled every 0.2 s) reaches the controller's metrics.
    wait_for(
        "telemetry", lambda: metric(procs.metrics_port, "heroserve_telemetry_reports_total") > 0
    )


def test_agent_rejects_bad_arguments() -> None:
    env = dict(os.environ)
    for extra in (
        ["--port", "x"],
        ["--port", "1=h,mac=zz"],
        ["--port", "999=h"],
        ["--device-id", "-1"],
        ["--tls-cert", "a"],
    ):
        args = ["--switch", "127.0.0.1:1", "--controller", "127.0.0.1:2", "--device-id", "1"]
        if extra[0] == "--device-id":
            args = args[:-2]
        r = subprocess.run(
            [PY, "-m", "agents.switch", *args, *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert r.returncode == 2, (extra, r.stderr)
        assert b"Traceback" not in r.stderr
