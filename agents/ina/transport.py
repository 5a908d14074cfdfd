"""Windowed, reliable INA all-reduce over UDP: the host side of the slot protocol.

The contract is the one docs/dataplane.md states for hosts (SwitchML's discipline):

* a group owns ``window`` aggregator indices (its slot count on the switch); chunk ``c`` of
  the vector (``VECTOR_LEN`` int32 lanes) travels on index ``c % window``, so each index
  carries chunks ``k, k + window, k + 2 window, ...`` in order, each one round of that
  aggregator: rounds are numbered 0, 1, 2, ... per index for the life of the session, and
  a round travels as its version bit and generation (``InaHeader.at_round``);
* on one index a worker sends its next round only after it received the result of the
  previous one, so a retransmission (same round, same values) is either absorbed (round
  still open) or answered with the stored result (round complete), never added twice;
* a result is accepted only from the switch's address and port, of this group's session,
  for an index with a chunk outstanding and the round that chunk was sent as; anything
  else (a duplicate, a late answer to a retransmission, a packet of another group or of
  an earlier session, a datagram from another host) is dropped and counted.

A session (``InaGroup.session``, ``InaGroup.first_generation``) is one job start of the
group: every member gets the same two numbers from whoever starts the job (as NCCL's
unique id), the session newer than the last one (RFC 1982 order) and the first generation
random, so that an off-path host can guess neither (docs/dataplane.md, "Sessions").

Timeouts follow TCP (RFC 6298): the retransmission timeout is ``srtt + 4 rttvar`` from round
trips of chunks that were not retransmitted (Karn), at least ``min_rto_s``; every
retransmission of a chunk doubles that chunk's timeout (exponential backoff) up to
``max_rto_s``; a collective with no result for ``give_up_s`` fails with :class:`InaTimeout`.
How many chunks are outstanding is a congestion window (:class:`_Window`, TCP's AIMD) that
never exceeds the aggregators the group owns: the send window.
The round of every index persists across all-reduces of one session, which is why one worker
process runs all of a host's collectives; a restarted member needs a new session (the
whole group with it).

Two lane formats (docs/dataplane.md, "Lane formats"): :meth:`InaSession.allreduce_lanes`
sums int32 lanes; :meth:`InaSession.allreduce_bfp16` sums reals as bfp16 blocks, each
block's exponent agreed by the switch in the previous round of its aggregator (a first
round per aggregator carries only the proposal for its first block).
"""

from __future__ import annotations

import heapq
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agents.ina.lanes import (
    LANE_DTYPE,
    LaneError,
    agreed_exponent,
    block_exponent,
    exponent_lanes,
    from_bfp16,
    to_bfp16,
)
from agents.ina.packet import (
    BFP16_LANES,
    EXP_BAD,
    EXP_BIAS,
    EXP_MIN,
    INA_UDP_PORT,
    MAX_AGGREGATOR_SLOTS,
    MAX_GROUP_ID,
    MAX_WORKERS,
    PAYLOAD_LEN,
    SESSIONS,
    VECTOR_LEN,
    InaDecodeError,
    InaHeader,
    InaMessage,
    pack,
    unpack,
)

_RECV_BUF = 2048
INITIAL_WINDOW = 10  # chunks, as TCP's initial window of 10 segments (RFC 6928)


class InaTimeout(RuntimeError):
    """No result for ``give_up_s``: the switch, a member or the path is gone."""


@dataclass(frozen=True)
class InaGroup:
    """One member's view of an INA group, as the switch agent installed it."""

    group_id: int  # INA header group id (the controller's numeric id)
    worker_id: int  # this member's index: its bit in the switch's bitmap
    num_workers: int
    window: int  # aggregator indices the group owns (slot count on the switch)
    switch_ip: str  # address the switch answers from (the workers send there)
    switch_port: int = INA_UDP_PORT
    session: int = 0  # the group's session: the same at every member, new at each job start
    first_generation: int = 0  # generation of every index's round 0 in this session

    def __post_init__(self) -> None:
        if not 0 < self.group_id <= MAX_GROUP_ID:
            raise ValueError(f"group id {self.group_id} outside 1..{MAX_GROUP_ID}")
        if not 1 <= self.num_workers <= MAX_WORKERS:
            raise ValueError(f"{self.num_workers} workers: the switch allows 1..{MAX_WORKERS}")
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"worker id {self.worker_id} of {self.num_workers}")
        if not 1 <= self.window < MAX_AGGREGATOR_SLOTS:  # one agg_index per in-flight chunk
            raise ValueError(f"window {self.window} outside 1..{MAX_AGGREGATOR_SLOTS - 1}")
        for name in ("session", "first_generation"):
            if not 0 <= getattr(self, name) < SESSIONS:
                raise ValueError(f"{name} {getattr(self, name)} is not a 32-bit number")


@dataclass(frozen=True)
class Timeouts:
    """Retransmission timing (seconds). ``initial_rto_s`` applies until a round trip was
    measured (RFC 6298 uses 1 s)."""

    initial_rto_s: float = 1.0
    min_rto_s: float = 0.02
    max_rto_s: float = 2.0
    give_up_s: float = 30.0

    def __post_init__(self) -> None:
        values = (self.initial_rto_s, self.min_rto_s, self.max_rto_s, self.give_up_s)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"timeouts must be positive seconds, got {values}")
        if self.min_rto_s > self.max_rto_s:
            raise ValueError("min_rto_s exceeds max_rto_s")


@dataclass
class InaStats:
    """Counters of one session (cumulative over its all-reduces)."""

    sent: int = 0  # contributions sent, first transmissions
    retransmissions: int = 0  # contributions sent again after a timeout
    results: int = 0  # results accepted
    stale: int = 0  # results for an index with nothing outstanding or of another round
    foreign: int = 0  # not a result of this group and session, or not from the switch
    malformed: int = 0  # shorter than an INA header + vector
    srtt_s: float = 0.0
    rto_s: float = 0.0
    cwnd: float = 0.0  # congestion window at the end of the last all-reduce

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def contribution_header(
    group: InaGroup, index: int, rnd: int, retx: bool, lanes: str = "int32", exp: int = 0
) -> InaHeader:
    """This member's header for round ``rnd`` of aggregator ``index`` in its session."""
    return InaHeader.at_round(
        group.group_id,
        index,
        group.worker_id,
        group.num_workers,
        rnd,
        is_retx=retx,
        session=group.session,
        first_generation=group.first_generation,
        lanes=lanes,
        exp=exp,
    )


# make(row) -> (lane format, exp byte, lanes) of a row's contribution; take(row, result).
_Make = Callable[[int], tuple[str, int, list[int]]]
_Take = Callable[[int, InaMessage], None]


@dataclass
class _Slot:
    round: int = 0  # round of the next (or outstanding) contribution on this index
    chunk: int = -1  # row outstanding (-1: idle)
    lanes: str = "int32"
    exp: int = 0
    values: list[int] = field(default_factory=list)  # what a retransmission resends
    payload: bytes = b""
    sent_at: float = 0.0
    rto: float = 0.0
    retries: int = 0
    token: int = 0  # identifies the timer entry that is current


@dataclass
class _Rtt:
    """RFC 6298 estimator."""

    timeouts: Timeouts
    srtt: float = 0.0
    rttvar: float = 0.0
    have: bool = False

    def sample(self, r: float) -> None:
        if not self.have:
            self.srtt, self.rttvar, self.have = r, r / 2, True
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r

    @property
    def rto(self) -> float:
        if not self.have:
            return self.timeouts.initial_rto_s
        t = self.timeouts
        return min(t.max_rto_s, max(t.min_rto_s, self.srtt + 4 * self.rttvar))


@dataclass
class _Window:
    """How many chunks may be outstanding (TCP's congestion control, RFC 5681, counted in
    chunks): slow start from ``INITIAL_WINDOW``, then one more per window of results; halved
    on a timeout of a chunk sent after the last decrease (one decrease per loss episode).
    Never more than the aggregators the group owns. Without it a member would put its whole
    window in flight at once, the switch's queue would outgrow the timeout measured on the
    first chunks, and spurious retransmissions would load the switch further."""

    limit: int
    cwnd: float = 0.0
    ssthresh: float = 0.0
    last_decrease: float = -1.0

    def __post_init__(self) -> None:
        self.cwnd = float(min(self.limit, INITIAL_WINDOW))
        self.ssthresh = float(self.limit)

    def allowed(self) -> int:
        return max(1, int(self.cwnd))

    def on_result(self) -> None:
        grow = 1.0 if self.cwnd < self.ssthresh else 1.0 / self.cwnd
        self.cwnd = min(float(self.limit), self.cwnd + grow)

    def on_timeout(self, sent_at: float, in_flight: int, now: float) -> None:
        if sent_at <= self.last_decrease:
            return  # already reacted to this episode
        self.ssthresh = max(2.0, in_flight / 2)
        self.cwnd = self.ssthresh
        self.last_decrease = now


@dataclass
class InaSession:
    """All-reduces of one member of one INA group over a UDP socket.

    ``sock`` is bound to the address results arrive at (the switch rewrites results to the
    member's NIC address and UDP port ``INA_UDP_PORT``); the session owns it."""

    group: InaGroup
    sock: socket.socket
    timeouts: Timeouts = field(default_factory=Timeouts)
    stats: InaStats = field(default_factory=InaStats)

    def __post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(self.group.window)]
        self._rtt = _Rtt(self.timeouts)
        self._cc = _Window(self.group.window)
        self._dest = (self.group.switch_ip, self.group.switch_port)
        self._buf = bytearray(_RECV_BUF)
        self._broken = ""

    @classmethod
    def open(
        cls, group: InaGroup, bind_ip: str = "0.0.0.0", bind_port: int = INA_UDP_PORT, **kw
    ) -> InaSession:
        """A session with its own UDP socket bound to ``bind_ip:bind_port``."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.bind((bind_ip, bind_port))
        except OSError:
            sock.close()
            raise
        return cls(group, sock, **kw)

    def close(self) -> None:
        self.sock.close()

    # -- public --------------------------------------------------------------------------
    def allreduce_lanes(self, lanes: np.ndarray) -> np.ndarray:
        """Sum of every member's int32 ``lanes`` (same length everywhere), wrapping as the
        switch does. Blocks until every chunk's result arrived."""
        x = np.ascontiguousarray(lanes, dtype=LANE_DTYPE)
        n = x.size
        chunks = -(-n // VECTOR_LEN)
        padded = np.zeros(chunks * VECTOR_LEN, dtype=LANE_DTYPE)
        padded[:n] = x
        out = np.zeros_like(padded)
        data, rows = padded.reshape(chunks, VECTOR_LEN), out.reshape(chunks, VECTOR_LEN)
        window = self.group.window

        def take(row: int, msg: InaMessage) -> None:
            rows[row] = msg.values

        self._guarded(chunks, lambda r: r % window, lambda r: ("int32", 0, data[r].tolist()), take)
        return out[:n]

    def allreduce_bfp16(self, x: np.ndarray) -> np.ndarray:
        """Sum of every member's reals ``x`` (same length everywhere) through bfp16 lanes,
        as float64. The first min(window, blocks) rows agree each aggregator's first block
        exponent; block ``c`` then travels on aggregator ``c % window`` at the exponent the
        previous round there agreed, proposing the exponent of block ``c + window``.
        LaneError after the run (the session stays usable) when a member's block cannot
        travel or the switch flagged a saturated lane; the error bound per element is
        ``lanes.bfp16_error_bound``."""
        flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
        n, window, w = flat.size, self.group.window, self.group.num_workers
        blocks = -(-n // BFP16_LANES)
        firsts = min(window, blocks)
        padded = np.zeros(blocks * BFP16_LANES)
        padded[:n] = flat
        data = padded.reshape(blocks, BFP16_LANES)
        proposals = [block_exponent(b) for b in data] + [EXP_BIAS + EXP_MIN] * window
        agreed = [0] * window  # the exp byte each aggregator's last result agreed
        out = np.zeros_like(data)
        problems: list[str] = []

        def make(row: int) -> tuple[str, int, list[int]]:
            if row < firsts:  # the aggregator's proposal round: no lanes
                return "bfp16", proposals[row], [0] * BFP16_LANES
            c = row - firsts
            try:
                q = to_bfp16(data[c], w, agreed[c % window]).tolist()
            except LaneError as exc:  # zeros keep the group's rounds in step
                problems.append(f"block {c}: {exc}")
                q = [0] * BFP16_LANES
            return "bfp16", proposals[c + window], q

        def take(row: int, msg: InaMessage) -> None:
            h = msg.header
            k = row if row < firsts else (row - firsts) % window
            if h.lanes != "bfp16":
                problems.append(f"row {row}: result in {h.lanes} lanes")
            elif row >= firsts and h.overflow:
                problems.append(f"block {row - firsts}: the switch saturated a lane")
            elif row >= firsts and agreed[k] != EXP_BAD:
                out[row - firsts] = from_bfp16(np.asarray(msg.values), w, agreed[k])
            agreed[k] = h.exp

        def slot_of(row: int) -> int:
            return row if row < firsts else (row - firsts) % window

        self._guarded(firsts + blocks, slot_of, make, take)
        if problems:
            raise LaneError(f"bfp16 all-reduce refused: {problems[0]} ({len(problems)} in all)")
        return out.reshape(-1)[:n]

    def _guarded(self, rows: int, slot_of: Callable[[int], int], make: _Make, take: _Take) -> None:
        if self._broken:
            raise InaTimeout(f"session unusable after an earlier failure: {self._broken}")
        if rows:
            try:
                self._run(rows, slot_of, make, take)
            except BaseException as exc:  # a half-done collective leaves versions undefined
                self._broken = f"{type(exc).__name__}: {exc}"
                raise

    def agree_exponent(self, exponent: int | None) -> int:
        """The group's largest data exponent (lanes.py): one aggregation of one-hot lanes."""
        return agreed_exponent(self.allreduce_lanes(exponent_lanes(exponent)))

    # -- protocol ------------------------------------------------------------------------
    def _payload(self, slot: _Slot, index: int, retx: bool) -> bytes:
        h = contribution_header(self.group, index, slot.round, retx, slot.lanes, slot.exp)
        return pack(h, slot.values)

    def _send(self, index: int, slot: _Slot, timers: list, now: float) -> None:
        self.sock.sendto(slot.payload, self._dest)
        slot.token += 1
        heapq.heappush(timers, (now + slot.rto, index, slot.token))

    def _run(self, chunks: int, slot_of: Callable[[int], int], make: _Make, take: _Take) -> None:
        slots = self._slots
        timers: list[tuple[float, int, int]] = []
        cc = self._cc
        nxt = 0  # next chunk to send
        in_flight = 0
        remaining = chunks
        now = last_progress = time.monotonic()
        sock, buf = self.sock, self._buf
        while remaining:
            # Send while the congestion window allows and the chunk's aggregator is free.
            while nxt < chunks and in_flight < cc.allowed() and slots[slot_of(nxt)].chunk < 0:
                self._start(slot_of(nxt), nxt, make, timers, now)
                nxt += 1
                in_flight += 1
            wait = max(0.0, timers[0][0] - now) if timers else self.timeouts.give_up_s
            sock.settimeout(min(wait, self.timeouts.give_up_s))
            try:
                nbytes, sender = sock.recvfrom_into(buf)
            except (TimeoutError, BlockingIOError):  # settimeout(0) is non-blocking
                nbytes, sender = -1, None
            now = time.monotonic()
            if sender is not None and sender[:2] != self._dest:  # not the switch
                self.stats.foreign += 1
            elif nbytes >= 0 and self._accept(buf, nbytes, now, take) is not None:
                remaining -= 1
                in_flight -= 1
                last_progress = now
                cc.on_result()
            if now - last_progress > self.timeouts.give_up_s:
                raise InaTimeout(
                    f"group {self.group.group_id}: no result for {self.timeouts.give_up_s:g}s "
                    f"({remaining} of {chunks} chunks missing)"
                )
            while timers and timers[0][0] <= now:
                _, k, token = heapq.heappop(timers)
                s = slots[k]
                if s.chunk < 0 or token != s.token:
                    continue  # answered, or superseded by a later (re)transmission
                cc.on_timeout(s.sent_at, in_flight, now)
                s.retries += 1
                s.rto = min(self.timeouts.max_rto_s, s.rto * 2)
                s.payload = self._payload(s, k, retx=True)
                self.stats.retransmissions += 1
                self._send(k, s, timers, now)
        self.stats.srtt_s = self._rtt.srtt
        self.stats.rto_s = self._rtt.rto
        self.stats.cwnd = cc.cwnd

    def _start(self, k: int, chunk: int, make: _Make, timers: list, now: float) -> None:
        s = self._slots[k]
        s.chunk, s.retries, s.sent_at, s.rto = chunk, 0, now, self._rtt.rto
        s.lanes, s.exp, s.values = make(chunk)
        s.payload = self._payload(s, k, retx=False)
        self.stats.sent += 1
        self._send(k, s, timers, now)

    def _accept(
        self, buf: bytearray, nbytes: int, now: float, take: _Take
    ) -> tuple[int, int] | None:
        """Take one datagram; (index, chunk) when it completed a chunk."""
        if nbytes < PAYLOAD_LEN:
            self.stats.malformed += 1
            return None
        try:
            msg = unpack(memoryview(buf)[:nbytes])
        except InaDecodeError:
            self.stats.malformed += 1
            return None
        h = msg.header
        g = self.group
        if (
            not h.is_result
            or h.group_id != g.group_id
            or h.session != g.session
            or h.agg_index >= len(self._slots)
        ):
            self.stats.foreign += 1
            return None
        s = self._slots[h.agg_index]
        want = contribution_header(g, h.agg_index, s.round, False)
        if s.chunk < 0 or (h.generation, h.version) != (want.generation, want.version):
            self.stats.stale += 1
            return None
        take(s.chunk, msg)
        if s.retries == 0:
            self._rtt.sample(now - s.sent_at)
        self.stats.results += 1
        chunk, s.chunk = s.chunk, -1
        s.round += 1
        return h.agg_index, chunk
