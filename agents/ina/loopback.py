"""A switch on loopback for tests and benchmarks of the host library, without root.

:class:`LoopbackSwitch` owns one UDP socket on 127.0.0.1. Each member's datagrams are
wrapped in the Ethernet/IPv4/UDP frame the member would have sent (ingress port = the port
the member was registered on) and run through the executable switch's pipeline
(agents/softswitch/pipeline.py, the model of p4/heroserve_ina.p4); every frame the pipeline
emits goes back, as its UDP payload, to the member registered on its egress port. Every
datagram waits ``delay_s`` in each direction; both directions can lose, duplicate and
reorder datagrams as netem does (agents/ina/impairments.py), drawn from a seeded generator
so that a test sees the same impairments on every run.
"""

from __future__ import annotations

import heapq
import random
import selectors
import socket
import threading
import time
from dataclasses import dataclass

from agents.ina.impairments import Impairments
from agents.ina.packet import (
    INA_UDP_PORT,
    PAYLOAD_LEN,
    InaDecodeError,
    build_frame,
    unpack,
)
from agents.softswitch.pipeline import InaPipeline

_L2_L3_L4 = 14 + 20 + 8  # Ethernet + IPv4 without options + UDP
SWITCH_MAC, SWITCH_IP = "02:00:00:00:00:fe", "10.99.0.254"


@dataclass
class LoopbackStats:
    frames_in: int = 0
    frames_out: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    unknown_sender: int = 0
    malformed: int = 0


class LoopbackSwitch:
    """The pipeline behind a UDP socket; ``add_group`` then ``register`` each member."""

    def __init__(
        self, impair: Impairments | None = None, delay_s: float = 0.0, seed: int = 0
    ) -> None:
        self.pipeline = InaPipeline()
        self.impair = impair or Impairments()
        self.delay_s = delay_s
        self.rng = random.Random(seed)
        self.stats = LoopbackStats()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self._port_of: dict[tuple[str, int], int] = {}
        self._addr_of: dict[int, tuple[str, int]] = {}
        self._events: list[tuple[float, int, str, int, bytes]] = []
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- configuration -------------------------------------------------------------------
    def add_group(self, group_id: int, window: int, ports: list[int]) -> None:
        """Aggregation entries for indices 0..window-1 (slots from 0 upwards, shared by no
        other group), worker ``i`` bound to ``ports[i]`` and a multicast group (id = group
        id) to every port."""
        base = sum(1 for _ in self.pipeline.ingress.aggregation_table.entries)
        for i in range(window):
            self.pipeline.add_group(group_id, i, base + i, len(ports), group_id)
        bind = getattr(self.pipeline, "bind_worker", None)  # programs that check ports
        for w, port in enumerate(ports):
            if bind is not None:
                bind(group_id, w, port)
        self.pipeline.pre.insert(group_id, [(p, 0) for p in ports])

    def register(self, port: int, addr: tuple[str, int]) -> None:
        """Datagrams from ``addr`` enter on ``port``; frames out of ``port`` go to ``addr``."""
        self._port_of[addr] = port
        self._addr_of[port] = addr

    # -- running -------------------------------------------------------------------------
    def __enter__(self) -> LoopbackSwitch:
        self._thread = threading.Thread(target=self._run, daemon=True, name="loopback-switch")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close()

    def _schedule(self, kind: str, port: int, payload: bytes, now: float) -> None:
        delays = self.impair.fate(self.rng, self.delay_s)
        if not delays:
            self.stats.lost += 1
        self.stats.duplicated += len(delays) > 1
        for d in delays:
            self.stats.reordered += bool(self.impair.reorder) and d == 0.0
            self._seq += 1
            heapq.heappush(self._events, (now + d, self._seq, kind, port, payload))

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                wait = 0.05
                if self._events:
                    wait = min(wait, max(0.0, self._events[0][0] - now))
                if sel.select(timeout=wait):
                    self._drain(time.monotonic())
                now = time.monotonic()
                while self._events and self._events[0][0] <= now:
                    _, _, kind, port, payload = heapq.heappop(self._events)
                    if kind == "in":
                        self._switch(port, payload, now)
                    else:
                        addr = self._addr_of.get(port)
                        if addr is not None:
                            self.stats.frames_out += 1
                            self.sock.sendto(payload, addr)
        finally:
            sel.close()

    def _drain(self, now: float) -> None:
        while True:
            try:
                data, addr = self.sock.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                return
            port = self._port_of.get(addr)
            if port is None:
                self.stats.unknown_sender += 1
                continue
            self._schedule("in", port, data, now)

    def _switch(self, port: int, payload: bytes, now: float) -> None:
        if len(payload) < PAYLOAD_LEN:
            self.stats.malformed += 1
            return
        try:
            msg = unpack(payload)
        except InaDecodeError:
            self.stats.malformed += 1
            return
        src = self._addr_of[port]
        frame = build_frame(
            msg.header,
            msg.values,
            src_mac=f"02:00:00:00:01:{port:02x}",
            dst_mac=SWITCH_MAC,
            src_ip=src[0],
            dst_ip=SWITCH_IP,
            src_port=src[1] if src[1] else INA_UDP_PORT,
        )
        self.stats.frames_in += 1
        for out_port, out in self.pipeline.process(port, frame):
            self._schedule("out", out_port, bytes(out[_L2_L3_L4:]), now)


__all__ = ["SWITCH_IP", "Impairments", "LoopbackStats", "LoopbackSwitch"]
