"""Real-packet I/O for the model: one AF_PACKET raw socket per switch port, read by a
single selector thread that runs each frame through the pipeline and sends the results.

Linux only; needs CAP_NET_RAW (root). Interfaces are put in promiscuous mode so frames
for any destination MAC reach the switch, and frames the switch itself sent (seen again
as PACKET_OUTGOING) are ignored.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
from collections.abc import Callable

log = logging.getLogger("heroserve.softswitch")

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
MAX_FRAME = 65535


def parse_interface_specs(specs: list[str]) -> dict[int, str]:
    """``["veth0", "7@veth1"]`` -> {1: "veth0", 7: "veth1"}.

    ``PORT@NAME`` picks the port number (as BMv2's ``-i``); a bare NAME takes the next
    free number from 1 (port 0 stays unused: v1model's default egress_spec is 0, so a
    frame the program forgot to route is not sent anywhere).
    """
    ports: dict[int, str] = {}
    names: set[str] = set()
    explicit: list[tuple[int, str]] = []
    bare: list[str] = []
    for spec in specs:
        if "@" in spec:
            num, _, name = spec.partition("@")
            if not num.isdigit() or not 0 <= int(num) < 511:
                raise ValueError(f"bad port number in interface spec {spec!r} (0..510)")
            explicit.append((int(num), name))
        else:
            bare.append(spec)
    for num, name in explicit:
        if num in ports:
            raise ValueError(f"port {num} given twice")
        ports[num] = name
    nxt = 1
    for name in bare:
        while nxt in ports:
            nxt += 1
        ports[nxt] = name
    for name in ports.values():
        if not name or len(name) > 15 or "/" in name:
            raise ValueError(f"bad interface name {name!r}")
        if name in names:
            raise ValueError(f"interface {name} given twice")
        names.add(name)
    return ports


class PortIO:
    """Owns the raw sockets of the switch ports and the forwarding thread."""

    def __init__(
        self,
        ports: dict[int, str],
        process: Callable[[int, bytes], list[tuple[int, bytes]]],
    ) -> None:
        self.ports = ports
        self.process = process
        self.sockets: dict[int, socket.socket] = {}
        self.selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rx_frames = 0
        self.tx_frames = 0
        self.tx_errors = 0
        self.process_errors = 0

    def open(self) -> None:
        """Open and bind every port's socket (OSError naming the interface on failure)."""
        for port, name in self.ports.items():
            try:
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.bind((name, 0))
                ifindex = socket.if_nametoindex(name)
                mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
                s.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
                s.setblocking(False)
            except OSError as e:
                self.close()
                raise OSError(f"cannot open interface {name} (port {port}): {e}") from e
            self.sockets[port] = s
            self.selector.register(s, selectors.EVENT_READ, port)

    def start(self) -> None:
        """Start the forwarding thread."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="softswitch-io")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                port = key.data
                sock = key.fileobj
                while True:
                    try:
                        frame, addr = sock.recvfrom(MAX_FRAME)  # type: ignore[union-attr]
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as e:
                        log.warning("port %d receive error: %s", port, e)
                        break
                    if addr[2] == PACKET_OUTGOING:
                        continue
                    self.rx_frames += 1
                    try:
                        outs = self.process(port, frame)
                    except Exception:  # a model bug must not stop the switch: count, log
                        self.process_errors += 1
                        log.exception("port %d: frame of %d bytes not processed", port, len(frame))
                        continue
                    for out_port, out in outs:
                        self._send(out_port, out)

    def _send(self, port: int, frame: bytes) -> None:
        sock = self.sockets.get(port)
        if sock is None:
            return  # no interface on that port: the frame leaves nowhere
        try:
            sock.send(frame)
            self.tx_frames += 1
        except OSError as e:
            self.tx_errors += 1
            log.debug("port %d send error: %s", port, e)

    def close(self) -> None:
        """Stop the thread and close the sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        for s in self.sockets.values():
            try:
                self.selector.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self.sockets.clear()
