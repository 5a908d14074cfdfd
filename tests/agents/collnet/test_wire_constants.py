"""The C++ copy of the INA wire constants (csrc/include/heroserve/ina_wire.h) equals their
definition, agents/ina/packet.py, name for name: the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from agents.ina import packet

HEADER = Path(__file__).resolve().parents[3] / "csrc" / "include" / "heroserve" / "ina_wire.h"
CONSTANT = re.compile(r"^inline constexpr (?:const )?[\w:]+\s*\*?\s*(\w+)\s*=\s*(.+?);", re.M)


def cxx_constants() -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for name, value in CONSTANT.findall(HEADER.read_text()):
        value = value.strip()
        if value.startswith('"'):
            out[name] = value.strip('"')
        else:
            out[name] = int(value, 0)
    return out


def test_lane_format_table_matches_the_scalar_constants() -> None:
    # LANE_FORMATS is the definition; the scalars are what C++ mirrors.
    i32, b16 = packet.LANE_FORMATS["int32"], packet.LANE_FORMATS["bfp16"]
    assert (i32.lanes, i32.sum_bits, i32.flag) == (
        packet.INT32_LANES, packet.INT32_SUM_BITS, 0,
    )  # fmt: skip
    assert (b16.lanes, b16.sum_bits, b16.flag) == (
        packet.BFP16_LANES, packet.BFP16_SUM_BITS, packet.FLAG_BFP16,
    )  # fmt: skip
    # The flag bits partition the flags byte: no bit has two meanings.
    bits = [packet.FLAG_VERSION, packet.FLAG_RETX, packet.FLAG_RESULT, packet.FLAG_BFP16,
            packet.FLAG_OVERFLOW, packet.FLAG_RESERVED]  # fmt: skip
    assert sum(bits) == 0xFF and all(a & b == 0 for a in bits for b in bits if a is not b)
    assert packet.EXP_BIAS + packet.EXP_MAX < packet.EXP_BAD
    assert packet.EXP_BIAS + packet.EXP_MIN == 0


def test_every_cxx_wire_constant_equals_packet_py() -> None:
    got = cxx_constants()
    # The header must carry at least these (what the C++ client uses).
    needed = {
        "INA_UDP_PORT", "VECTOR_LEN", "VECTOR_BYTES", "DEFAULT_LANE_FORMAT", "HEADER_LEN",
        "PAYLOAD_LEN", "MAX_WORKERS", "MAX_GROUP_ID", "MAX_AGGREGATOR_SLOTS", "FLAG_VERSION",
        "FLAG_RETX", "FLAG_RESULT", "FLAG_RESERVED", "GENERATIONS", "SESSIONS",
        "INT32_LANES", "BFP16_LANES", "INT32_SUM_BITS", "BFP16_SUM_BITS", "FLAG_BFP16",
        "FLAG_OVERFLOW", "EXP_BIAS", "EXP_MIN", "EXP_MAX", "EXP_BAD",
    }  # fmt: skip
    assert needed <= set(got), f"missing in {HEADER.name}: {sorted(needed - set(got))}"
    for name, value in got.items():
        assert hasattr(packet, name), f"{HEADER.name} defines {name}, packet.py does not"
        assert getattr(packet, name) == value, (
            f"{name}: {HEADER.name} says {value!r}, agents/ina/packet.py {getattr(packet, name)!r}"
        )


def test_header_layout_matches_the_struct() -> None:
    # "!HHBBBBII": the offsets ina_wire.h's EncodeHeader writes.
    assert packet.HEADER_STRUCT.format == "!HHBBBBII"
    assert packet.HEADER_STRUCT.size == cxx_constants()["HEADER_LEN"]
