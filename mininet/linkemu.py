"""User-space link emulator: loss, duplication and reordering on the hosts' NIC links.

    python mininet/linkemu.py --pair IF_A,IF_B [--pair ...] [--loss P] [--duplicate P]
        [--reorder P] [--delay S] [--seed N]

The kernels this project runs on may have no ``sch_netem`` (no qdisc can drop, duplicate or
delay), so the emulation puts this process between a host's NIC and its switch port: every
frame arriving on one interface of a pair leaves on the other, impaired as netem would
(agents/ina/impairments.py), with a seeded generator so a run can be repeated. Prints
``READY`` once its raw sockets are open; stops on SIGTERM or SIGINT and prints its counters
as one JSON line. Needs root (AF_PACKET).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.ina.impairments import Impairments  # noqa: E402

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
MAX_FRAME = 65535


def open_port(name: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((name, 0))
    s.setblocking(False)
    return s


def run(pairs: list[tuple[str, str]], impair: Impairments, delay_s: float, seed: int) -> dict:
    rng = random.Random(seed)
    socks: dict[str, socket.socket] = {}
    peer: dict[str, str] = {}
    for a, b in pairs:
        for name in (a, b):
            if name in socks:
                raise ValueError(f"interface {name} given twice")
            socks[name] = open_port(name)
        peer[a], peer[b] = b, a
    sel = selectors.DefaultSelector()
    for name, s in socks.items():
        sel.register(s, selectors.EVENT_READ, name)
    stats = {"frames": 0, "lost": 0, "duplicated": 0, "sent": 0, "send_errors": 0}
    queue: list[tuple[float, int, str, bytes]] = []
    seq = 0
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print("READY", flush=True)
    while not stop:
        now = time.monotonic()
        wait = min(0.2, max(0.0, queue[0][0] - now)) if queue else 0.2
        for key, _ in sel.select(timeout=wait):
            name = key.data
            sock = socks[name]
            while True:
                try:
                    frame, addr = sock.recvfrom(MAX_FRAME)
                except (BlockingIOError, InterruptedError):
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                stats["frames"] += 1
                delays = impair.fate(rng, delay_s)
                stats["lost"] += not delays
                stats["duplicated"] += len(delays) > 1
                t = time.monotonic()
                for d in delays:
                    seq += 1
                    heapq.heappush(queue, (t + d, seq, peer[name], frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                socks[out].send(frame)
                stats["sent"] += 1
            except OSError:
                stats["send_errors"] += 1
    for s in socks.values():
        s.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="linkemu", description=__doc__.split("\n")[0])
    p.add_argument("--pair", action="append", required=True, help="IF_A,IF_B")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--duplicate", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds every frame waits")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        pairs = []
        for spec in a.pair:
            x, sep, y = spec.partition(",")
            if not sep or not x or not y:
                raise ValueError(f"--pair {spec!r}: expected IF_A,IF_B")
            pairs.append((x, y))
        if not (a.delay >= 0 and a.delay < 10):
            raise ValueError(f"--delay {a.delay}: expected seconds in [0, 10)")
        impair = Impairments(a.loss, a.duplicate, a.reorder)
        stats = run(pairs, impair, a.delay, a.seed)
    except (OSError, ValueError) as exc:
        print(f"linkemu: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
