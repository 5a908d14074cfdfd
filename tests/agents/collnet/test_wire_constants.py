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


def test_every_cxx_wire_constant_equals_packet_py() -> None:
    got = cxx_constants()
    # The header must carry at least these (what the C++ client uses).
    needed = {
        "INA_UDP_PORT", "VECTOR_LEN", "VECTOR_BYTES", "LANE_FORMAT", "HEADER_LEN",
        "PAYLOAD_LEN", "MAX_WORKERS", "MAX_GROUP_ID", "MAX_AGGREGATOR_SLOTS", "FLAG_VERSION",
        "FLAG_RETX", "FLAG_RESULT", "FLAG_RESERVED", "GENERATIONS", "SESSIONS",
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
