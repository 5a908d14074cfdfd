"""BMv2 for the P4 tests: finding the toolchain, compiling the v1model program, and running
packet sequences through ``simple_switch_grpc`` in a network namespace of its own.

One documented way to reach the toolchain for every P4 test: the binaries on ``PATH``
(``p4c-bm2-ss``, ``p4test``, ``simple_switch_grpc``), with their libraries on
``LD_LIBRARY_PATH`` where they are not on the linker's path, e.g.
``PATH=/opt/p4/bin:$PATH LD_LIBRARY_PATH=/opt/p4/lib pytest ...`` (README.md, docs/dataplane.md).
Tests skip with the reason when a tool is missing.

``simple_switch_grpc`` opens a Thrift port on every address, so it only ever runs inside
a namespace created here; its ports are veth pairs inside that namespace, whose other
ends the driver (this file run as a script inside the namespace) uses to inject frames
and capture what the switch sends. The driver programs the switch through P4Runtime
(p4runtime-shell), sends each frame and waits until the switch's ingress counted it (so
frames on different ports reach the pipeline in the order given, as the model sees them),
collects every port's output frames in order, and reads the counters.

Not a test module.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# tests/ is on the path: pytest's rootdir setup, or CHILD_ENV when this runs as a script
from support.p4rt import CHILD_ENV, program

# tests/support/bmv2.py; not `from support import ROOT`: this file also runs as a script
ROOT = Path(__file__).resolve().parents[2]
P4_SRC = ROOT / "p4" / "heroserve_ina.p4"
P4INFO = ROOT / "p4" / "heroserve_ina.p4info.txtpb"
ENV = CHILD_ENV

# Counters compared between the model and BMv2: name -> cells read.
COUNTERS = {
    "InaIngress.ina_drops": 16,
    "InaIngress.ina_events": 8,
    "InaIngress.slot_reclaims": 1,
    "InaIngress.lane_overflows": 1,
    "InaIngress.port_rx": 16,
    "InaEgress.port_tx": 16,
}


def tool_missing(*tools: str) -> str | None:
    """None when every tool is on PATH, else the reason to skip."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH (the P4 toolchain; see docs/dataplane.md)"
    return None


def bmv2_missing() -> str | None:
    """Why the BMv2 tests cannot run here, or None."""
    reason = tool_missing("p4c-bm2-ss", "simple_switch_grpc")
    if reason:
        return reason
    if os.geteuid() != 0:
        return "BMv2 runs in a network namespace of its own: needs root"
    if shutil.which("ip") is None:
        return "`ip` not found (Debian package iproute2)"
    return None


def compile_v1model(out_dir: Path) -> tuple[Path, Path]:
    """p4c-bm2-ss on the v1model program: (BMv2 JSON, p4c's P4Info text). Raises
    CalledProcessError with p4c's messages when it fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out_json, p4info = out_dir / "heroserve_ina.json", out_dir / "heroserve_ina.p4info.txtpb"
    subprocess.run(
        [
            "p4c-bm2-ss",
            "--p4v",
            "16",
            "--p4runtime-files",
            str(p4info),
            "-o",
            str(out_json),
            str(P4_SRC),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out_json, p4info


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Bmv2Netns:
    """A namespace with ``simple_switch_grpc`` on ports 1..``ports`` (veth pairs ``s<p>``
    in the switch, ``h<p>`` for the driver), no pipeline until the driver sets one.
    Removes the namespace (and so every interface in it) and stops the switch on exit."""

    def __init__(self, ports: int = 9) -> None:
        self.ns = f"hsbm{os.getpid() % 100000}"
        self.ports = ports
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def _in_ns(self, *cmd: str) -> None:
        _sh("ip", "netns", "exec", self.ns, *cmd)

    def __enter__(self) -> Bmv2Netns:
        _sh("ip", "netns", "add", self.ns)
        try:
            self._in_ns("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            self._in_ns("sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            self._in_ns("ip", "link", "set", "lo", "up")
            cmd = ["simple_switch_grpc", "--device-id", "1", "--no-p4"]
            for p in range(1, self.ports + 1):
                self._in_ns("ip", "link", "add", f"s{p}", "type", "veth", "peer", "name", f"h{p}")
                for end in (f"s{p}", f"h{p}"):
                    self._in_ns("ip", "link", "set", end, "mtu", "9000")
                    self._in_ns("ip", "link", "set", end, "up")
                cmd += ["-i", f"{p}@s{p}"]
            cmd += ["--", "--grpc-server-addr", "127.0.0.1:9559"]
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, *cmd],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)

    def run(self, bmv2_json: Path, sequences: list[dict], timeout: float = 600) -> list[dict]:
        """Run each ``{"setup": ..., "frames": [[port, hex], ...]}`` on a freshly set
        pipeline; per sequence ``{"outputs": {port: [hex, ...]}, "counters": {...}}``."""
        assert self.proc is not None
        job = json.dumps({"json": str(bmv2_json), "sequences": sequences})
        proc = subprocess.run(
            ["ip", "netns", "exec", self.ns, sys.executable, __file__, str(self.ports)],
            input=job,
            env=ENV,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"BMv2 driver failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_key() -> str:
    """Changes when the P4 source does (for callers that cache compiled outputs)."""
    return hashlib.sha256(P4_SRC.read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------
# The driver (runs inside the namespace, pure-Python protobuf for p4runtime-shell).


def _drive(ports: int, job: dict) -> list[dict]:
    import socket

    import p4runtime_sh.shell as sh
    from google.protobuf import text_format
    from p4.config.v1 import p4info_pb2

    info = text_format.Parse(P4INFO.read_text(), p4info_pb2.P4Info())
    units = {c.preamble.name: c.spec.unit for c in info.counters}

    socks = {}
    for p in range(1, ports + 1):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        s.bind((f"h{p}", 0))
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        socks[p] = s

    def drain(into: dict[int, list[str]]) -> int:
        n = 0
        for p, s in socks.items():
            while True:
                try:
                    data, addr = s.recvfrom(65536)
                except BlockingIOError:
                    break
                if addr[2] == socket.PACKET_OUTGOING:
                    continue  # what this driver sent
                into.setdefault(p, []).append(data.hex())
                n += 1
        return n

    def rx_count(port: int) -> int:
        ce = sh.CounterEntry("InaIngress.port_rx")
        ce.index = port
        return next(iter(ce.read())).data.packet_count

    deadline = time.monotonic() + 30
    while True:  # the switch's gRPC server comes up a moment after the process
        try:
            sh.setup(
                device_id=1,
                grpc_addr="127.0.0.1:9559",
                election_id=(0, 1),
                config=sh.FwdPipeConfig(str(P4INFO), job["json"]),
                verbose=False,
            )
            break
        except BaseException:  # p4runtime-shell exits (SystemExit) when it cannot connect
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    results = []
    for n, seq in enumerate(job["sequences"]):
        if n:
            sh.teardown()
            sh.setup(
                device_id=1,
                grpc_addr="127.0.0.1:9559",
                election_id=(0, 1),
                config=sh.FwdPipeConfig(str(P4INFO), job["json"]),
                verbose=False,
            )
        program(sh, seq["setup"])
        outputs: dict[int, list[str]] = {}
        drain({})
        sent: dict[int, int] = {}
        for port, frame_hex in seq["frames"]:
            socks[port].send(bytes.fromhex(frame_hex))
            sent[port] = sent.get(port, 0) + 1
            limit = time.monotonic() + 10
            while rx_count(port) < sent[port]:
                if time.monotonic() > limit:
                    raise RuntimeError(f"BMv2 never counted frame {sum(sent.values())} on {port}")
                time.sleep(0.001)
            drain(outputs)
        quiet = time.monotonic()
        while time.monotonic() - quiet < 0.5:  # egress threads may still be sending
            if drain(outputs):
                quiet = time.monotonic()
            time.sleep(0.02)
        counters = {}
        for name, cells in COUNTERS.items():
            got = {c.index: c.data for c in sh.CounterEntry(name).read()}
            # BMv2 counts bytes in every counter; a PACKETS counter's byte_count means
            # nothing in P4Runtime (the model reports 0), so only BOTH keeps it.
            with_bytes = units[name] == p4info_pb2.CounterSpec.BOTH
            counters[name] = [
                [got[i].packet_count, got[i].byte_count if with_bytes else 0]
                if i in got
                else [0, 0]
                for i in range(cells)
            ]
        results.append({"outputs": {str(p): f for p, f in outputs.items()}, "counters": counters})
        # A pipeline push empties PI's view of the multicast groups but leaves them in
        # BMv2's replication engine (simple_switch_grpc 1.15.5): a group inserted again
        # after the next push would replicate twice. Delete them while PI knows them.
        for group in list(sh.MulticastGroupEntry().read()):
            group.delete()
    sh.teardown()
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    try:
        print(json.dumps(_drive(int(sys.argv[1]), json.loads(sys.stdin.read()))), flush=True)
    except BaseException:
        # p4runtime-shell's stream thread is not a daemon: without this exit a failed
        # driver would hang until the caller's timeout instead of reporting.
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def start_on_ports(ports: list[str], ns: str, grpc_port: int = 9559) -> subprocess.Popen:
    """``simple_switch_grpc`` with no program, in a new namespace ``ns`` that takes the switch
    ends ``ports`` (ports 1..n): it opens a Thrift port on every address, so it never runs in
    the caller's namespace. Its P4Runtime server is ``127.0.0.1:grpc_port`` inside ``ns``
    (reach it with ``p4rt.run_child(..., ns=ns)``); delete ``ns`` after stopping it."""
    _sh("ip", "netns", "add", ns)
    _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    cmd = ["ip", "netns", "exec", ns, "simple_switch_grpc", "--device-id", "1", "--no-p4"]
    for i, p in enumerate(ports):
        _sh("ip", "link", "set", p, "netns", ns)
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{p}.disable_ipv6=1")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", p, "up")
        cmd += ["-i", f"{i + 1}@{p}"]
    cmd += ["--", "--grpc-server-addr", f"127.0.0.1:{grpc_port}"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
