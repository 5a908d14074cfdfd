"""Per-rank all-reduce goodput over real interfaces: the CollNet plugin against the Python
host library and a ring, in one run over the same veth pairs.

Four worker network namespaces joined by veth pairs to a switch process (the netns bed of
tests/support/netns.py, programmed over P4Runtime by tests/support/p4rt.py, as
tests/agents/collnet/test_collnet_netns.py does): first ``python -m agents.softswitch`` on
the veth ends, then, where ``p4c-bm2-ss`` and ``simple_switch_grpc`` are on PATH, BMv2
running the compiled ``p4/heroserve_ina.p4`` in a namespace of its own (else one line says
why it is skipped). Per switch and message size, the int32 all-reduce of every rank through

- ``plugin``: libnccl-net-heroserve.so's CollNet, driven by ``collnet_harness`` (one
  process per rank, one session per size, results checked bit for bit);
- ``python``: the host library's INA session (``python -m agents.ina.worker``, scheme ina);
- ``ring``: the same workers' TCP ring all-reduce (scheme ring), its frames forwarded by the
  switch's ``l2_forward`` table.

Goodput is message bytes / seconds of the slowest rank (an all-reduce is done when every
rank has its result), the median over the repeats. Where the switch is the bottleneck: the
switch process's CPU seconds over the timed seconds (near 1.0 = one core busy the whole
time: the single-threaded model is saturated), and, for the model, its pipeline alone (no
sockets, in this process) as a ceiling in INA rounds per second. Sizes a method would need
more than ``--budget`` seconds for (extrapolated from its last size) are skipped with a line.

    sudo .venv/bin/python benchmarks/collnet_goodput.py [--sizes 65536,...,67108864]
        [--budget 300] [--no-bmv2]

Needs root and the C++ build (HEROSERVE_CSRC_BUILD or build/csrc); without them one line
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from support import p4rt  # noqa: E402
from support.bmv2 import start_on_ports  # noqa: E402
from support.netns import (  # noqa: E402
    SWITCH_IP,
    N,
    NetnsBed,
    netns_unavailable,
    run_checked,
    start_collnet_rank,
    worker_ip,
    worker_mac,
)

from agents.ina.packet import VECTOR_BYTES  # noqa: E402

BUILD = Path(os.environ.get("HEROSERVE_CSRC_BUILD", ROOT / "build" / "csrc"))
LIB, HARNESS = BUILD / "libnccl-net-heroserve.so", BUILD / "collnet_harness"
GROUP = 9
# Aggregator slots per group: the in-flight window of benchmarks/bench_softswitch.py's veth
# run (docs/dataplane.md, "Measured"), the same for the plugin and the Python library.
WINDOW = 32
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
METHODS = ("plugin", "python", "ring")


def repeats_for(size: int) -> int:
    """Fewer repeats at large sizes: 3 up to 1 MiB, 2 up to 16 MiB, then 1."""
    return 3 if size <= 1 << 20 else 2 if size <= 16 << 20 else 1


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Switch:
    """A running switch process: its pid (CPU time), P4Runtime port and namespace."""

    def __init__(self, name: str, proc: subprocess.Popen, port: int, ns: str | None) -> None:
        self.name, self.proc, self.port, self.ns = name, proc, port, ns

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def start_softswitch(bed: NetnsBed) -> Switch:
    cmd = [sys.executable, "-m", "agents.softswitch", "--p4runtime", "127.0.0.1:0"]
    for i, p in enumerate(bed.ports):
        cmd += ["-i", f"{i + 1}@{p}"]
    proc = subprocess.Popen(
        cmd, env=p4rt.CHILD_ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("P4RUNTIME_PORT="):
        raise RuntimeError("the softswitch did not start")
    sw = Switch("softswitch", proc, int(line.split("=")[1]), None)
    p4rt.run_child(
        "program", sw.port, p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP, l2=True)
    )
    return sw


def start_bmv2(bed: NetnsBed, bmv2_json: Path) -> Switch:
    """simple_switch_grpc in a namespace of its own holding the switch ends
    (tests/support/bmv2.py ``start_on_ports``), programmed like the softswitch."""
    ns = f"hsw{os.getpid() % 100000}sw"
    sw = Switch("bmv2", start_on_ports(bed.ports, ns), 9559, ns)
    setup = p4rt.ina_setup(GROUP, {k: k for k in range(WINDOW)}, GROUP, l2=True)
    p4rt.run_child("program", sw.port, setup, ns=ns, bmv2_json=str(bmv2_json))
    return sw


def prepare_hosts(bed: NetnsBed) -> None:
    """Every worker knows the others' MACs (the ring's TCP needs no ARP through the switch),
    and sends complete checksums and plain-size frames: the switch reads frames with
    AF_PACKET, so offloaded checksums and GSO super-frames would reach the peer unfinished."""
    for w, ns in enumerate(bed.ns):
        for j in range(N):
            if j != w:
                run_checked(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "ip",
                    "neigh",
                    "add",
                    worker_ip(j),
                    "lladdr",
                    worker_mac(j),
                    "dev",
                    "eth0",
                )
        run_checked(
            "ip",
            "netns",
            "exec",
            ns,
            "ethtool",
            "-K",
            "eth0",
            "tx",
            "off",
            "tso",
            "off",
            "gso",
            "off",
            "gro",
            "off",
        )
    for p in bed.ports:
        run_checked("ethtool", "-K", p, "tx", "off", "tso", "off", "gso", "off", "gro", "off")


def run_plugin(
    bed: NetnsBed, tmp: Path, size: int, reps: int, session: int
) -> tuple[list[float], int]:
    """One harness process per rank, one session: ``reps`` all-reduces of ``size`` bytes.
    Seconds of the slowest rank per repeat and the ranks' retransmissions; raises unless
    every result was exact."""
    d = tmp / f"plugin-{session}"
    d.mkdir()
    group = {"group_id": GROUP, "window": WINDOW, "switch_ip": SWITCH_IP, "session": session,
             "first_generation": random.randrange(1 << 32), "give_up_s": 30}  # fmt: skip
    args = ["--types", "int32", "--sizes", ",".join([str(size)] * reps)]
    procs = [
        start_collnet_rank(bed, w, str(HARNESS), str(LIB), str(d), group, args, dict(os.environ))
        for w in range(N)
    ]
    per_rank, retx = [], 0
    for p in procs:
        out, err = p.communicate(timeout=3600)
        events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        res = [e for e in events if e.get("event") == "result"]
        if p.returncode != 0 or len(res) != reps or not all(e["exact"] for e in res):
            raise RuntimeError(f"plugin rank failed (exit {p.returncode}): {err[-2000:]}")
        per_rank.append([e["seconds"] for e in res])
        retx += sum(e["retransmissions"] for e in events if e.get("event") == "stats")
    return [max(r[i] for r in per_rank) for i in range(reps)], retx


class PythonWorkers:
    """One ``agents.ina.worker`` per namespace, kept for every size (its INA session's
    rounds live as long as the process)."""

    def __init__(self, bed: NetnsBed, session: int) -> None:
        self.session, self.first_gen, self.run = session, random.randrange(1 << 32), 0
        self.procs = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    "-m",
                    "agents.ina.worker",
                    "--name",
                    f"w{w}",
                    "--give-up",
                    "60",
                ],
                env=p4rt.CHILD_ENV,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for w, ns in enumerate(bed.ns)
        ]
        for p in self.procs:
            assert p.stdout is not None
            if not json.loads(p.stdout.readline()).get("ok"):
                raise RuntimeError("a Python worker did not start")

    def _all(self, cmds: list[dict]) -> list[dict]:
        for p, c in zip(self.procs, cmds, strict=True):
            assert p.stdin is not None
            p.stdin.write(json.dumps(c) + "\n")
            p.stdin.flush()
        answers = []
        for p in self.procs:
            assert p.stdout is not None
            a = json.loads(p.stdout.readline())
            if not a.get("ok"):
                raise RuntimeError(f"Python worker: {a.get('error')}")
            answers.append(a)
        return answers

    def allreduce(self, scheme: str, size: int, reps: int) -> tuple[list[float], int]:
        """Seconds of the slowest rank per repeat, and the ranks' retransmissions (INA or
        TCP)."""
        self.run += 1
        token = random.randrange(1 << 48)
        cmds = []
        for w in range(N):
            cmds.append(
                {
                    "op": "prepare",
                    "run": self.run,
                    "scheme": scheme,
                    "elements": size // 4,
                    "repeat": reps,
                    "seed": self.run,
                    "index": w,
                    "workers": N,
                    "ina": {
                        "group_id": GROUP,
                        "worker_id": w,
                        "num_workers": N,
                        "window": WINDOW,
                        "switch_ip": SWITCH_IP,
                        "session": self.session,
                        "first_generation": self.first_gen,
                    },
                    "ring": {"token": token, "channels": [[w, N, worker_ip((w + 1) % N)]]},
                }
            )
        self._all(cmds)
        answers = self._all([{"op": "go", "run": self.run}] * N)
        if len({a["digest"] for a in answers}) != 1:
            raise RuntimeError(f"{scheme}: the ranks' results differ")
        retx = sum(
            int(a["stats"].get("tcp_retransmissions", 0))
            + int((a["stats"].get("ina") or {}).get("retransmissions", 0))
            for a in answers
        )
        return [max(a["seconds"][i] for a in answers) for i in range(reps)], retx

    def stop(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write('{"op": "quit"}\n')
            p.stdin.flush()
        for p in self.procs:
            p.wait(timeout=60)


def pipeline_ceiling() -> float:
    """INA rounds per second of the model's pipeline alone (4 workers, no sockets)."""
    from bench_softswitch import frames_for, setup

    from agents.softswitch.pipeline import InaPipeline

    pipe = InaPipeline()
    setup(pipe, N)
    rounds = frames_for(N, 2000)
    t0 = time.perf_counter()
    for frames in rounds:
        for w, f in enumerate(frames):
            pipe.process(w + 1, f)
    return len(rounds) / (time.perf_counter() - t0)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def measure(
    sw: Switch, bed: NetnsBed, tmp: Path, sizes: list[int], budget: float, session: int
) -> tuple[list[dict], int]:
    """Every method at every size on one switch, the methods interleaved per size so that
    they share the machine's load alike. Rows: size, method -> (goodput B/s, switch CPU
    share) or None (skipped)."""
    rows, last = [], {}  # method -> (size, seconds per repeat)
    for size in sizes:
        reps, row = repeats_for(size), {"size": size}
        workers: PythonWorkers | None = None  # fresh per size: a new INA session each
        try:
            for m in METHODS:
                pred = last[m][1] * size / last[m][0] * reps if m in last else 0.0
                if pred > budget:
                    print(
                        f"  {sw.name} {m:>6} {size >> 10:>6} KiB: skipped, ~{pred:.0f} s "
                        f"predicted > --budget {budget:.0f} s",
                        flush=True,
                    )
                    row[m] = None
                    continue
                if m != "plugin" and workers is None:
                    session += 1
                    workers = PythonWorkers(bed, session)
                c0 = cpu_seconds(sw.proc.pid)
                if m == "plugin":
                    session += 1
                    secs, retx = run_plugin(bed, tmp, size, reps, session)
                else:
                    assert workers is not None
                    secs, retx = workers.allreduce("ina" if m == "python" else "ring", size, reps)
                share = (cpu_seconds(sw.proc.pid) - c0) / sum(secs)
                last[m] = (size, median(secs))
                row[m] = (size / median(secs), share, retx)
                print(
                    f"  {sw.name} {m:>6} {size >> 10:>6} KiB x{reps}: "
                    f"{size / median(secs) / 2**20:8.2f} MiB/s per rank, switch CPU "
                    f"{share:.2f} of the timed seconds, {retx} retx",
                    flush=True,
                )
        finally:
            if workers is not None:
                workers.stop()
        rows.append(row)
    return rows, session


def table(name: str, rows: list[dict], ceiling: float | None) -> str:
    def cell(r: dict, m: str) -> str:
        return "skipped" if r[m] is None else f"{r[m][0] / 2**20:.2f}"

    def ratio(r: dict, a: str, b: str) -> str:
        return "-" if r[a] is None or r[b] is None else f"{r[a][0] / r[b][0]:.2f}"

    out = [
        "| switch | size | plugin MiB/s | python INA MiB/s | ring MiB/s | plugin / python | "
        "plugin / ring | switch CPU share (plugin, python, ring) | retransmissions (plugin, "
        "python, ring) | plugin INA rounds/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shares = ", ".join("-" if r[m] is None else f"{r[m][1]:.2f}" for m in METHODS)
        retx = ", ".join("-" if r[m] is None else str(r[m][2]) for m in METHODS)
        rounds = "-" if r["plugin"] is None else f"{r['plugin'][0] / VECTOR_BYTES:,.0f}"
        size = f"{r['size'] >> 20} MiB" if r["size"] >= 1 << 20 else f"{r['size'] >> 10} KiB"
        out.append(
            f"| {name} | {size} | {cell(r, 'plugin')} | {cell(r, 'python')} | "
            f"{cell(r, 'ring')} | {ratio(r, 'plugin', 'python')} | "
            f"{ratio(r, 'plugin', 'ring')} | {shares} | {retx} | {rounds} |"
        )
    if ceiling is not None:
        out.append(
            f"\n{name} pipeline alone (no sockets, this process): {ceiling:,.0f} INA "
            f"rounds/s = {ceiling * VECTOR_BYTES / 2**20:.2f} MiB/s per rank at most"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    ap.add_argument(
        "--budget",
        type=float,
        default=300.0,
        help="seconds a method may take at one size (extrapolated), else skipped",
    )
    ap.add_argument("--no-bmv2", action="store_true", help="the softswitch only")
    a = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the namespaces, veths and switch go in the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        print(f"--sizes: not a list of byte counts: {a.sizes[:80]!r}", file=sys.stderr)
        return 2
    if not sizes or any(s < VECTOR_BYTES or s % 4 or s > 1 << 28 for s in sizes) or a.budget <= 0:
        print("--sizes: each a multiple of 4 in [128, 256 MiB]; --budget > 0", file=sys.stderr)
        return 2
    if why := netns_unavailable():
        print(f"collnet_goodput: {why}", file=sys.stderr)
        return 2
    if not (LIB.exists() and HARNESS.exists()):
        print(
            f"collnet_goodput: {LIB.name} / collnet_harness not built in {BUILD}", file=sys.stderr
        )
        return 2
    from support.bmv2 import bmv2_missing, compile_v1model

    bmv2_why = "--no-bmv2" if a.no_bmv2 else bmv2_missing()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; "
        f"{N} ranks, window {WINDOW}, int32 lanes ({VECTOR_BYTES} B per packet)",
        flush=True,
    )
    ceiling = pipeline_ceiling()
    print(f"softswitch pipeline alone: {ceiling:,.0f} rounds/s", flush=True)
    tables, session = [], random.randrange(1 << 20)
    bed = NetnsBed()
    with tempfile.TemporaryDirectory(prefix="collnet-goodput-") as t:
        tmp = Path(t)
        try:
            bed.up()
            prepare_hosts(bed)
            sw = start_softswitch(bed)
            try:
                rows, session = measure(sw, bed, tmp, sizes, a.budget, session)
            finally:
                sw.stop()
            tables.append(table("softswitch", rows, ceiling))
            if bmv2_why:
                print(f"BMv2: skipped ({bmv2_why})", flush=True)
            else:
                bmv2_json, _ = compile_v1model(tmp)
                sw = start_bmv2(bed, bmv2_json)
                try:
                    rows, session = measure(sw, bed, tmp, sizes, a.budget, session)
                finally:
                    sw.stop()
                    subprocess.run(["ip", "netns", "del", sw.ns or ""], capture_output=True)
                tables.append(table("bmv2", rows, None))
        finally:
            bed.down()
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end\n")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
