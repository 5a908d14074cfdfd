"""bfp16 lanes in the executable model of p4/heroserve_ina.p4 (docs/dataplane.md, "Lane
formats"): exact saturating int16 sums in the paired halves of the pool words, the switch's
maximum of the members' exponent proposals, overflow flagged and counted, a round's lane
format enforced, and the reserved-bits rule of the exp byte and the overflow flag."""

from __future__ import annotations

import pytest

from agents.ina.packet import BFP16_LANES, VECTOR_LEN, InaHeader, build_frame, unpack
from agents.softswitch.headers import DROP_LANE_FORMAT, DROP_RESERVED_BITS
from agents.softswitch.pipeline import InaPipeline

PORTS = [1, 2, 3, 4]
GROUP, MCAST = 7, 100
OFF = 14 + 20 + 8


@pytest.fixture
def sw() -> InaPipeline:
    p = InaPipeline()
    p.add_group(GROUP, 0, slot=5, workers=4, mcast=MCAST)
    for w in range(4):
        p.bind_worker(GROUP, w, PORTS[w])
    p.pre.insert(MCAST, [(port, 0) for port in PORTS])
    return p


def frame(w: int, values: list[int], *, lanes: str = "bfp16", exp: int = 0, rnd: int = 0) -> bytes:
    h = InaHeader.at_round(GROUP, 0, w, 4, rnd, lanes=lanes, exp=exp)
    return build_frame(h, values, src_mac=f"02:00:00:00:00:0{w + 1}", src_ip=f"10.0.0.{w + 1}")


def lanes_of(w: int) -> list[int]:
    # Mixed signs, the extremes an honest member of 4 may send (|q| <= 2**12).
    return [(-1) ** (i + w) * ((i * 67 + w * 1013) % 4097) for i in range(BFP16_LANES)]


def test_bfp16_sum_is_exact_and_the_exponent_is_the_maximum(sw: InaPipeline) -> None:
    proposals = [130, 127, 140, 0]  # E = 3, 0, 13, -127: the maximum is 140
    outs = [sw.process(PORTS[w], frame(w, lanes_of(w), exp=proposals[w])) for w in range(4)]
    assert outs[:3] == [[], [], []]
    assert [p for p, _ in outs[3]] == PORTS
    msg = unpack(outs[3][0][1][OFF:])
    assert msg.header.lanes == "bfp16" and msg.header.is_result
    assert msg.header.exp == 140 and not msg.header.overflow
    assert list(msg.values) == [sum(lanes_of(w)[i] for w in range(4)) for i in range(BFP16_LANES)]
    # A lost result: the retransmission is answered with the same lanes and exponent.
    again = sw.process(PORTS[1], frame(1, lanes_of(1), exp=proposals[1]))
    back = unpack(again[0][1][OFF:])
    assert (back.header.exp, back.values) == (140, msg.values)


def test_the_next_round_starts_its_own_maximum(sw: InaPipeline) -> None:
    for rnd, proposals in ((0, [150, 1, 2, 3]), (1, [5, 6, 7, 8]), (2, [9, 10, 11, 12])):
        outs = [
            sw.process(PORTS[w], frame(w, [w] * BFP16_LANES, exp=proposals[w], rnd=rnd))
            for w in range(4)
        ]
        assert unpack(outs[3][0][1][OFF:]).header.exp == max(proposals)


def test_overflow_saturates_flags_and_counts(sw: InaPipeline) -> None:
    big = [30000, -30000] * (BFP16_LANES // 2)
    outs = [sw.process(PORTS[w], frame(w, big if w < 2 else [1] * BFP16_LANES)) for w in range(4)]
    msg = unpack(outs[3][0][1][OFF:])
    assert msg.header.overflow
    # Lane 0: 30000, 60000 -> 32767, then +1 twice stays 32767 (saturated each time);
    # lane 1: -30000, -60000 -> -32768, then +1 twice: -32766. Never wrapped.
    assert list(msg.values[:2]) == [32767, -32766]
    assert sw.ingress.lane_overflows.packets[0] == 3  # members 1, 2 and 3 saturated a lane


def test_a_round_keeps_the_format_of_its_first_contribution(sw: InaPipeline) -> None:
    assert sw.process(PORTS[0], frame(0, [1] * BFP16_LANES)) == []
    assert sw.process(PORTS[1], frame(1, [1] * VECTOR_LEN, lanes="int32")) == []
    assert sw.ingress.ina_drops.packets[DROP_LANE_FORMAT] == 1
    # The dropped member was not marked as seen: its bfp16 packet still counts.
    for w in (1, 2):
        assert sw.process(PORTS[w], frame(w, [1] * BFP16_LANES)) == []
    out = sw.process(PORTS[3], frame(3, [1] * BFP16_LANES))
    assert list(unpack(out[0][1][OFF:]).values) == [4] * BFP16_LANES


@pytest.mark.parametrize(
    ("flags_or", "exp"),
    [(0x00, 1), (0x08, 0), (0x18, 0)],  # int32 exp byte; overflow on int32; on a contribution
)
def test_reserved_uses_of_exp_and_overflow_are_dropped(
    sw: InaPipeline, flags_or: int, exp: int
) -> None:
    f = bytearray(frame(0, [1] * VECTOR_LEN, lanes="int32"))
    f[OFF + 6] |= flags_or
    f[OFF + 7] = exp
    assert sw.process(PORTS[0], bytes(f)) == []
    assert sw.ingress.ina_drops.packets[DROP_RESERVED_BITS] == 1
