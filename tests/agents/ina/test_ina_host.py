"""The host INA library (agents/ina/): lane format, windowed reliable INA over the executable
switch's pipeline on loopback (agents/ina/loopback.py), TCP ring, hierarchical scheme, and
the worker's command checks. No root needed; every result is compared exactly with NumPy."""

from __future__ import annotations

import io
import json
import math
import socket
import threading

import numpy as np
import pytest
from support.threads import in_threads

from agents.ina import lanes
from agents.ina.hier import HierMember
from agents.ina.impairments import Impairments
from agents.ina.loopback import LoopbackSwitch
from agents.ina.packet import InaHeader, pack
from agents.ina.ring import PeerListener, Ring, chunk_bounds
from agents.ina.transport import InaGroup, InaSession, Timeouts
from agents.ina.worker import Worker, member_data, serve

FAST = Timeouts(initial_rto_s=0.05, min_rto_s=0.01, max_rto_s=0.5, give_up_s=20.0)
# The generation byte (dataplane branch) makes the switch exactly-once under
# duplication and reordering; the version bit alone lets a late duplicate open a round.
EXACTLY_ONCE_SWITCH = hasattr(InaHeader, "at_round")


def int_sum(vectors: list[np.ndarray]) -> np.ndarray:
    """Exact int32 wrap-around sum, the switch's arithmetic."""
    return np.sum(np.stack(vectors).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


# -- lane format -------------------------------------------------------------------------
def test_scale_and_error_bound_hand_worked() -> None:
    # 4 members, data below 0.75: frexp(0.75) = (0.75, 0), so E = 0 and scale = 2**(30-2-0).
    assert lanes.exponent_of(0.75) == 0
    assert lanes.exponent_of(1.0) == 1  # 1.0 = 0.5 * 2**1: data must stay below 2**E
    assert lanes.scale_exponent(4, 0) == 28
    q = lanes.to_lanes(np.array([0.75, -0.5, 2.0**-30, 2.0**-29]), 4, 0)
    assert q.tolist() == [201326592, -134217728, 0, 0]  # 2**-29 * 2**28 = 0.5 rounds to 0
    # Error bound w / (2 * scale) = 4 / 2**29 = 2**-27.
    assert lanes.error_bound(4, 0) == 2.0**-27
    assert lanes.from_lanes(np.array([201326592]), 4, 0).tolist() == [0.75]


def test_no_partial_sum_can_overflow_at_the_largest_data() -> None:
    for workers in (1, 2, 3, 4, 7, 32):
        e = 5
        x = np.full(8, math.nextafter(2.0**e, 0.0))  # the largest magnitude with exponent e
        q = lanes.to_lanes(x, workers, e).astype(np.int64)
        assert workers * int(q.max()) < 2**31
        assert workers * int(lanes.to_lanes(-x, workers, e).min()) >= -(2**31)


def test_rounding_error_within_the_documented_bound() -> None:
    rng = np.random.default_rng(3)
    xs = [rng.uniform(-3.0, 3.0, 5000) for _ in range(6)]
    e = max(lanes.exponent_of(lanes.max_abs(x)) for x in xs)
    total = lanes.from_lanes(int_sum([lanes.to_lanes(x, 6, e) for x in xs]), 6, e)
    assert np.max(np.abs(total - np.sum(xs, axis=0))) <= lanes.error_bound(6, e)


def test_bad_data_is_refused() -> None:
    with pytest.raises(lanes.LaneError, match="NaN or infinity"):
        lanes.max_abs(np.array([1.0, np.nan]))
    with pytest.raises(lanes.LaneError, match="beyond"):
        lanes.exponent_of(2.0**40)
    with pytest.raises(lanes.LaneError, match="exceeds the group"):
        lanes.to_lanes(np.array([4.0]), 2, 1)


def test_exponent_agreement_is_a_maximum_through_an_adder() -> None:
    onehots = [lanes.exponent_lanes(e) for e in (-3, 7, 7, lanes.E_MIN)]
    assert lanes.agreed_exponent(int_sum(onehots)) == 7


# -- INA over the executable switch ------------------------------------------------------
def ina_members(
    sw: LoopbackSwitch, group_id: int, workers: int, window: int, first_port: int = 1
) -> list[InaSession]:
    """Members of one group, worker w on switch port ``first_port + w``."""
    sw.add_group(group_id, window, [first_port + w for w in range(workers)])
    out = []
    for w in range(workers):
        g = InaGroup(group_id, w, workers, window, sw.address[0], sw.address[1])
        s = InaSession.open(g, "127.0.0.1", 0, timeouts=FAST)
        sw.register(first_port + w, s.sock.getsockname())
        out.append(s)
    return out


def test_ina_allreduce_exact_and_rounds_continue_across_collectives() -> None:
    n = 1000  # 32 chunks: the last one padded
    rng = np.random.default_rng(1)
    with LoopbackSwitch() as sw:
        members = ina_members(sw, 9, 3, window=4)
        for trial in range(2):  # the second all-reduce runs rounds 8.. of each aggregator
            data = [rng.integers(-(2**29), 2**29, n, dtype=np.int32) for _ in members]
            got = in_threads(
                [lambda s=s, d=d: s.allreduce_lanes(d) for s, d in zip(members, data, strict=True)]
            )
            for g in got:
                assert np.array_equal(g, int_sum(data)), f"trial {trial}"
        # A datagram of another group reaching a member is counted, never taken.
        members[0].sock.sendto(
            pack(InaHeader(5, 0, 0, 3, is_result=True), [1] * 32),
            members[0].sock.getsockname(),
        )
        one = in_threads(
            [lambda s=s, e=e: s.agree_exponent(e) for s, e in zip(members, (2, -1, 0), strict=True)]
        )
        assert one == [2, 2, 2]
        assert members[0].stats.foreign == 1
        assert sum(s.stats.results for s in members) == 3 * (2 * 32 + 3)  # 3 agreement packets
        for s in members:
            s.close()


def run_impaired(impair: Impairments, seed: int) -> tuple[list[InaSession], bool]:
    rng = np.random.default_rng(seed)
    data = [rng.integers(-(2**28), 2**28, 32 * 150, dtype=np.int32) for _ in range(4)]
    with LoopbackSwitch(impair, delay_s=0.002, seed=seed) as sw:
        members = ina_members(sw, 3, 4, window=8)
        got = in_threads(
            [lambda s=s, d=d: s.allreduce_lanes(d) for s, d in zip(members, data, strict=True)]
        )
    for s in members:
        s.close()
    return members, all(np.array_equal(g, int_sum(data)) for g in got)


def test_ina_exact_under_loss_with_retransmissions() -> None:
    members, exact = run_impaired(Impairments(loss=0.05), seed=11)
    assert exact
    assert sum(s.stats.retransmissions for s in members) > 0


@pytest.mark.skipif(
    not EXACTLY_ONCE_SWITCH,
    reason="needs the switch's per-copy generation (dataplane branch)",
)
def test_ina_exact_under_loss_duplication_and_reordering() -> None:
    members, exact = run_impaired(Impairments(loss=0.03, duplicate=0.05, reorder=0.25), seed=5)
    assert exact
    assert sum(s.stats.stale for s in members) > 0  # duplicated results were dropped


def test_ina_gives_up_when_the_switch_is_gone() -> None:
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    g = InaGroup(1, 0, 2, 2, "127.0.0.1", dead.getsockname()[1])
    s = InaSession.open(
        g, "127.0.0.1", 0, timeouts=Timeouts(initial_rto_s=0.02, min_rto_s=0.01, give_up_s=0.3)
    )
    with pytest.raises(RuntimeError, match="no result"):
        s.allreduce_lanes(np.ones(40, dtype=np.int32))
    with pytest.raises(RuntimeError, match="unusable"):
        s.allreduce_lanes(np.ones(40, dtype=np.int32))
    assert s.stats.retransmissions >= 2  # with backoff: 0.02, 0.04, 0.08, ...
    s.close()
    dead.close()


# -- ring and hierarchical -----------------------------------------------------------------
def listeners(k: int) -> list[PeerListener]:
    return [PeerListener.open("127.0.0.1", 0) for _ in range(k)]


def addr(listener: PeerListener) -> str:
    return f"127.0.0.1:{listener.sock.getsockname()[1]}"


def test_chunk_bounds_cover_the_vector() -> None:
    assert chunk_bounds(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert chunk_bounds(2, 3) == [(0, 0), (0, 1), (1, 2)]


def test_ring_allreduce_two_channels_exact() -> None:
    p = 3
    ls = listeners(p)
    # Channel 0 in order 0,1,2; channel 1 in order 0,2,1 (NCCL's second ring).
    orders = [[0, 1, 2], [0, 2, 1]]

    def positions(r: int) -> list[tuple[int, int, str]]:
        out = []
        for order in orders:
            i = order.index(r)
            out.append((i, p, addr(ls[order[(i + 1) % p]])))
        return out

    rings = in_threads([lambda r=r: Ring.connect(ls[r], 77, positions(r)) for r in range(p)])
    rng = np.random.default_rng(2)
    data = [rng.integers(-(2**30), 2**30, 1001, dtype=np.int32) for _ in range(p)]
    got = in_threads([lambda r=r: rings[r].allreduce(data[r]) for r in range(p)])
    for g in got:
        assert np.array_equal(g, int_sum(data))
    for r in rings:
        r.close()
    for lst in ls:
        lst.close()


def test_hierarchical_two_servers_two_rails_exact() -> None:
    """Servers A and B with 2 members each: rail k = {A_k, B_k} on its own INA group."""
    names = ["A0", "A1", "B0", "B1"]
    ls = listeners(4)
    with LoopbackSwitch() as sw:
        rails = [ina_members(sw, 20 + k, 2, window=4, first_port=1 + 2 * k) for k in range(2)]
        rail_of = {"A0": rails[0][0], "B0": rails[0][1], "A1": rails[1][0], "B1": rails[1][1]}

        def member(i: int) -> HierMember:
            n = names[i]
            peer = i + 1 if i % 2 == 0 else i - 1  # the other GPU of the same server
            local = Ring.connect(ls[i], 300 + i // 2, [(i % 2, 2, addr(ls[peer]))])
            return HierMember(local, rail_of[n])

        hm = in_threads([lambda i=i: member(i) for i in range(4)])
        rng = np.random.default_rng(4)
        data = [rng.integers(-(2**28), 2**28, 517, dtype=np.int32) for _ in range(4)]
        got = in_threads([lambda i=i: hm[i].allreduce_lanes(data[i]) for i in range(4)])
        e = in_threads(
            [lambda i=i, e=e: hm[i].agree_exponent(e) for i, e in enumerate((1, 4, -2, 0))]
        )
    for g in got:
        assert np.array_equal(g, int_sum(data))
    assert e == [4, 4, 4, 4]
    for m in hm:
        m.local.close()
        m.rail.close()
    for lst in ls:
        lst.close()


# -- worker --------------------------------------------------------------------------------
def test_worker_refuses_bad_commands_and_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    w = Worker("g0", udp, PeerListener.open("127.0.0.1", 0))
    base = {
        "op": "prepare",
        "run": 1,
        "elements": 8,
        "seed": 1,
        "index": 0,
        "workers": 1,
        "repeat": 1,
    }
    lines = [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"op": "launch"}),
        json.dumps({**base, "scheme": "nccl"}),
        json.dumps({**base, "scheme": "ina"}),  # no "ina" section
        json.dumps({**base, "scheme": "ina", "elements": 10**12, "ina": {}}),
        json.dumps({**base, "scheme": "ring", "ring": {"token": 1, "channels": [[0, 1, "x"]]}}),
        json.dumps({"op": "go", "run": 1}),
        json.dumps({"op": "go", "run": 2}),
        json.dumps({"op": "quit"}),
    ]
    serve(w, io.StringIO("\n".join(lines) + "\n"))
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o["ok"] for o in out] == [False] * 6 + [True, True, False]
    assert "scheme must be one of" in out[3]["error"]
    assert "needs an object 'ina'" in out[4]["error"]
    assert "elements must be" in out[5]["error"]
    # A ring of one needs no peer: the lanes come back as they were, the exponent agreed.
    x = member_data(1, 0, 8)
    e = lanes.exponent_of(lanes.max_abs(x))
    assert out[7]["exponent"] == e and out[7]["digest"] != ""
    assert "was not prepared" in out[8]["error"]
    w.listener.close()
    udp.close()


def test_member_data_is_reproducible_and_bounded() -> None:
    a, b = member_data(7, 3, 100), member_data(7, 3, 100)
    assert np.array_equal(a, b) and not np.array_equal(a, member_data(7, 4, 100))
    assert a.dtype == np.float32 and float(np.max(np.abs(a))) < 1.0
    # Member 0's data is 100 times the others' (64 <= max |x| < 100 here); member 1's first
    # bfp16 block is zeros and the rest of it below 1.
    lead, zeros = member_data(7, 0, 200), member_data(7, 1, 200)
    assert 64.0 <= float(np.max(np.abs(lead))) < 100.0
    assert not zeros[:64].any() and 0.5 <= float(np.max(np.abs(zeros))) < 1.0


def test_the_wire_as_scapy_reads_it_window_rounds_and_a_retransmission() -> None:
    """One member against a switch played by this test, every datagram parsed and answered
    with scapy's INA layer (agents/ina/scapy_layer.py), independent of the library's own codec:
    chunk c goes to aggregator c % window as that aggregator's next round (the version bit
    alternates), nothing more than the window is outstanding, a chunk whose result is held
    back comes again flagged as a retransmission with the same lanes, and the member's
    result is what the switch answered."""
    from agents.ina.scapy_layer import INA

    window, n = 2, 3 * 32
    lanes_in = np.arange(-(n // 2), n - n // 2, dtype=np.int32) * 1000
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    switch.settimeout(10)
    g = InaGroup(7, 0, 1, window, *switch.getsockname())
    # Timeouts well above what a loaded machine takes to answer, so only the held-back chunk
    # is sent again.
    fast = Timeouts(initial_rto_s=0.5, min_rto_s=0.3, max_rto_s=1.0, give_up_s=10.0)
    s = InaSession.open(g, "127.0.0.1", 0, timeouts=fast)
    got: list[np.ndarray] = []
    member = threading.Thread(target=lambda: got.append(s.allreduce_lanes(lanes_in)))
    member.start()

    def receive() -> tuple[INA, tuple[str, int]]:
        data, addr = switch.recvfrom(2048)
        return INA(data), addr

    def answer(pkt: INA, addr: tuple[str, int]) -> None:
        result = pkt.copy()  # the round's fields as sent (version, generation where there is one)
        result.is_result, result.is_retx = 1, 0
        switch.sendto(bytes(result), addr)

    def chunk(pkt: INA) -> list[int]:
        return list(pkt.values)

    try:
        first = [receive() for _ in range(window)]  # chunks 0 and 1: the whole window
        assert [(p.group_id, p.agg_index, p.worker_id, p.num_workers) for p, _ in first] == [
            (7, 0, 0, 1),
            (7, 1, 0, 1),
        ]
        assert [(p.version, p.is_retx, p.is_result) for p, _ in first] == [(0, 0, 0), (0, 0, 0)]
        assert chunk(first[0][0]) == lanes_in[:32].tolist()
        answer(*first[0])  # aggregator 0 done; aggregator 1's result is held back
        # Chunk 2 on aggregator 0's next round, answered at once, and chunk 1 again once its
        # timeout fires (a loaded machine may resend chunk 2 too: answered as well).
        nxt = again = None
        while again is None or nxt is None:
            pkt, addr = receive()
            if pkt.agg_index == 0:
                nxt = nxt or pkt
                answer(pkt, addr)
            else:
                again = again or pkt
        assert (nxt.agg_index, nxt.version, nxt.is_retx) == (0, 1, 0)
        assert chunk(nxt) == lanes_in[64:].tolist()
        assert (again.agg_index, again.version, again.is_retx) == (1, 0, 1)
        assert chunk(again) == lanes_in[32:64].tolist()
        answer(again, addr)
        member.join(timeout=10)
        assert not member.is_alive()
    finally:
        switch.close()
        s.close()
    assert np.array_equal(got[0], lanes_in)
    assert (s.stats.sent, s.stats.results) == (3, 3) and s.stats.retransmissions >= 1
