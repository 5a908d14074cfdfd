"""Ring all-reduce between hosts over TCP, the baseline INA is compared with (NCCL's ring).

``P`` ranks in ring order; rank ``i`` sends to ``i + 1`` and receives from ``i - 1`` on two
TCP connections. The vector is cut into ``P`` chunks (chunk ``j`` is elements
``[j n / P, (j + 1) n / P)``). Reduce-scatter: in step ``s`` (0 .. P-2) rank ``i`` sends
chunk ``(i - s - 1) mod P`` and adds the chunk ``(i - s - 2) mod P`` it receives, so that
after ``P - 1`` steps rank ``i`` holds the sum of chunk ``i``. All-gather: in step ``s``
rank ``i`` sends chunk ``(i - s) mod P`` and stores chunk ``(i - s - 1) mod P``. That is
NCCL's 2 (P - 1) steps of D / P bytes (Eq. 11); the hierarchical scheme uses the two halves
on their own inside a server.

Connections are matched by a hello (magic, collective token, sender rank), so one listening
socket per host serves every ring it is part of; a connection with a wrong hello is closed
and counted. TCP gives reliability; its retransmissions are read from ``TCP_INFO``.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

import numpy as np

from agents.ina.lanes import agreed_exponent, exponent_lanes

RING_PORT = 48880
_HELLO = struct.Struct("!4sQI")
_MAGIC = b"HSRG"
_TCP_INFO_LEN = 104
_TOTAL_RETRANS_OFFSET = 100  # struct tcp_info: tcpi_total_retrans (u32)


class RingError(RuntimeError):
    """A ring collective that cannot complete (peer gone, timeout, bad hello)."""


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous chunks of ``n`` elements, sizes differing by at most one."""
    return [(j * n // parts, (j + 1) * n // parts) for j in range(parts)]


def tcp_retransmissions(sock: socket.socket) -> int:
    """Segments this TCP socket retransmitted so far (Linux ``tcpi_total_retrans``)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return 0
    if len(info) < _TOTAL_RETRANS_OFFSET + 4:
        return 0
    return struct.unpack_from("I", info, _TOTAL_RETRANS_OFFSET)[0]


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class PeerListener:
    """A host's listening socket for ring connections; hands each to the ring it names."""

    sock: socket.socket
    pending: dict[tuple[int, int], socket.socket] = field(default_factory=dict)
    rejected: int = 0

    @classmethod
    def open(cls, ip: str = "0.0.0.0", port: int = RING_PORT) -> PeerListener:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ip, port))
            s.listen(64)
        except OSError:
            s.close()
            raise
        return cls(s)

    def accept_from(self, token: int, rank: int, timeout_s: float) -> socket.socket:
        """The connection rank ``rank`` opened for collective ``token``."""
        deadline = time.monotonic() + timeout_s
        while (token, rank) not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RingError(f"rank {rank} did not connect for collective {token}")
            self.sock.settimeout(left)
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                hello = _recv_exact(conn, _HELLO.size)
                magic, tok, peer = _HELLO.unpack(hello)
            except (OSError, RingError):
                conn.close()
                self.rejected += 1
                continue
            if magic != _MAGIC:
                conn.close()
                self.rejected += 1
                continue
            old = self.pending.pop((tok, peer), None)
            if old is not None:
                old.close()
            self.pending[(tok, peer)] = conn
        conn = self.pending.pop((token, rank))
        conn.settimeout(None)
        return conn

    def close(self) -> None:
        for c in self.pending.values():
            c.close()
        self.pending.clear()
        self.sock.close()


def connect_to(ip: str, port: int, token: int, rank: int, timeout_s: float) -> socket.socket:
    """Open the connection to the next rank and introduce ourselves."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        _tune(s)
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            s.connect((ip, port))
            s.sendall(_HELLO.pack(_MAGIC, token, rank))
            s.settimeout(None)
            return s
        except OSError as exc:
            s.close()
            if time.monotonic() + delay > deadline:
                raise RingError(f"cannot connect to {ip}:{port}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise RingError("peer closed the connection")
        got += k
    return bytes(buf)


@dataclass
class Channel:
    """One ring (NCCL channel): this rank's position and its two connections."""

    rank: int
    size: int
    send_to: socket.socket | None  # to the next rank
    recv_from: socket.socket | None  # from the previous rank


@dataclass
class Ring:
    """One rank's rings. NCCL runs several channels, each a ring over all ranks in its own
    order, so that the traffic between servers spreads over several NICs; the vector is cut
    into one contiguous part per channel and the channels step together. ``size == 1`` needs
    no connections."""

    channels: list[Channel]
    timeout_s: float = 60.0

    @classmethod
    def connect(
        cls,
        listener: PeerListener,
        token: int,
        positions: list[tuple[int, int, str]],
        port: int = RING_PORT,
        timeout_s: float = 60.0,
    ) -> Ring:
        """Connect channel ``c`` of collective ``token`` for ``positions[c]`` = (rank, size,
        next rank's address: ``IP`` or ``IP:PORT``, the port defaulting to ``port``).
        Every channel's ``token * 64 + c`` names its connections."""
        if not positions or len(positions) > 64:
            raise RingError(f"{len(positions)} channels: 1..64 allowed")
        chans: list[Channel] = []
        try:
            for c, (rank, size, next_ip) in enumerate(positions):
                if size == 1:
                    chans.append(Channel(rank, size, None, None))
                    continue
                tok = token * 64 + c
                ip, _, p = next_ip.partition(":")
                out = connect_to(ip, int(p) if p else port, tok, rank, timeout_s)
                chans.append(Channel(rank, size, out, None))
                chans[-1].recv_from = listener.accept_from(tok, (rank - 1) % size, timeout_s)
        except BaseException:
            for ch in chans:
                for sock in (ch.send_to, ch.recv_from):
                    if sock is not None:
                        sock.close()
            raise
        return cls(chans, timeout_s)

    @property
    def size(self) -> int:
        return self.channels[0].size

    @property
    def rank(self) -> int:
        return self.channels[0].rank

    def close(self) -> None:
        for ch in self.channels:
            for s in (ch.send_to, ch.recv_from):
                if s is not None:
                    s.close()

    def retransmissions(self) -> int:
        return sum(tcp_retransmissions(ch.send_to) for ch in self.channels if ch.send_to)

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """Sum over the ranks of ``x`` (same shape and dtype everywhere)."""
        acc = np.array(x, copy=True).ravel()
        if self.size > 1:
            parts = [acc[a:b] for a, b in chunk_bounds(acc.size, len(self.channels))]
            bounds = [chunk_bounds(p.size, self.size) for p in parts]
            self._reduce_scatter(parts, bounds)
            self._all_gather(parts, bounds)
        return acc.reshape(np.shape(x))

    def allreduce_lanes(self, lanes: np.ndarray) -> np.ndarray:
        """Same interface as InaSession: the sum of every rank's int32 lanes."""
        return self.allreduce(lanes)

    def agree_exponent(self, exponent: int | None) -> int:
        """The ranks' largest lane exponent (agents/ina/lanes.py), summed one-hot lanes."""
        return agreed_exponent(self.allreduce(exponent_lanes(exponent)))

    def reduce_scatter(self, x: np.ndarray) -> np.ndarray:
        """This rank's chunk (index ``rank``) of the sum (one channel)."""
        self._one_channel()
        acc = np.array(x, copy=True).ravel()
        bounds = chunk_bounds(acc.size, self.size)
        if self.size > 1:
            self._reduce_scatter([acc], [bounds])
        lo, hi = bounds[self.rank]
        return acc[lo:hi].copy()

    def all_gather(self, mine: np.ndarray, n: int) -> np.ndarray:
        """The whole vector of ``n`` elements from every rank's chunk (``mine`` is chunk
        ``rank`` of ``chunk_bounds(n, size)``; one channel)."""
        self._one_channel()
        bounds = chunk_bounds(n, self.size)
        lo, hi = bounds[self.rank]
        if mine.size != hi - lo:
            raise ValueError(f"rank {self.rank} holds {mine.size} elements, chunk needs {hi - lo}")
        acc = np.zeros(n, dtype=mine.dtype)
        acc[lo:hi] = mine
        if self.size > 1:
            self._all_gather([acc], [bounds])
        return acc

    def _one_channel(self) -> None:
        if len(self.channels) != 1:
            raise RingError("reduce-scatter and all-gather run on one channel")

    def _reduce_scatter(self, parts: list[np.ndarray], bounds: list[list[tuple[int, int]]]) -> None:
        p = self.size
        longest = max((b - a for bs in bounds for a, b in bs), default=0)
        scratch = [np.empty(longest, dtype=parts[0].dtype) for _ in parts]
        for s in range(p - 1):
            moves = []
            for ch, part, bs, tmp in zip(self.channels, parts, bounds, scratch, strict=True):
                slo, shi = bs[(ch.rank - s - 1) % p]
                rlo, rhi = bs[(ch.rank - s - 2) % p]
                moves.append((ch, part[slo:shi], tmp[: rhi - rlo]))
            self._exchange(moves)
            for ch, part, bs, tmp in zip(self.channels, parts, bounds, scratch, strict=True):
                rlo, rhi = bs[(ch.rank - s - 2) % p]
                np.add(part[rlo:rhi], tmp[: rhi - rlo], out=part[rlo:rhi])

    def _all_gather(self, parts: list[np.ndarray], bounds: list[list[tuple[int, int]]]) -> None:
        p = self.size
        for s in range(p - 1):
            moves = []
            for ch, part, bs in zip(self.channels, parts, bounds, strict=True):
                slo, shi = bs[(ch.rank - s) % p]
                rlo, rhi = bs[(ch.rank - s - 1) % p]
                moves.append((ch, part[slo:shi], part[rlo:rhi]))
            self._exchange(moves)

    def _exchange(self, moves: list[tuple[Channel, np.ndarray, np.ndarray]]) -> None:
        """For every channel at once: send its ``out`` to the next rank while receiving its
        ``into`` (a contiguous view, written in place) from the previous one."""
        sel = selectors.DefaultSelector()
        state: dict[socket.socket, list] = {}
        socks: list[socket.socket] = []
        for ch, out, into in moves:
            assert ch.send_to is not None and ch.recv_from is not None
            tx = memoryview(np.ascontiguousarray(out)).cast("B")
            rx = memoryview(into).cast("B")
            for sock, view, ev in (
                (ch.send_to, tx, selectors.EVENT_WRITE),
                (ch.recv_from, rx, selectors.EVENT_READ),
            ):
                sock.setblocking(False)
                socks.append(sock)
                if len(view):
                    state[sock] = [view, 0]
                    sel.register(sock, ev)
        deadline = time.monotonic() + self.timeout_s
        try:
            while state:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RingError(f"rank {self.rank}: ring step timed out")
                for key, ev in sel.select(timeout=left):
                    sock = key.fileobj
                    view, done = state[sock]  # type: ignore[index]
                    try:
                        if ev & selectors.EVENT_WRITE:
                            k = sock.send(view[done:])  # type: ignore[union-attr]
                        else:
                            k = sock.recv_into(view[done:])  # type: ignore[union-attr]
                            if k == 0:
                                raise RingError(f"rank {self.rank}: a ring peer closed")
                    except BlockingIOError:
                        continue
                    done += k
                    if done == len(view):
                        sel.unregister(sock)
                        del state[sock]  # type: ignore[arg-type]
                    else:
                        state[sock][1] = done  # type: ignore[index]
        finally:
            sel.close()
            for sock in socks:
                sock.setblocking(True)
