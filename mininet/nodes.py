"""Mininet node classes of the HeroServe emulation (docs/emulation.md).

Loaded by ``controller/emulate/mn.py`` as ``heroserve_mininet.nodes`` after Debian's
``mininet`` package (not importable as ``mininet.*`` from here: this folder shares its name).

* :class:`GpuHost`: one GPU (or plain host) in its own network namespace.
* :class:`NvlinkFabric`: a server's NVLink fabric, a Linux bridge (``ip link``; never Open
  vSwitch, whose kernel module is not available).
* :class:`LinkEmulator`: the user-space link emulator (``linkemu.py``) that impairs the
  hosts' NIC links: each of its port pairs sits between a host's NIC and its switch port.
* :class:`P4Switch`: a switch running the project's executable P4 switch
  (``python -m agents.softswitch``) on its ports in the root namespace, or BMv2's
  ``simple_switch_grpc`` in a namespace of its own reached over a management veth (BMv2 opens
  a Thrift port on every address, which must not face the machine's network).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from mininet.node import Host, Switch

# Offloads off on every emulated interface: the switches forward with raw sockets, so a
# frame must leave its sender with its checksum computed and at most one MTU long.
OFFLOADS = "rx off tx off sg off tso off gso off gro off"


def run_script(node, lines: list[str], path: Path) -> str:
    """Run shell lines in ``node``'s namespace in one round trip; their output."""
    path.write_text("\n".join(lines) + "\n")
    return node.cmd(f"bash {path} 2>&1")


def interface_setup(intf: str) -> list[str]:
    """Shell lines that ready an emulated interface (no IPv6 chatter, no offloads)."""
    return [
        f"sysctl -qw net.ipv6.conf.{intf}.disable_ipv6=1 2>/dev/null",
        f"ethtool -K {intf} {OFFLOADS} >/dev/null 2>&1",
        f"ip link set {intf} up",
    ]


class GpuHost(Host):
    """A GPU's host. ``configure`` gives it its addresses, neighbours and routes (send to
    every host first, then ``wait_configured`` each: the hosts' shells work in parallel)."""

    def configure(self, lines: list[str], workdir: Path) -> None:
        base = [
            "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
            # PXN relays forward for their NVLink peers; replies may come back another way.
            "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0",
            "sysctl -qw net.ipv4.conf.default.rp_filter=0",
            # NCCL keeps its channels open and hot: a ring step that waited for its neighbour
            # must not restart from TCP's slow start.
            "sysctl -qw net.ipv4.tcp_slow_start_after_idle=0",
            "ip link set lo up",
        ]
        path = workdir / f"{self.name}.sh"
        path.write_text("\n".join(base + lines) + "\n")
        self.sendCmd(f"bash {path} 2>&1")

    def wait_configured(self) -> None:
        out = self.waitOutput()
        if "Error" in out or "RTNETLINK" in out:
            raise RuntimeError(f"configuring host {self.name}: {out.strip()[:400]}")


class NvlinkFabric(Switch):
    """A Linux bridge joining the NVLink interfaces of one server's GPUs, in a network
    namespace of its own (Mininet's default for a node): nothing of it in the root namespace."""

    def start(self, controllers: list) -> None:
        lines = [
            f"ip link add name {self.name} type bridge stp_state 0",
            f"sysctl -qw net.ipv6.conf.{self.name}.disable_ipv6=1",
        ]
        for intf in self.intfList():
            if intf.name == "lo":
                continue
            lines += interface_setup(intf.name)
            lines.append(f"ip link set {intf.name} master {self.name}")
        lines.append(f"ip link set {self.name} up")
        out = run_script(self, lines, Path(self.params["workdir"]) / f"{self.name}.sh")
        if "Error" in out or "RTNETLINK" in out:
            raise RuntimeError(f"bridge {self.name}: {out.strip()[:400]}")

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        self.cmd(f"ip link del {self.name} 2>/dev/null")
        super().stop(deleteIntfs)


class P4Switch(Switch):
    """One emulated switch: its P4 program runs in a process this node owns.

    Params: ``device_id``, ``ports`` ({port number: interface}), ``workdir``, ``python``,
    ``root`` (repository), ``kind`` ("model" or "bmv2"), ``bmv2_json`` (compiled program,
    bmv2 only), ``mgmt`` ((root-side interface, root IP, switch IP), bmv2 only)."""

    def __init__(self, name: str, **params) -> None:
        super().__init__(name, inNamespace=params.get("kind") == "bmv2", **params)
        self.proc: subprocess.Popen | None = None
        self.p4runtime = ""

    def start(self, controllers: list) -> None:
        p = self.params
        workdir = Path(p["workdir"])
        lines: list[str] = []
        for intf in self.intfList():
            if intf.name != "lo":
                lines += interface_setup(intf.name)
        run_script(self, lines, workdir / f"{self.name}-ports.sh")
        log = open(workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - lives with the process
        ifs = [f"{port}@{name}" for port, name in sorted(p["ports"].items())]
        if p.get("kind") == "bmv2":
            self._start_bmv2(ifs, log)
        else:
            self._start_model(ifs, log)

    def wait_started(self) -> None:
        """Until the switch serves P4Runtime (the model prints its port when it does)."""
        if self.p4runtime:
            return
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("P4RUNTIME_PORT="):
            raise RuntimeError(f"switch {self.name} did not start (see its log)")
        self.p4runtime = f"127.0.0.1:{int(line.split('=')[1])}"

    def _start_model(self, ifs: list[str], log) -> None:
        p = self.params
        cmd = [p["python"], "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
        cmd += ["--device-id", str(p["device_id"])]
        for i in ifs:
            cmd += ["-i", i]
        env = dict(os.environ, PYTHONPATH=str(p["root"]))
        self.proc = subprocess.Popen(
            cmd,
            cwd=p["root"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )

    def _start_bmv2(self, ifs: list[str], log) -> None:
        p = self.params
        root_if, root_ip, sw_ip = p["mgmt"]
        lines = [
            f"ip link add {root_if} type veth peer name mgmt0 netns {self.pid}",
            f"ip addr add {root_ip}/30 dev {root_if}",
            f"ip link set {root_if} up",
        ]
        out = subprocess.run(
            ["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=30
        )
        if out.returncode:
            raise RuntimeError(f"management link of {self.name}: {out.stderr.strip()}")
        self.cmd(f"ip addr add {sw_ip}/30 dev mgmt0; ip link set mgmt0 up; ip link set lo up")
        addr = f"{sw_ip}:9559"
        cmd = ["simple_switch_grpc", "--device-id", str(p["device_id"]), "--no-p4"]
        for i in ifs:
            cmd += ["-i", i]
        cmd += ["--", "--grpc-server-addr", addr]
        self.proc = self.popen(cmd, stdout=log, stderr=log)  # mnexec -d: its own session
        self.p4runtime = addr
        time.sleep(1.0)  # simple_switch_grpc prints nothing when ready; its port answers soon
        if self.proc.poll() is not None:
            raise RuntimeError(f"simple_switch_grpc of {self.name} exited (see {log.name})")

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, PermissionError):
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        mgmt = self.params.get("mgmt")
        if mgmt:
            subprocess.run(["ip", "link", "del", mgmt[0]], capture_output=True, timeout=30)
        super().stop(deleteIntfs)


class LinkEmulator(Switch):
    """Frames between port ``2k - 1`` (switch side) and ``2k`` (host side) of every pair,
    impaired. Params: ``pairs`` ([(if_a, if_b)]), ``args`` (linkemu options), ``workdir``,
    ``python``, ``root``."""

    def __init__(self, name: str, **params) -> None:
        super().__init__(name, inNamespace=False, **params)
        self.proc: subprocess.Popen | None = None
        self.counters: dict = {}

    def start(self, controllers: list) -> None:
        p = self.params
        workdir = Path(p["workdir"])
        lines: list[str] = []
        for intf in self.intfList():
            if intf.name != "lo":
                lines += interface_setup(intf.name)
        run_script(self, lines, workdir / f"{self.name}-ports.sh")
        cmd = [p["python"], str(Path(p["root"]) / "mininet" / "linkemu.py"), *p["args"]]
        for a, b in p["pairs"]:
            cmd += ["--pair", f"{a},{b}"]
        log = open(workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError(f"link emulator {self.name} did not start (see {log.name})")

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=10)
                if out.strip():
                    import json

                    self.counters = json.loads(out.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        super().stop(deleteIntfs)
