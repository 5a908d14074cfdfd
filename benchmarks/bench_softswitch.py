"""Aggregation rate of the executable INA switch model.

1. Pure pipeline (no sockets): rounds of N workers x 32 int32 values through
   ``InaPipeline.process``; prints contributions/s, results/s and the implied goodput.
2. Over veth pairs (root only, skipped otherwise): the ``python -m agents.softswitch``
   process with one port per worker; the workers' frames are injected with AF_PACKET
   from this process in a window, results counted as they come back.

    .venv/bin/python benchmarks/bench_softswitch.py [--rounds 2000] [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.ina.packet import (  # noqa: E402
    INA_UDP_PORT,
    MAX_WORKERS,
    VECTOR_LEN,
    InaHeader,
    build_frame,
)
from agents.softswitch.pipeline import InaPipeline  # noqa: E402

SLOTS = 64  # window of in-flight aggregator slots, as a host library would use


def frames_for(workers: int, rounds: int) -> list[list[bytes]]:
    """Per round, each worker's frame; round r is round r // SLOTS of aggregator r % SLOTS
    (version and generation from that, as a host library sends them)."""
    out = []
    for r in range(rounds):
        agg = r % SLOTS
        out.append(
            [
                build_frame(
                    InaHeader.at_round(1, agg, w, workers, r // SLOTS),
                    [(r + w + i) % 1000 for i in range(VECTOR_LEN)],
                    src_mac=f"02:00:00:00:01:{w + 1:02x}",
                )
                for w in range(workers)
            ]
        )
    return out


def setup(p: InaPipeline, workers: int) -> None:
    for agg in range(SLOTS):
        p.add_group(1, agg, slot=agg, workers=workers, mcast=1)
    for w in range(workers):
        p.bind_worker(1, w, w + 1)
    p.pre.insert(1, [(w + 1, 0) for w in range(workers)])


def bench_pipeline(workers: int, rounds: int) -> None:
    p = InaPipeline()
    setup(p, workers)
    rounds_frames = frames_for(workers, rounds)
    results = 0
    t0 = time.perf_counter()
    for frames in rounds_frames:
        for w, f in enumerate(frames):
            results += bool(p.process(w + 1, f))
    dt = time.perf_counter() - t0
    n = workers * rounds
    assert results == rounds, (results, rounds)
    print(f"pipeline: {workers} workers, {rounds} rounds, {n} contributions in {dt:.3f} s")
    print(f"  {n / dt:,.0f} contributions/s, {rounds / dt:,.0f} results/s")
    print(f"  {dt / n * 1e6:.1f} us per contribution (incl. {workers}-way multicast on completion)")
    print(f"  aggregated payload: {rounds * VECTOR_LEN * 4 / dt / 1e6:.2f} MB/s of int32 results")


def bench_veth(workers: int, rounds: int) -> None:
    if os.geteuid() != 0:
        print("veth: skipped (needs root for veth pairs and AF_PACKET)")
        return
    tag = os.getpid() % 100000
    sw_ports = [f"hb{tag}s{w}" for w in range(workers)]
    host_ports = [f"hb{tag}h{w}" for w in range(workers)]
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python", PYTHONPATH=str(ROOT))
    proc = None
    socks: list[socket.socket] = []
    try:
        for s, h in zip(sw_ports, host_ports, strict=True):
            subprocess.run(
                ["ip", "link", "add", s, "type", "veth", "peer", "name", h],
                check=True,
                capture_output=True,
            )
            for name in (s, h):
                subprocess.run(
                    ["sysctl", "-qw", f"net.ipv6.conf.{name}.disable_ipv6=1"], capture_output=True
                )
                subprocess.run(["ip", "link", "set", name, "up"], check=True)
        cmd = [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
        cmd += ["--p4info", str(ROOT / "p4" / "heroserve_ina.p4info.txtpb")]
        for w, s in enumerate(sw_ports):
            cmd += ["-i", f"{w + 1}@{s}"]
        # Table entries come from the benchmark's own setup, loaded through a tiny driver:
        # the model process exposes no packet-injection API, so program it over P4Runtime.
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT
        )
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split("=")[1])
        subprocess.run(
            [sys.executable, "-c", _PROGRAM, str(port), str(workers), str(SLOTS)],
            env=env,
            check=True,
            cwd=ROOT,
        )
        for h in host_ports:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((h, 0))
            s.setblocking(False)
            socks.append(s)
        rounds_frames = frames_for(workers, rounds)
        got = 0
        sent_rounds = 0
        window = SLOTS // 2  # rounds in flight: never reuse a version still open
        t0 = time.perf_counter()
        deadline = t0 + 60
        while got < rounds * workers and time.perf_counter() < deadline:
            while sent_rounds < rounds and sent_rounds - got // workers < window:
                for w, f in enumerate(rounds_frames[sent_rounds]):
                    socks[w].send(f)
                sent_rounds += 1
            for s in socks:
                while True:
                    try:
                        data, addr = s.recvfrom(2048)
                    except BlockingIOError:
                        break
                    if addr[2] == 4:  # our own outgoing frames
                        continue
                    if len(data) >= 44 and int.from_bytes(data[36:38], "big") == INA_UDP_PORT:
                        got += 1
        dt = time.perf_counter() - t0
        print(
            f"veth: {workers} workers, {sent_rounds} rounds sent, {got} results received "
            f"in {dt:.3f} s"
        )
        print(
            f"  {sent_rounds * workers / dt:,.0f} contributions/s, {got / workers / dt:,.0f} "
            f"complete rounds/s (window {window} rounds)"
        )
    finally:
        for s in socks:
            s.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        for s in sw_ports:
            subprocess.run(["ip", "link", "del", s], capture_output=True)


_PROGRAM = r"""
import sys
import p4runtime_sh.shell as sh
port, workers, slots = (int(a) for a in sys.argv[1:4])
sh.setup(device_id=1, grpc_addr=f"127.0.0.1:{port}", election_id=(0, 1), verbose=False)
for agg in range(slots):
    te = sh.TableEntry("InaIngress.aggregation_table")(action="InaIngress.set_slot")
    te.match["group_id"] = "1"
    te.match["agg_index"] = str(agg)
    te.action["slot"] = str(agg)
    te.action["num_workers"] = str(workers)
    te.action["mcast_grp"] = "1"
    te.insert()
for w in range(workers):
    te = sh.TableEntry("InaIngress.worker_port")(action="InaIngress.set_worker_port")
    te.match["group_id"] = "1"
    te.match["worker_id"] = str(w)
    te.action["port"] = str(w + 1)
    te.insert()
g = sh.MulticastGroupEntry(1)
for w in range(workers):
    g.add(w + 1, 0)
g.insert()
sh.teardown()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--no-veth", action="store_true", help="only the pure pipeline")
    args = ap.parse_args()
    if not 1 <= args.workers <= MAX_WORKERS or args.rounds < 1:
        print(
            f"bench_softswitch: --workers must be 1..{MAX_WORKERS} and --rounds >= 1",
            file=sys.stderr,
        )
        return 2
    bench_pipeline(args.workers, args.rounds)
    if not args.no_veth:
        bench_veth(args.workers, min(args.rounds, 2000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
