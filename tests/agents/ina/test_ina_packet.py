"""INA header codec (agents/ina/packet.py): layout, round trips, fixed point, scapy layer."""

import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import raw

from agents.ina.packet import (
    INA_UDP_PORT,
    PAYLOAD_LEN,
    ROUND_MODULUS,
    VECTOR_LEN,
    InaDecodeError,
    InaHeader,
    build_frame,
    from_fixed,
    pack,
    to_fixed,
    unpack,
    wrap_int32,
)
from agents.ina.scapy_layer import INA


def test_header_layout_is_big_endian_with_flag_bits() -> None:
    h = InaHeader(
        group_id=0x0102,
        agg_index=0x0304,
        worker_id=5,
        num_workers=6,
        version=1,
        is_retx=True,
        is_result=False,
        generation=0x0A0B0C0D,
        session=0x11223344,
    )
    data = pack(h, [-1] + [0] * (VECTOR_LEN - 1))
    assert len(data) == PAYLOAD_LEN == 144
    assert data[:8] == bytes([0x01, 0x02, 0x03, 0x04, 5, 6, 0x80 | 0x40, 0])
    assert data[8:16] == bytes([0x11, 0x22, 0x33, 0x44, 0x0A, 0x0B, 0x0C, 0x0D])
    assert data[16:20] == b"\xff\xff\xff\xff"


def test_round_trip() -> None:
    h = InaHeader(7, 9, 3, 4, version=0, is_retx=False, is_result=True)
    values = [(-1) ** i * i * 1000 for i in range(VECTOR_LEN)]
    msg = unpack(pack(h, values) + b"trailing")
    assert msg.header == h
    assert list(msg.values) == values


@pytest.mark.parametrize("size", [0, 7, 16, PAYLOAD_LEN - 1])
def test_short_payload_is_rejected(size: int) -> None:
    with pytest.raises(InaDecodeError):
        unpack(bytes(size))


def test_pack_rejects_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="worker_id"):
        pack(InaHeader(1, 1, 256, 4), [0] * VECTOR_LEN)
    with pytest.raises(ValueError, match="32-bit lane"):
        pack(InaHeader(1, 1, 0, 4), [2**31] + [0] * (VECTOR_LEN - 1))
    with pytest.raises(ValueError, match="32 values"):
        pack(InaHeader(1, 1, 0, 4), [0] * 3)


def test_fixed_point_scale_rounding_and_saturation() -> None:
    assert to_fixed(1.5) == 98304  # 1.5 * 2**16
    assert to_fixed(-0.25, scale=1000) == -250
    assert from_fixed(98304) == 1.5
    assert to_fixed(1e12) == 2**31 - 1
    assert to_fixed(-1e12) == -(2**31)
    assert to_fixed(float("inf")) == 2**31 - 1
    with pytest.raises(ValueError):
        to_fixed(float("nan"))


def test_wrap_int32() -> None:
    assert wrap_int32(2**31) == -(2**31)
    assert wrap_int32(-(2**31) - 1) == 2**31 - 1
    assert wrap_int32(5) == 5


def test_build_frame_matches_scapy() -> None:
    h = InaHeader(3, 5, 1, 4, version=1)
    values = list(range(-16, 16))
    frame = build_frame(h, values, src_ip="10.0.0.1", dst_ip="10.0.0.254")
    pkt = Ether(frame)
    assert pkt[UDP].dport == INA_UDP_PORT
    assert pkt[INA].group_id == 3 and pkt[INA].version == 1 and pkt[INA].worker_id == 1
    assert pkt[INA].values == values
    # IPv4 checksum as scapy computes it.
    rebuilt = IP(raw(pkt[IP]))
    del rebuilt.chksum
    assert IP(raw(rebuilt)).chksum == struct.unpack("!H", frame[24:26])[0]


def test_scapy_layer_encodes_like_pack() -> None:
    values = list(range(VECTOR_LEN))
    pkt = (
        Ether()
        / IP()
        / UDP(sport=1, dport=INA_UDP_PORT)
        / INA(group_id=3, agg_index=5, worker_id=1, num_workers=4, is_result=1, values=values)
    )
    assert raw(pkt[INA]) == pack(InaHeader(3, 5, 1, 4, is_result=True), values)


def test_round_numbers_travel_as_version_and_generation() -> None:
    h = InaHeader.at_round(3, 5, 1, 4, 7, is_retx=True)
    assert (h.version, h.generation, h.is_retx) == (1, 3, True)
    data = pack(h, [0] * VECTOR_LEN)
    assert data[6] == 0x80 | 0x40 and data[12:16] == bytes([0, 0, 0, 3])
    assert unpack(data).header.round_number == 7
    # The header carries the round modulo 2**33: round 2**33 + 7 looks like round 7.
    assert InaHeader.at_round(3, 5, 1, 4, ROUND_MODULUS + 7) == InaHeader.at_round(3, 5, 1, 4, 7)
    assert InaHeader.at_round(3, 5, 1, 4, 2**33 - 2).generation == 2**32 - 1
    # A session counts generations from its first one, wrapping at 2**32.
    h = InaHeader.at_round(3, 5, 1, 4, 5, session=77, first_generation=2**32 - 1)
    assert (h.version, h.generation, h.session) == (1, 1, 77)
    with pytest.raises(ValueError, match="negative"):
        InaHeader.at_round(3, 5, 1, 4, -1)
    with pytest.raises(ValueError, match="generation"):
        pack(InaHeader(1, 1, 0, 4, generation=2**32), [0] * VECTOR_LEN)
    with pytest.raises(ValueError, match="session"):
        pack(InaHeader(1, 1, 0, 4, session=-1), [0] * VECTOR_LEN)


def test_reserved_flag_bits_are_refused_on_decode() -> None:
    data = bytearray(pack(InaHeader(1, 1, 0, 4), [0] * VECTOR_LEN))
    data[6] |= 0x08
    with pytest.raises(InaDecodeError, match="reserved"):
        unpack(bytes(data))
    data[6] &= ~0x08
    data[7] = 1  # the reserved byte
    with pytest.raises(InaDecodeError, match="reserved"):
        unpack(bytes(data))


def test_scapy_layer_carries_the_generation() -> None:
    values = [0] * VECTOR_LEN
    layer = INA(
        group_id=1,
        agg_index=2,
        worker_id=0,
        num_workers=2,
        generation=2**32 - 9,
        session=7,
        values=values,
    )
    assert raw(layer) == pack(InaHeader(1, 2, 0, 2, generation=2**32 - 9, session=7), values)
