"""Bring an emulated cluster up and take it down again: one piece of code for ``heroserve
emulate`` and ``heroserve demo`` (docs/emulation.md).

:class:`Cluster` starts, in order, the Mininet network (hosts, NVLink bridges, one P4 switch
per topology switch with its ports from the topology), the controller with the plan, a switch
agent per switch (``--port`` arguments from the same topology) and a GPU agent per server
(``build/csrc/heroserve-gpu-agent``), and waits until every agent acknowledged the plan's
epoch. Leaving the ``with`` block, normally, on an error, or on SIGINT, SIGTERM or SIGHUP,
stops everything in reverse order and sweeps what carries the run's tag: interfaces, shared
memory segments (``/dev/shm/heroserve-<tag>-*``), processes (each started in its own session
and killed by process group). Every process it starts has ``HEROSERVE_EMULATION=<tag>`` in
its environment, which is how a test finds leftovers. A run killed outright (SIGKILL) is
swept by its watchdog, and failing that by the next run (``controller/emulate/sweep.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from agents.ina.impairments import Impairments
from controller.emulate.mn import ROOT, load_network_module
from controller.emulate.spec import NetworkSpec
from controller.emulate.sweep import (
    ENV_TAG,
    RUN_FILE,
    SHM_DIR,
    WORKDIR_PREFIX,
    Watchdog,
    root_interfaces,
    shm_prefix,
    start_watchdog,
    sweep_dead_runs,
    tagged_pids,
    write_run_file,
)
from controller.errors import InputError
from controller.plan import Plan

log = logging.getLogger("heroserve.emulate")

GPU_AGENT = ROOT / "build" / "csrc" / "heroserve-gpu-agent"
ACK_TIMEOUT_S = 120.0  # agents of a loaded 2-core machine acknowledge within seconds


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so the teardown runs."""


def leftovers(tag: str) -> dict[str, list[str]]:
    """What a run with ``tag`` left behind: interfaces, shm segments, processes."""
    ifs = root_interfaces(tag)
    shm = sorted(p.name for p in SHM_DIR.glob(f"heroserve-{shm_prefix(tag)}*"))
    procs = [f"{pid} {cmd}" for pid, cmd in sorted(tagged_pids(tag).items())]
    return {"interfaces": ifs, "shm": shm, "processes": procs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float, proc_check=None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        if proc_check is not None:
            proc_check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path


@dataclass
class Processes:
    """Processes of the control plane, each in its own session, stopped in reverse order."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        path = self.workdir / f"{name}.log"
        with open(path, "ab") as out:
            p = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env or dict(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, p, path)
        self.procs.append(proc)
        return proc

    def check(self) -> None:
        """Raise naming the first process that died, with the tail of its log."""
        for p in self.procs:
            if p.popen.poll() is not None:
                tail = p.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(
                    f"{p.name} exited with status {p.popen.returncode}: " + " | ".join(tail)
                )

    def stop(self) -> None:
        for p in reversed(self.procs):
            _kill_group(p.popen)
        self.procs.clear()


def _kill_group(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(grace_s)
    else:  # its children may outlive it: the group goes too
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@contextmanager
def handle_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C (SIGINT) while the block runs."""

    def raise_interrupted(signum: int, _frame: object) -> None:
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    old = {s: signal.signal(s, raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class ClusterOptions:
    switch_kind: str = "model"  # "model" (the executable switch) or "bmv2"
    impair: Impairments | None = None
    impair_seed: int = 0
    telemetry_interval_s: float = 1.0
    keep_workdir: bool = False


@dataclass
class Cluster:
    """The emulated network and the control plane of one plan (module docstring)."""

    g: nx.Graph
    topology: str  # what the controller's --topology gets: a built-in name or a file
    spec: NetworkSpec
    plan: Plan
    opts: ClusterOptions = field(default_factory=ClusterOptions)
    workdir: Path = field(init=False)
    net: Any = field(init=False, default=None)
    procs: Processes = field(init=False)
    controller_addr: str = field(init=False, default="")
    metrics_port: int = field(init=False, default=0)
    gpu_agents: list[str] = field(init=False, default_factory=list)
    notes: list[str] = field(init=False, default_factory=list)
    # called once the network is up, before the control plane starts (emulate starts its
    # host workers there, so that they come up while the agents do)
    on_network_up: Callable[[], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{self.spec.tag}-"))
        self.procs = Processes(self.workdir)
        self.watchdog: Watchdog | None = None

    # -- up ------------------------------------------------------------------------------
    def start(self) -> None:
        for tag, swept in sweep_dead_runs().items():  # a run killed before it tore down
            log.warning("swept the leftovers of dead run %s: %s", tag, swept)
        # Before anything carries the tag: a SIGKILL from here on is swept (sweep.py).
        write_run_file(self.workdir, self.spec.tag)
        self.watchdog = start_watchdog(self.spec.tag, self.workdir)
        os.environ[ENV_TAG] = self.spec.tag
        bmv2_json = self._bmv2() if self.opts.switch_kind == "bmv2" else None
        netmod = load_network_module()
        self.net = netmod.EmulatedNetwork(
            self.spec,
            workdir=self.workdir,
            python=sys.executable,
            root=ROOT,
            switch_kind=self.opts.switch_kind,
            impair=self.opts.impair,
            impair_seed=self.opts.impair_seed,
            bmv2_json=bmv2_json,
        )
        t0 = time.monotonic()
        self.net.start()
        log.info(
            "network up: %d hosts, %d switches, %d NVLink bridges in %.1fs",
            len(self.spec.hosts),
            len(self.spec.switches),
            len(self.spec.bridges),
            time.monotonic() - t0,
        )
        if self.on_network_up is not None:
            self.on_network_up()
        self._start_controller()
        for s in self.spec.switches:
            self._start_switch_agent(s, bmv2_json)
        self._start_gpu_agents()
        epoch = self.wait_acks()
        log.info("every agent acknowledged epoch %d", epoch)

    def _bmv2(self) -> str:
        for tool in ("p4c-bm2-ss", "simple_switch_grpc"):
            if shutil.which(tool) is None:
                raise InputError(f"--switch bmv2: `{tool}` is not on PATH (docs/emulation.md)")
        out = self.workdir / "heroserve_ina.json"
        p4info = self.workdir / "p4info.txtpb"
        r = subprocess.run(
            ["p4c-bm2-ss", "--p4v", "16", "--p4runtime-files", str(p4info), "-o", str(out),
             str(ROOT / "p4" / "heroserve_ina.p4")],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if r.returncode:
            raise RuntimeError(f"p4c-bm2-ss failed: {r.stderr.strip()[:400]}")
        return str(out)

    def _start_controller(self) -> None:
        plan_path = self.workdir / "plan.json"
        self.plan.save(plan_path)
        port_file = self.workdir / "controller.port"
        self.metrics_port = free_port()
        self.procs.start(
            "controller",
            [
                sys.executable, "-m", "controller.service", "--db", str(self.workdir / "c.db"),
                "--plan", str(plan_path), "--topology", self.topology,
                "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                "--metrics-port", str(self.metrics_port),
            ],
        )  # fmt: skip
        wait_for("the controller's port", port_file.exists, 60, self.procs.check)
        self.controller_addr = f"127.0.0.1:{int(port_file.read_text())}"

    def _start_switch_agent(self, switch: str, bmv2_json: str | None) -> None:
        sw = self.spec.switches[switch]
        argv = [
            sys.executable, "-m", "agents.switch", "--switch", self.net.p4runtime(switch),
            "--controller", self.controller_addr, "--device-id", str(sw.device_id),
            "--node-id", switch, "--telemetry-interval", str(self.opts.telemetry_interval_s),
        ]  # fmt: skip
        if bmv2_json:
            argv += ["--device-config", bmv2_json]
        for p in sw.agent_ports():
            argv += ["--port", p]
        self.procs.start(f"agent-{switch}", argv)

    def _start_gpu_agents(self) -> None:
        by_server: dict[str, list[str]] = {}
        for n, h in self.spec.hosts.items():
            if self.g.nodes[n]["kind"] == "gpu":
                by_server.setdefault(h.server or n, []).append(n)
        if not GPU_AGENT.exists():
            note = f"GPU agents not started: {GPU_AGENT.relative_to(ROOT)} is not built (make cxx)"
            self.notes.append(note)
            log.warning(note)
            return
        env = dict(os.environ, HEROSERVE_SHM_PREFIX=shm_prefix(self.spec.tag))
        for server, gpus in sorted(by_server.items()):
            argv = [str(GPU_AGENT), "--controller", self.controller_addr, "--node-id", server]
            for gpu in sorted(gpus, key=lambda n: self.g.nodes[n].get("index", 0)):
                argv += ["--gpu", f"{gpu}:{self.g.nodes[gpu].get('index', 0)}"]
            argv += ["--telemetry-interval", str(self.opts.telemetry_interval_s)]
            self.procs.start(f"gpu-agent-{server}", argv, env)
            self.gpu_agents.append(server)

    # -- state ---------------------------------------------------------------------------
    def state(self) -> Any:
        """The controller's Admin.GetState."""
        import grpc

        from agents.proto.heroserve.v1 import control_pb2 as pb
        from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc

        with grpc.insecure_channel(self.controller_addr) as ch:
            return pb_grpc.AdminStub(ch).GetState(pb.GetStateRequest(), timeout=10)

    def expected_agents(self) -> set[str]:
        return set(self.spec.switches) | set(self.gpu_agents)

    def wait_acks(self, timeout_s: float = ACK_TIMEOUT_S) -> int:
        """Wait until every agent acknowledged the current epoch; the epoch. On a timeout
        the error names the agents that did not."""
        missing: set[str] = set()
        epoch = 0

        def done() -> int:
            nonlocal missing, epoch
            st = self.state()
            epoch = st.epoch
            acked = {a.identity.node_id for a in st.agents if a.acked_epoch == st.epoch}
            missing = self.expected_agents() - acked
            return st.epoch if st.epoch and not missing else 0

        try:
            return wait_for("every agent's acknowledgement", done, timeout_s, self.procs.check)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}: epoch {epoch} not acknowledged by {', '.join(sorted(missing))} "
                "(their logs: --keep-logs)"
            ) from None

    def switch_entries(self) -> dict[str, dict[str, Any]]:
        """The INA entries every switch holds, read back through P4Runtime
        (``agents.switch.dump``, one process per switch, all at once)."""
        running = {}
        for s, sw in self.spec.switches.items():
            argv = [sys.executable, "-m", "agents.switch.dump", "--switch",
                    self.net.p4runtime(s), "--device-id", str(sw.device_id)]  # fmt: skip
            running[s] = subprocess.Popen(
                argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        out = {}
        for s, p in running.items():
            try:
                stdout, stderr = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            if p.returncode:
                raise RuntimeError(f"reading {s}'s entries: {stderr.strip()[-300:]}")
            out[s] = json.loads(stdout)
        return out

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read().decode()

    def shm_segments(self) -> list[tuple[str, int]]:
        return sorted(
            (p.name, p.stat().st_size)
            for p in SHM_DIR.glob(f"heroserve-{shm_prefix(self.spec.tag)}*")
        )

    # -- down ----------------------------------------------------------------------------
    def stop(self) -> dict[str, list[str]]:
        """Stop everything (idempotent); what had to be swept, for the log."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut it
        try:
            self.procs.stop()
            swept: list[str] = []
            if self.net is not None:
                swept = self.net.stop()
            for seg in SHM_DIR.glob(f"heroserve-{shm_prefix(self.spec.tag)}*"):
                seg.unlink(missing_ok=True)
            # A process started when an interrupt cut its bookkeeping (a Mininet shell being
            # created): ours by the tag in its environment, killed by pid.
            for pid in tagged_pids(self.spec.tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.opts.keep_workdir:
                (self.workdir / RUN_FILE).unlink(missing_ok=True)  # kept: not a dead run's
                print(f"logs kept in {self.workdir}", file=sys.stderr)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
            if self.watchdog is not None:
                self.watchdog.release()  # torn down: the watchdog leaves without sweeping
            return {"swept_interfaces": swept}
        finally:
            signal.signal(signal.SIGINT, old)
            os.environ.pop(ENV_TAG, None)

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
