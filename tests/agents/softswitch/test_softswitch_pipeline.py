"""The executable model of p4/heroserve_ina.p4 (agents/softswitch/pipeline.py), packet by
packet: exact sums, retransmissions, slot reuse across rounds, late packets, worker-port
binding, drop reasons, L2. The protocol under random interleavings is
tests/agents/softswitch/test_ina_protocol_property.py."""

import struct

import pytest

from agents.ina.packet import (
    VECTOR_LEN,
    InaHeader,
    build_frame,
    ipv4_checksum,
    pack,
    unpack,
)
from agents.softswitch.headers import (
    DROP_BAD_INDEX,
    DROP_BAD_WORKER_ID,
    DROP_FRAGMENT,
    DROP_LATE,
    DROP_NO_ENTRY,
    DROP_RESERVED_BITS,
    DROP_SHORT_HEADER,
    DROP_SLOT_OUT_OF_RANGE,
    DROP_WORKER_MISMATCH,
    DROP_WRONG_PORT,
    EVT_ADDED,
    EVT_COMPLETED,
    EVT_RETX_ABSORBED,
    EVT_RETX_ANSWERED,
    EVT_TRANSIT,
)
from agents.softswitch.pipeline import InaPipeline
from agents.softswitch.tables import TableEntry

PORTS = [1, 2, 3, 4]
GROUP, MCAST = 7, 100
OFF = 14 + 20 + 8  # INA payload offset in a frame


def worker_frame(
    w: int,
    values: list[int],
    *,
    round_: int = 0,
    agg: int = 0,
    group: int = GROUP,
    n: int = 4,
    retx: bool = False,
) -> bytes:
    """Worker w's contribution to round ``round_`` of aggregator ``agg`` (the host
    contract: version and generation from the round number)."""
    return build_frame(
        InaHeader.at_round(group, agg, w, n, round_, is_retx=retx),
        values,
        src_mac=f"02:00:00:00:00:0{w + 1}",
        src_ip=f"10.0.0.{w + 1}",
    )


def vec(w: int, round_: int = 0) -> list[int]:
    """Worker w's vector: mixed signs, large magnitudes, different per round."""
    return [(-1) ** (i + w) * (i * 1_000_003 + w * 7 + round_ * 100_000) for i in range(VECTOR_LEN)]


@pytest.fixture
def sw() -> InaPipeline:
    p = InaPipeline()
    p.add_group(GROUP, 0, slot=5, workers=4, mcast=MCAST)
    for w in range(4):
        p.bind_worker(GROUP, w, PORTS[w])
    p.pre.insert(MCAST, [(port, 0) for port in PORTS])
    return p


def run_round(sw: InaPipeline, round_: int = 0, agg: int = 0):
    outs = []
    for w in range(4):
        outs.append(sw.process(PORTS[w], worker_frame(w, vec(w, round_), round_=round_, agg=agg)))
    return outs


def result_values(out: list[tuple[int, bytes]]) -> list[int]:
    """The vector of the first frame of ``out`` (a result), as signed int32."""
    return list(unpack(out[0][1][OFF:]).values)


def expected_sum(round_: int = 0) -> list[int]:
    return [sum(vec(w, round_)[i] for w in range(4)) for i in range(VECTOR_LEN)]


def test_four_workers_exact_sum_multicast_to_all(sw: InaPipeline) -> None:
    outs = run_round(sw)
    assert outs[:3] == [[], [], []]  # contributions absorbed until the last one
    result = outs[3]
    assert [port for port, _ in result] == PORTS
    for _, frame in result:
        msg = unpack(frame[OFF:])
        assert list(msg.values) == expected_sum()
        assert msg.header.is_result and not msg.header.is_retx
        assert msg.header.group_id == GROUP and msg.header.version == 0
        assert ipv4_checksum(frame[14:34]) == 0  # valid checksum sums to 0
        assert frame[40:42] == b"\x00\x00"  # UDP checksum zeroed
        # From the switch's address (what the workers sent to), to the last contributor.
        assert frame[6:12] == bytes.fromhex("0200000000ff") and frame[26:30] == bytes(
            [10, 0, 0, 254]
        )
        assert frame[0:6] == bytes.fromhex("020000000004") and frame[30:34] == bytes([10, 0, 0, 4])
    ev = sw.ingress.ina_events.packets
    assert ev[EVT_ADDED] == 3 and ev[EVT_COMPLETED] == 1


def test_sum_wraps_like_int32(sw: InaPipeline) -> None:
    big = [2**31 - 1] * VECTOR_LEN
    for w in range(3):
        sw.process(PORTS[w], worker_frame(w, big))
    out = sw.process(PORTS[3], worker_frame(3, [1] * VECTOR_LEN))
    # 3 * (2**31 - 1) + 1 = 2**32 + 2**31 - 2 -> wraps to 2**31 - 2
    assert list(unpack(out[0][1][OFF:]).values) == [2**31 - 2] * VECTOR_LEN


def test_retransmission_before_completion_is_not_added(sw: InaPipeline) -> None:
    sw.process(PORTS[0], worker_frame(0, vec(0)))
    assert sw.process(PORTS[0], worker_frame(0, vec(0), retx=True)) == []
    # Even a duplicate with different values is ignored: the bitmap decides.
    assert sw.process(PORTS[0], worker_frame(0, [999] * VECTOR_LEN, retx=True)) == []
    for w in (1, 2):
        sw.process(PORTS[w], worker_frame(w, vec(w)))
    out = sw.process(PORTS[3], worker_frame(3, vec(3)))
    assert list(unpack(out[0][1][OFF:]).values) == expected_sum()
    assert sw.ingress.ina_events.packets[EVT_RETX_ABSORBED] == 2


def test_retransmission_after_completion_answers_that_worker_only(sw: InaPipeline) -> None:
    run_round(sw)
    out = sw.process(PORTS[1], worker_frame(1, [5] * VECTOR_LEN, retx=True))
    assert len(out) == 1
    port, frame = out[0]
    assert port == PORTS[1]
    msg = unpack(frame[OFF:])
    assert list(msg.values) == expected_sum() and msg.header.is_result
    # Addressed back to the worker: MAC and IP swapped.
    assert frame[0:6] == bytes.fromhex("020000000002")
    assert frame[30:34] == bytes([10, 0, 0, 2])
    assert ipv4_checksum(frame[14:34]) == 0
    assert sw.ingress.ina_events.packets[EVT_RETX_ANSWERED] == 1
    # The slot is untouched: a second duplicate gets the same answer.
    again = sw.process(PORTS[1], worker_frame(1, vec(1), retx=True))
    assert list(unpack(again[0][1][OFF:]).values) == expected_sum()


def test_slot_reuse_across_rounds_has_no_stale_values(sw: InaPipeline) -> None:
    for round_ in range(5):
        outs = run_round(sw, round_=round_)
        msg = unpack(outs[3][0][1][OFF:])
        assert list(msg.values) == expected_sum(round_)
        assert msg.header.round_number == round_  # the result names its round
    # Version 0 was used by rounds 0, 2, 4 (generations 0, 1, 2): round 4's sum only.
    copy = (5 << 1) | 0
    pool = sw.ingress.pool.values[copy << 5 : (copy << 5) + VECTOR_LEN]
    assert [v - (1 << 32) if v >= 2**31 else v for v in pool] == expected_sum(4)
    assert sw.ingress.slot_gen.read(copy) == 2


def test_interleaved_versions_keep_separate_sums(sw: InaPipeline) -> None:
    # Workers 0,1 got round 0's result early? No: they may not send round 1 before it.
    # Round 0 and round 1 of *different* aggregators interleave freely; here the two
    # copies of one slot: round 1 opens on version 1 while round 0 is still complete on
    # version 0 (a retransmission of round 0 is still answered).
    run_round(sw, round_=0)
    for w in (0, 1):
        sw.process(PORTS[w], worker_frame(w, vec(w, 1), round_=1))
    again = sw.process(PORTS[2], worker_frame(2, vec(2, 0), round_=0, retx=True))
    assert again[0][0] == PORTS[2] and result_values(again) == expected_sum(0)
    sw.process(PORTS[2], worker_frame(2, vec(2, 1), round_=1))
    out1 = sw.process(PORTS[3], worker_frame(3, vec(3, 1), round_=1))
    assert result_values(out1) == expected_sum(1)


def test_issue10_delayed_duplicate_cannot_open_a_round() -> None:
    """Rounds r (version 0) and r+1 (version 1) complete, then worker
    0's round-r packet arrives late (duplicated in the network). SwitchML's bitmap rule
    took it for round r+2, absorbed worker 0's real round r+2 packet as a duplicate and
    multicast 10 + 7 = 17 instead of 5 + 7 = 12. With generations it is answered with
    round r's stored result (which worker 0 ignores), and round r+2 sums to 12."""
    sw = InaPipeline()
    sw.add_group(GROUP, 0, slot=3, workers=2, mcast=MCAST)
    sw.bind_worker(GROUP, 0, 1)
    sw.bind_worker(GROUP, 1, 2)
    sw.pre.insert(MCAST, [(1, 0), (2, 0)])

    def send(w: int, value: int, round_: int) -> list[tuple[int, bytes]]:
        return sw.process(w + 1, worker_frame(w, [value] * VECTOR_LEN, round_=round_, n=2))

    late = worker_frame(0, [10] * VECTOR_LEN, round_=0, n=2)
    assert send(0, 10, 0) == [] and result_values(send(1, 2, 0)) == [12] * VECTOR_LEN
    assert send(0, 1, 1) == [] and result_values(send(1, 1, 1)) == [2] * VECTOR_LEN
    answer = sw.process(1, late)  # round 0's copy still holds round 0: answered
    assert [p for p, _ in answer] == [1] and unpack(answer[0][1][OFF:]).header.round_number == 0
    assert send(0, 5, 2) == []
    out = send(1, 7, 2)
    assert [p for p, _ in out] == [1, 2]
    assert result_values(out) == [12] * VECTOR_LEN
    # Once round 2 holds that copy, the same late packet is dropped and counted.
    assert sw.process(1, late) == []
    assert sw.ingress.ina_drops.packets[DROP_LATE] == 1


def test_generation_window() -> None:
    """A copy at generation g: only g + 1 opens a new round, g is its own round, every
    other generation (behind, or ahead by 2 or more, mod 2**32) is late and leaves the copy
    as it was; a newer session takes the copy over, an older one is late."""
    sw = InaPipeline()
    sw.add_group(GROUP, 0, slot=0, workers=2, mcast=MCAST)
    sw.bind_worker(GROUP, 0, 1)
    sw.bind_worker(GROUP, 1, 2)

    def contribute(gen: int, session: int = 5) -> None:
        h = InaHeader(GROUP, 0, 0, 2, generation=gen, session=session)
        sw.process(1, build_frame(h, [1] * VECTOR_LEN))

    drops = sw.ingress.ina_drops.packets
    top = 2**32 - 1
    contribute(top)  # the copy's first packet (a new owner) sets its generation
    assert sw.ingress.slot_gen.read(0) == top and sw.ingress.seen.read(0) == 1
    for gen in (top - 1, top - 300, 1, 2**31):  # behind by 1 and 300, ahead by 2 and 2**31
        contribute(gen)
    assert drops[DROP_LATE] == 4 and sw.ingress.slot_gen.read(0) == top
    assert sw.ingress.seen.read(0) == 1 and sw.ingress.contrib_count.read(0) == 1
    contribute(0)  # ahead by 1 across the wrap: a new round
    assert sw.ingress.slot_gen.read(0) == 0 and drops[DROP_LATE] == 4
    contribute(1, session=4)  # an older session: late, the copy untouched
    assert drops[DROP_LATE] == 5 and sw.ingress.slot_gen.read(0) == 0
    contribute(900, session=6)  # a newer session: takes the copy at its generation
    assert sw.ingress.slot_gen.read(0) == 900 and sw.ingress.slot_tag.read(0) & 0xFFFFFFFF == 6
    assert sw.ingress.slot_reclaims.packets[0] == 2 and drops[DROP_LATE] == 5


def test_single_worker_group_completes_on_every_round() -> None:
    sw = InaPipeline()
    sw.add_group(GROUP, 0, slot=9, workers=1, mcast=MCAST)
    sw.bind_worker(GROUP, 0, 1)
    sw.pre.insert(MCAST, [(1, 0)])
    for round_ in range(6):
        out = sw.process(1, worker_frame(0, vec(0, round_), round_=round_, n=1))
        assert result_values(out) == vec(0, round_)
    assert sw.ingress.ina_events.packets[EVT_COMPLETED] == 6


def test_worker_id_is_bound_to_its_port(sw: InaPipeline) -> None:
    """A host on port 1 cannot contribute as worker 1."""
    forged = worker_frame(1, [1_000_000] * VECTOR_LEN)
    assert sw.process(PORTS[0], forged) == []
    assert sw.ingress.ina_drops.packets[DROP_WRONG_PORT] == 1
    assert sw.ingress.seen.read(5 << 1) == 0  # nothing recorded
    # The real worker 1 still contributes, and the round sums the real vectors.
    outs = run_round(sw)
    assert result_values(outs[3]) == expected_sum()
    # A worker id of the group with no binding (unknown port) is refused too.
    sw.ingress.worker_port.delete((GROUP, 2))
    assert sw.process(PORTS[2], worker_frame(2, vec(2, 1), round_=1)) == []
    assert sw.ingress.ina_drops.packets[DROP_WRONG_PORT] == 2


def test_slot_reassigned_to_another_group_starts_clean(sw: InaPipeline) -> None:
    # Group 7 leaves slot 5 half full (2 of 4), then the slot goes to group 8.
    for w in (0, 1):
        sw.process(PORTS[w], worker_frame(w, vec(w)))
    sw.ingress.aggregation_table.delete((GROUP, 0))
    sw.add_group(8, 3, slot=5, workers=2, mcast=MCAST)
    sw.bind_worker(8, 0, PORTS[0])
    sw.bind_worker(8, 1, PORTS[1])
    sw.process(PORTS[0], worker_frame(0, [10] * VECTOR_LEN, group=8, agg=3, n=2))
    out = sw.process(PORTS[1], worker_frame(1, [32] * VECTOR_LEN, group=8, agg=3, n=2))
    assert result_values(out) == [42] * VECTOR_LEN
    assert sw.ingress.slot_reclaims.packets[0] == 2  # first use, then reuse
    # The new owner may continue its own round numbering (the slot moved under it).
    sw.process(PORTS[0], worker_frame(0, [1] * VECTOR_LEN, group=8, agg=3, n=2, round_=41))
    out = sw.process(PORTS[1], worker_frame(1, [2] * VECTOR_LEN, group=8, agg=3, n=2, round_=41))
    assert result_values(out) == [3] * VECTOR_LEN
    assert sw.ingress.slot_reclaims.packets[0] == 3  # version 1's first use by group 8


def _short(frame: bytes, cut: int) -> bytes:
    return frame[: len(frame) - cut]


def _set_bits(frame: bytes, offset: int, bits: int) -> bytes:
    b = bytearray(frame)
    b[offset] |= bits
    return bytes(b)


MF_BYTE = 14 + 6  # IPv4 flags: reserved, DF, MF in the top 3 bits of byte 6


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (_short(worker_frame(0, [1] * VECTOR_LEN), 1), DROP_SHORT_HEADER),
        (_short(worker_frame(0, [1] * VECTOR_LEN), 4 * VECTOR_LEN + 3), DROP_SHORT_HEADER),
        (worker_frame(4, [1] * VECTOR_LEN), DROP_BAD_WORKER_ID),  # worker 4 of 4
        (build_frame(InaHeader(GROUP, 0, 0, 33), [1] * VECTOR_LEN), DROP_BAD_WORKER_ID),
        (worker_frame(0, [1] * VECTOR_LEN, n=3), DROP_WORKER_MISMATCH),
        (worker_frame(0, [1] * VECTOR_LEN, group=9), DROP_NO_ENTRY),  # not aggregated here
        (worker_frame(0, [1] * VECTOR_LEN, agg=1), DROP_BAD_INDEX),  # group 7 has 0 and 2
        (worker_frame(0, [1] * VECTOR_LEN, agg=2), DROP_SLOT_OUT_OF_RANGE),
        (worker_frame(1, [1] * VECTOR_LEN), DROP_WRONG_PORT),  # worker 1 sent from port 1
        (_set_bits(worker_frame(0, [1] * VECTOR_LEN), OFF + 6, 0x01), DROP_RESERVED_BITS),
        (_set_bits(worker_frame(0, [1] * VECTOR_LEN), OFF + 6, 0x04), DROP_RESERVED_BITS),
        # The overflow flag is the switch's, on bfp16 results only (0x10 is the bfp16 bit).
        (_set_bits(worker_frame(0, [1] * VECTOR_LEN), OFF + 6, 0x08), DROP_RESERVED_BITS),
        (_set_bits(worker_frame(0, [1] * VECTOR_LEN), MF_BYTE, 0x20), DROP_FRAGMENT),
        (_short(_set_bits(worker_frame(0, [1] * VECTOR_LEN), MF_BYTE, 0x20), 64), DROP_FRAGMENT),
    ],
)
def test_malformed_packets_are_dropped_and_counted(
    sw: InaPipeline, frame: bytes, reason: int
) -> None:
    sw.add_group(GROUP, 2, slot=1024, workers=4, mcast=MCAST)  # points past the registers
    assert sw.process(PORTS[0], frame) == []
    drops = sw.ingress.ina_drops
    assert drops.packets[reason] == 1
    assert sum(drops.packets) == 1
    assert drops.bytes[reason] == len(frame)
    assert sum(sw.ingress.pool.values) == 0  # nothing was aggregated


def test_l2_forwarding_and_flooding() -> None:
    sw = InaPipeline()
    sw.add_l2(0x020000000002, 2)
    plain = bytes.fromhex("02000000000202000000000188b5") + b"x" * 50
    assert sw.process(1, plain) == [(2, plain)]
    unknown = bytes.fromhex("02000000000902000000000188b5") + b"x" * 50
    assert sw.process(1, unknown) == []  # default action drop
    sw.ingress.l2_forward.insert(
        TableEntry((0xFFFFFFFFFFFF,), "InaIngress.l2_multicast", {"mcast_grp": 9})
    )
    sw.pre.insert(9, [(1, 0), (2, 0), (3, 0)])
    bcast = bytes.fromhex("ffffffffffff0200000000010806") + b"a" * 28
    assert sw.process(1, bcast) == [(2, bcast), (3, bcast)]  # never back to port 1
    assert sw.ingress.port_rx.packets[1] == 3
    assert sw.egress.port_tx.packets[2] == 2 and sw.egress.port_tx.bytes[3] == len(bcast)
    assert sw.ingress.port_rx.bytes[1] == len(plain) + len(unknown) + len(bcast)


def test_ina_without_entry_transits_when_l2_knows_the_destination() -> None:
    sw = InaPipeline()
    sw.add_l2(0x0200000000FF, 9)
    frame = worker_frame(0, [1] * VECTOR_LEN)  # dst 02:00:00:00:00:ff
    assert sw.process(1, frame) == [(9, frame)]
    assert sw.ingress.ina_events.packets[EVT_TRANSIT] == 1
    assert sum(sw.ingress.ina_drops.packets) == 0


def test_result_packets_are_forwarded_not_aggregated(sw: InaPipeline) -> None:
    sw.add_l2(0x0200000000FF, 3)
    frame = build_frame(InaHeader(GROUP, 0, 0, 4, is_result=True), [1] * VECTOR_LEN)
    assert sw.process(1, frame) == [(3, frame)]
    assert sum(sw.ingress.ina_events.packets) == 0


def test_result_rewrite_sets_each_replicas_destination(sw: InaPipeline) -> None:
    for port in PORTS:
        sw.egress.result_rewrite.insert(
            TableEntry(
                (port,),
                "InaEgress.set_result_dst",
                {"dmac": 0x0A0000000000 + port, "dip": (10 << 24) | (9 << 8) | port},
            )
        )
    out = run_round(sw)[3]
    for port, frame in out:
        assert frame[0:6] == (0x0A0000000000 + port).to_bytes(6, "big")
        assert frame[30:34] == bytes([10, 0, 9, port])
        assert ipv4_checksum(frame[14:34]) == 0


def test_unknown_multicast_group_sends_nothing() -> None:
    sw = InaPipeline()
    sw.add_group(1, 0, slot=0, workers=1, mcast=55)
    sw.bind_worker(1, 0, 1)
    assert sw.process(1, build_frame(InaHeader(1, 0, 0, 1), [3] * VECTOR_LEN)) == []
    assert sw.ingress.ina_events.packets[EVT_COMPLETED] == 1


def test_trailing_bytes_are_kept_and_frames_below_ethernet_ignored(sw: InaPipeline) -> None:
    sw.add_l2(0x020000000002, 2)
    frame = bytes.fromhex("0200000000020200000000010800") + b"\x46" + bytes(40)
    assert sw.process(1, frame) == [(2, frame)]  # IPv4 with options: plain L2
    assert sw.process(1, b"\x00" * 10) == []
    assert struct.calcsize("!HHBBBBII") + 4 * VECTOR_LEN == len(
        pack(InaHeader(0, 0, 0, 1), [0] * VECTOR_LEN)
    )


def test_random_and_truncated_frames_never_raise(sw: InaPipeline) -> None:
    """Any bytes in, frames or nothing out: bad packets are dropped, never an exception."""
    import random

    rng = random.Random(1234)
    good = worker_frame(0, vec(0))
    sw.add_l2(0x0200000000FF, 2)
    for _ in range(2000):
        kind = rng.randrange(3)
        if kind == 0:
            frame = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        elif kind == 1:
            frame = good[: rng.randrange(0, len(good) + 1)]
        else:  # valid headers, random INA fields
            b = bytearray(good)
            for i in range(OFF, OFF + 16):
                b[i] = rng.randrange(256)
            if rng.random() < 0.75:  # mostly a clear reserved byte, to reach the later checks
                b[OFF + 7] = 0
            frame = bytes(b)
        for port, out in sw.process(rng.randrange(1, 5), frame):
            assert 0 <= port < 511 and len(out) >= 14
    drops = sw.ingress.ina_drops.packets
    assert drops[DROP_SHORT_HEADER] > 0 and drops[DROP_BAD_WORKER_ID] > 0
