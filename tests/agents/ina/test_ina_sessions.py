"""The host library (agents/ina/transport.py) and the executable switch together on loopback
(agents/ina/loopback.py): results only from the switch's address and port and of the
group's session, a restarted group never answered with an old sum, and a seeded property
test with packets delayed up to 4x the old 128-generation lifetime (1,100 rounds of their
aggregator), across a generation wrap, a group restart, duplication, loss and a foreign
host that forges results and contributions (docs/dataplane.md, "Sessions", "Packet
lifetime"). Every result is compared exactly with NumPy.
"""

from __future__ import annotations

import heapq
import random
import socket
import threading

import numpy as np
import pytest
from support.threads import in_threads

from agents.ina.impairments import Impairments
from agents.ina.loopback import LoopbackSwitch
from agents.ina.packet import SESSIONS, VECTOR_LEN, pack, unpack
from agents.ina.transport import InaGroup, InaSession, Timeouts
from agents.softswitch.headers import DROP_LATE, DROP_WRONG_PORT

FAST = Timeouts(initial_rto_s=0.05, min_rto_s=0.01, max_rto_s=0.5, give_up_s=30.0)


def int_sum(vectors: list[np.ndarray]) -> np.ndarray:
    """Exact int32 wrap-around sum, the switch's arithmetic."""
    return np.sum(np.stack(vectors).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


def all_reduce(members: list[InaSession], data: list[np.ndarray]) -> list[np.ndarray]:
    """Every member's all-reduce in its own thread; the first failure is raised here."""
    return in_threads(
        [lambda m=m, d=d: m.allreduce_lanes(d) for m, d in zip(members, data, strict=True)]
    )


def join(
    sw: LoopbackSwitch, group: int, workers: int, window: int, session: int, first: int
) -> list[InaSession]:
    """A (re)started group: fresh sockets, worker w on switch port w + 1."""
    members = []
    for w in range(workers):
        g = InaGroup(
            group, w, workers, window, *sw.address, session=session, first_generation=first
        )
        s = InaSession.open(g, "127.0.0.1", 0, timeouts=FAST)
        sw.register(w + 1, s.sock.getsockname())
        members.append(s)
    return members


def test_a_result_from_another_host_or_session_is_never_taken() -> None:
    """A member waits for one chunk; before the switch's true result it receives the same
    result forged by another host (666 in every lane) and one from the switch's address of
    another session. It takes the true one only."""
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    switch.settimeout(20)
    foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    g = InaGroup(4, 0, 2, 1, *switch.getsockname(), session=77, first_generation=2**32 - 1)
    s = InaSession.open(g, "127.0.0.1", 0, timeouts=Timeouts(initial_rto_s=5.0, give_up_s=20.0))
    got: list[np.ndarray] = []
    member = threading.Thread(target=lambda: got.append(s.allreduce_lanes(np.ones(32, np.int32))))
    member.start()
    try:
        data, addr = switch.recvfrom(2048)
        h = unpack(data).header
        assert (h.session, h.generation, h.version) == (77, 2**32 - 1, 0)
        result = h.__class__(**{**h.__dict__, "is_result": True})
        other = h.__class__(**{**h.__dict__, "is_result": True, "session": 78})
        foreign.sendto(pack(result, [666] * VECTOR_LEN), addr)
        switch.sendto(pack(other, [555] * VECTOR_LEN), addr)
        switch.sendto(pack(result, [2] * VECTOR_LEN), addr)
        member.join(timeout=20)
    finally:
        switch.close()
        foreign.close()
        s.close()
    assert len(got) == 1 and got[0].tolist() == [2] * 32
    assert s.stats.foreign == 2 and s.stats.results == 1


def test_a_restarted_group_gets_its_new_sums_not_the_old_ones() -> None:
    """Session 5 sums one chunk; the group restarts as session 6 from round 0 with other
    data. The switch still holds session 5's complete round 0; the new members must get
    the new sum (before sessions they were answered with the old one)."""
    rng = np.random.default_rng(3)
    with LoopbackSwitch() as sw:
        sw.add_group(2, 1, [1, 2])
        for session in (5, 6):
            members = join(sw, 2, 2, 1, session, 0)
            data = [rng.integers(-(2**20), 2**20, 32, dtype=np.int32) for _ in members]
            for got in all_reduce(members, data):
                assert np.array_equal(got, int_sum(data)), f"session {session}"
            for s in members:
                s.close()


class HostileLoopback(LoopbackSwitch):
    """The loopback switch with two more impairments, both drawn from its seeded generator:
    a datagram (either direction) held back and delivered again up to ``max_hold`` frames
    later (its original still goes through), and, for every ``forge_every``-th contribution,
    a foreign host (not the switch's address) sending its member the round's result with
    666 in every lane, and a contribution of the same round from a port no worker is bound
    to."""

    FOREIGN_PORT = 50

    def __init__(self, *, hold: float, max_hold: int, forge_every: int, seed: int) -> None:
        super().__init__(Impairments(loss=0.003, duplicate=0.05), seed=seed)
        self.hold, self.max_hold, self.forge_every = hold, max_hold, forge_every
        self.frames = 0
        self.held: list[tuple[int, int, str, int, bytes]] = []
        self.released = 0
        self.foreign = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.foreign.bind(("127.0.0.1", 0))
        self.register(self.FOREIGN_PORT, self.foreign.getsockname())

    def _schedule(self, kind: str, port: int, payload: bytes, now: float) -> None:
        if self.rng.random() < self.hold:
            due = self.frames + self.rng.randint(1, self.max_hold)
            heapq.heappush(self.held, (due, self._seq, kind, port, payload))
        super()._schedule(kind, port, payload, now)

    def _switch(self, port: int, payload: bytes, now: float) -> None:
        self.frames += 1
        while self.held and self.held[0][0] <= self.frames:
            _, _, kind, p, data = heapq.heappop(self.held)
            self.released += 1
            if kind == "in":
                super()._switch(p, data, now)
            else:
                self._seq += 1
                heapq.heappush(self._events, (now, self._seq, "out", p, data))
        if self.frames % self.forge_every == 0 and port != self.FOREIGN_PORT:
            h = unpack(payload).header
            forged = h.__class__(**{**h.__dict__, "is_result": True})
            self.foreign.sendto(pack(forged, [666] * VECTOR_LEN), self._addr_of[port])
            super()._switch(self.FOREIGN_PORT, payload, now)
        super()._switch(port, payload, now)


@pytest.mark.parametrize("seed", [1, 2])
def test_property_every_accepted_result_is_its_rounds_exact_sum(seed: int) -> None:
    """3 members, 2 aggregators; session A runs 1,200 chunks (600 rounds per aggregator)
    from 300 generations before the 32-bit wrap, then the group restarts as a newer
    session B with a random first generation and runs as many. Datagrams are held back up
    to 1,100 rounds of their aggregator (held ones of session A reach the switch during
    session B). Every member ends every all-reduce with the exact sum (a wrong result
    taken would show there), none times out (no round lost), and the switch dropped late
    packets and the foreign host's contributions."""
    rng = random.Random(seed)
    workers, window, chunks = 3, 2, 1200
    frames_per_round = workers * window  # contributions per round of every aggregator
    sw = HostileLoopback(hold=0.01, max_hold=1100 * frames_per_round, forge_every=97, seed=seed)
    sessions = [rng.randrange(SESSIONS)]
    sessions.append((sessions[0] + rng.randint(1, 1000)) % SESSIONS)  # newer (RFC 1982)
    firsts = [2**32 - 300, rng.randrange(2**32)]
    data_rng = np.random.default_rng(seed)
    with sw:
        sw.add_group(3, window, [w + 1 for w in range(workers)])
        members: list[InaSession] = []
        for session, first in zip(sessions, firsts, strict=True):
            members = join(sw, 3, workers, window, session, first)
            data = [
                data_rng.integers(-(2**28), 2**28, chunks * VECTOR_LEN, dtype=np.int32)
                for _ in members
            ]
            for got in all_reduce(members, data):
                assert np.array_equal(got, int_sum(data)), f"session {session}"
            assert sum(s.stats.foreign for s in members) > 0
            for s in members:
                s.close()
    sw.foreign.close()
    drops = sw.pipeline.ingress.ina_drops.packets
    assert drops[DROP_LATE] > 0 and drops[DROP_WRONG_PORT] > 0
    assert sw.released > 0


def test_the_worker_takes_the_session_its_coordinator_hands_out() -> None:
    """The emulation's worker (agents/ina/worker.py) builds its group with the session and
    first generation of its command (0 where none is given), refuses values outside 32
    bits, and starts a new INA session when the session changes, even with another window."""
    from agents.ina.ring import PeerListener
    from agents.ina.worker import CommandError, Worker

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    w = Worker("g0", udp, PeerListener.open("127.0.0.1", 0))
    spec = {"group_id": 3, "worker_id": 1, "num_workers": 2, "window": 4, "switch_ip": "10.0.0.9"}
    try:
        assert (w.session(spec).group.session, w.session(spec).group.first_generation) == (0, 0)
        a = w.session({**spec, "session": 2**32 - 1, "first_generation": 12})
        assert (a.group.session, a.group.first_generation) == (2**32 - 1, 12)
        b = w.session({**spec, "session": 0, "window": 8})  # a new session may resize
        assert b is not a and b.group.window == 8 and w.sessions[3] is b
        with pytest.raises(CommandError, match="window"):
            w.session({**spec, "session": 0, "window": 2})  # the same session may not
        for bad in ({"session": 2**32}, {"first_generation": -1}, {"session": "1"}):
            with pytest.raises(CommandError, match=next(iter(bad))):
                w.session({**spec, **bad})
    finally:
        w.listener.close()
        udp.close()
