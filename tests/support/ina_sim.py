"""Seeded simulation of INA workers that follow the host contract of docs/dataplane.md
("What the host must do"), over a network that loses, duplicates, reorders and delays
packets (some by several rounds), against a switch given as a function
``process(ingress_port, frame) -> [(egress_port, frame)]`` (the executable model; the
recorded switch inputs can then be replayed through BMv2).

The host contract, as a host library with a send window, timeouts and retransmission
implements it:
- chunk k of the vector goes to aggregator ``k % window`` as that aggregator's round
  ``k // window`` (``InaHeader.at_round``);
- a worker sends round q + 1 on an aggregator only after it holds the result of round q
  there;
- on a timeout it sends the same packet again (same round, same values), with backoff;
- it accepts a result only when (group, agg_index, round) is the one it waits for there,
  and ignores anything else.

Not a test module: tests/agents/softswitch/test_ina_protocol_property.py and the BMv2 tests use it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from agents.ina.packet import (
    INA_UDP_PORT,
    VECTOR_LEN,
    InaDecodeError,
    InaHeader,
    build_frame,
    unpack,
    wrap_int32,
)

Switch = Callable[[int, bytes], list[tuple[int, bytes]]]
INA_OFFSET = 14 + 20 + 8  # INA payload in an option-less IPv4/UDP frame
SWITCH_MAC, SWITCH_IP = "02:00:00:00:00:fe", "10.99.0.254"


def worker_port(w: int) -> int:
    """Switch port of worker w (worker 0 on port 1)."""
    return w + 1


def worker_mac(w: int) -> str:
    return f"02:00:00:00:01:{w + 1:02x}"


def worker_ip(w: int) -> str:
    return f"10.99.0.{w + 1}"


@dataclass(frozen=True)
class Network:
    """Per packet, each direction: lost with ``loss``, duplicated with ``dup`` (the copy
    has its own delay), delayed uniformly in [0.5, 1.5] time units, and with ``stale`` a
    further delay of up to ``stale_delay`` units (a round trip is about 2 units, so 30
    units hold a packet back for up to ~15 rounds)."""

    loss: float = 0.1
    dup: float = 0.1
    stale: float = 0.05
    stale_delay: float = 30.0

    def delays(self, rng: random.Random) -> list[float]:
        """Delivery delays of one sent packet: [] when lost, two when duplicated."""
        out = []
        for copy in range(2):
            if copy == 1 and rng.random() >= self.dup:
                break
            if rng.random() < self.loss:
                continue
            d = rng.uniform(0.5, 1.5)
            if rng.random() < self.stale:
                d += rng.uniform(0.0, self.stale_delay)
            out.append(d)
        return out


@dataclass
class Trace:
    """What happened: the switch's inputs in arrival order, its outputs for each, and
    counts of what the hosts saw."""

    inputs: list[tuple[int, bytes]] = field(default_factory=list)
    outputs: list[list[tuple[int, bytes]]] = field(default_factory=list)
    results_checked: int = 0
    retransmissions: int = 0
    ignored_results: int = 0


class ProtocolViolation(AssertionError):
    """The switch emitted a result that is not the exact sum of its round."""


@dataclass
class _Outstanding:
    chunk: int
    frame: bytes
    rto: float
    timer: int  # id of the live timer; older timers are ignored


class HostSimulation:
    """``workers`` hosts all-reduce ``chunks`` vectors of VECTOR_LEN int32 through one
    group of ``window`` aggregators."""

    def __init__(
        self,
        switch: Switch,
        *,
        seed: int,
        workers: int,
        window: int,
        chunks: int,
        group_id: int = 5,
        net: Network | None = None,
        rto: float = 6.0,
        max_rto: float = 48.0,
    ) -> None:
        assert chunks // window < 512, "keep round numbers unambiguous for the checks"
        self.switch = switch
        self.rng = random.Random(seed)
        self.n = workers
        self.window = window
        self.chunks = chunks
        self.group_id = group_id
        self.net = net or Network()
        self.rto = rto
        self.max_rto = max_rto
        self.values = [
            [
                [self.rng.randrange(-(2**31), 2**31) for _ in range(VECTOR_LEN)]
                for _ in range(chunks)
            ]
            for _ in range(workers)
        ]
        self.expected = [
            [
                wrap_int32(sum(self.values[w][k][i] for w in range(workers)))
                for i in range(VECTOR_LEN)
            ]
            for k in range(chunks)
        ]
        self.results: list[dict[int, list[int]]] = [{} for _ in range(workers)]
        self.outstanding: list[dict[int, _Outstanding]] = [{} for _ in range(workers)]
        self.trace = Trace()
        self._events: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.now = 0.0

    # ---- events ------------------------------------------------------------------------

    def _push(self, delay: float, kind: str, data: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + delay, self._seq, kind, data))

    def _transmit(self, kind: str, data: tuple) -> None:
        for d in self.net.delays(self.rng):
            self._push(d, kind, data)

    # ---- hosts -------------------------------------------------------------------------

    def _frame(self, w: int, k: int, retx: bool) -> bytes:
        header = InaHeader.at_round(
            self.group_id, k % self.window, w, self.n, k // self.window, is_retx=retx
        )
        return build_frame(
            header,
            self.values[w][k],
            src_mac=worker_mac(w),
            dst_mac=SWITCH_MAC,
            src_ip=worker_ip(w),
            dst_ip=SWITCH_IP,
        )

    def _send(self, w: int, k: int) -> None:
        frame = self._frame(w, k, retx=False)
        self._seq += 1
        o = _Outstanding(k, frame, self.rto, self._seq)
        self.outstanding[w][k % self.window] = o
        self._transmit("to_switch", (worker_port(w), frame))
        self._push(o.rto, "timer", (w, k % self.window, o.timer))

    def _on_timer(self, w: int, agg: int, timer: int) -> None:
        o = self.outstanding[w].get(agg)
        if o is None or o.timer != timer:
            return
        self.trace.retransmissions += 1
        o.frame = self._frame(w, o.chunk, retx=True)
        o.rto = min(o.rto * 2, self.max_rto)
        self._seq += 1
        o.timer = self._seq
        self._transmit("to_switch", (worker_port(w), o.frame))
        self._push(o.rto, "timer", (w, agg, o.timer))

    def _on_result(self, w: int, frame: bytes) -> None:
        msg = unpack(frame[INA_OFFSET:])
        h = msg.header
        o = self.outstanding[w].get(h.agg_index)
        if (
            h.group_id != self.group_id
            or o is None
            or h.round_number != (o.chunk // self.window) % 512
        ):
            self.trace.ignored_results += 1
            return
        self.results[w][o.chunk] = list(msg.values)
        del self.outstanding[w][h.agg_index]
        nxt = o.chunk + self.window
        if nxt < self.chunks:
            self._send(w, nxt)

    # ---- switch ------------------------------------------------------------------------

    def _check_result(self, frame: bytes) -> None:
        """Every result the switch emits is the exact sum of its round."""
        try:
            msg = unpack(frame[INA_OFFSET:])
        except InaDecodeError as e:
            raise ProtocolViolation(f"switch emitted a malformed INA frame: {e}") from e
        h = msg.header
        if not h.is_result:
            raise ProtocolViolation(f"switch emitted a contribution {h}")
        chunk = h.round_number * self.window + h.agg_index
        if chunk >= self.chunks or list(msg.values) != self.expected[chunk]:
            raise ProtocolViolation(
                f"t={self.now:.2f}: result for aggregator {h.agg_index} round "
                f"{h.round_number} is not the exact sum of its contributions"
            )
        self.trace.results_checked += 1

    def _on_switch(self, port: int, frame: bytes) -> None:
        out = self.switch(port, frame)
        self.trace.inputs.append((port, frame))
        self.trace.outputs.append(out)
        for egress, f in out:
            if int.from_bytes(f[36:38], "big") == INA_UDP_PORT:
                self._check_result(f)
            self._transmit("to_host", (egress - 1, f))

    # ---- run ---------------------------------------------------------------------------

    def run(self, max_events: int = 2_000_000) -> Trace:
        """Run until every worker holds every chunk's result; raises ProtocolViolation on
        a wrong result and AssertionError when the work does not finish."""
        for w in range(self.n):
            for k in range(min(self.window, self.chunks)):
                self._send(w, k)
        events = 0
        while self._events and any(len(r) < self.chunks for r in self.results):
            events += 1
            assert events <= max_events, "no progress: a round was lost"
            self.now, _, kind, data = heapq.heappop(self._events)
            if kind == "to_switch":
                self._on_switch(*data)
            elif kind == "to_host":
                if 0 <= data[0] < self.n:
                    self._on_result(*data)
            else:
                self._on_timer(*data)
        for w in range(self.n):
            missing = [k for k in range(self.chunks) if k not in self.results[w]]
            assert not missing, f"worker {w} never got chunks {missing[:5]}"
            for k in range(self.chunks):
                assert self.results[w][k] == self.expected[k], f"worker {w} chunk {k}"
        return self.trace
