"""INA header codec: the wire format of p4/heroserve_ina.p4 (docs/dataplane.md).

An INA packet is Ethernet / IPv4 (no options) / UDP with destination port
``INA_UDP_PORT`` / a 16-byte INA header / ``VECTOR_BYTES`` of lanes, all big-endian::

    0      2      4      5      6      7     8         12           16
    | group_id | agg_index | worker | nwork | flags | exp | session | generation | lanes

``flags``: bit 7 = version (which shadow copy of the slot), bit 6 = retransmission,
bit 5 = result (set by the switch), bit 4 = lane format (0: ``int32``, 1: ``bfp16``),
bit 3 = overflow (set by the switch on a ``bfp16`` result some lane of which saturated),
bits 2..0 reserved (zero, or the switch drops the packet). ``exp`` is the ``bfp16`` block
exponent byte (zero for ``int32``); the lane formats are :data:`LANE_FORMATS`
(docs/dataplane.md, "Lane formats"). ``session`` names the group's
session (one per job start, the same at every member; a later session takes the slots
over, docs/dataplane.md "Sessions"); ``generation`` is the use of the copy. Version and
generation number the uses of one aggregator: round ``r`` of a session travels as
``version = r % 2`` and ``generation = (first_generation + r // 2) % 2**32``
(:meth:`InaHeader.at_round`), which is what makes the switch's aggregation exactly-once
under loss, duplication, reordering and delay (docs/dataplane.md, "Slot protocol").

Values are fixed-point: a real ``x`` travels as ``round(x * scale)`` in a lane; ``int32``
lanes add with two's-complement wrap-around (so integer sums are exact modulo 2**32), so
the sender must pick a scale for which ``num_workers * max|x| * scale < 2**31``;
``bfp16`` lanes add with saturation and a flag (agents/ina/lanes.py picks the scales).

This module is the one home of the wire constants every other part imports (the switch
model agents/softswitch, the host transport, the controller's slot pool, group ids and
input limits, the cost model's packet size): the UDP port, vector and header sizes, the
header's ``struct`` layout (``HEADER_STRUCT``), the worker limit (``MAX_WORKERS``), the
group-id and aggregator-slot limits (``MAX_GROUP_ID``, ``MAX_AGGREGATOR_SLOTS``), the flag
bits, the generation and session spaces. It holds the codec (:class:`InaHeader`, :func:`pack`,
:func:`unpack`, fixed point, :func:`build_frame`); the scapy layer ``INA`` is in
agents/ina/scapy_layer.py, so that importing the constants does not load scapy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

INA_UDP_PORT = 48879  # 0xBEEF
VECTOR_LEN = 32  # 32-bit words of lanes per packet (the P4 parser's v0 .. v31)
VECTOR_BYTES = 4 * VECTOR_LEN  # 128 bytes of lanes, whatever the format
HEADER_LEN = 16
PAYLOAD_LEN = HEADER_LEN + VECTOR_BYTES  # 144 bytes after the UDP header


@dataclass(frozen=True)
class WireLanes:
    """One lane format the switch adds (docs/dataplane.md, "Lane formats", gives the source
    of every figure). ``lanes`` lanes of ``lane_bits`` bits fill the ``VECTOR_BYTES`` of a
    packet; partial sums of honest members stay below ``2**sum_bits`` (headroom the hosts
    keep); ``exponent`` says where the scale travels, ``overflow`` what the switch does when
    a lane's sum leaves the lane anyway."""

    name: str
    lane_bits: int
    lanes: int
    sum_bits: int
    exponent: Literal["vector", "packet"]
    overflow: Literal["wrap", "saturate"]
    flag: int  # the header's lane-format bit for this format

    @property
    def payload_bytes(self) -> int:
        return self.lanes * self.lane_bits // 8


INT32_LANES = 32
BFP16_LANES = 64
INT32_SUM_BITS = 30  # fixed point: |sum| < 2**30 + w/2 < 2**31
BFP16_SUM_BITS = 14  # block floating point: |sum| < 2**14 + w/2 < 2**15
FLAG_BFP16 = 0x10
FLAG_OVERFLOW = 0x08
LANE_FORMATS: dict[str, WireLanes] = {
    # int32 fixed point (SwitchML's scaling): one exponent per vector, agreed in a round of
    # one-hot lanes before the data (agents/ina/lanes.py); the sum wraps modulo 2**32, so
    # integer data (int8/uint8/int32/uint32) sums exactly as NCCL's wrap-around sum does.
    "int32": WireLanes("int32", 32, INT32_LANES, INT32_SUM_BITS, "vector", "wrap", 0),
    # bfp16 block floating point: int16 lanes (two per 32-bit register word: a Tofino
    # stateful ALU updates the paired 16-bit halves of one 32-bit register, so the 32
    # register arrays of int32 carry 64 lanes in the same stages), one exponent per packet
    # travelling in the header's exp byte: each member proposes the exponent of the block
    # the slot carries next, the switch keeps the maximum and returns it in the result.
    # Floats only: a lane's sum saturates and the result is flagged (FLAG_OVERFLOW).
    "bfp16": WireLanes("bfp16", 16, BFP16_LANES, BFP16_SUM_BITS, "packet", "saturate", FLAG_BFP16),
}
assert all(f.payload_bytes == VECTOR_BYTES for f in LANE_FORMATS.values())
LaneFormatName = Literal["int32", "bfp16"]  # the names of LANE_FORMATS
assert get_args(LaneFormatName) == tuple(LANE_FORMATS)
# The format of a group that names none, and the formats the switch's program
# (p4/heroserve_ina.p4; agents/softswitch) adds: a plan priced for another format is refused
# where it would be served (controller/inputs/plan_checks.py).
DEFAULT_LANE_FORMAT: LaneFormatName = "int32"
DATAPLANE_LANE_FORMATS: tuple[str, ...] = tuple(LANE_FORMATS)

# bfp16's exp byte: a block exponent E (|x| < 2**E for every x of the block) travels biased,
# as EXP_BIAS + E, so that the switch's maximum is an unsigned maximum. EXP_BAD marks a
# member whose block cannot travel (NaN or infinity): it is the largest byte, so the
# maximum hands it to every member, which all refuse the block.
EXP_BIAS = 127
EXP_MIN = -EXP_BIAS  # a block of zeros (or below 2**-127) travels with E = EXP_MIN
EXP_MAX = 127
EXP_BAD = 0xFF
# The header's fields in order: group_id, agg_index, worker_id, num_workers, flags, the exp
# byte (bfp16; zero for int32), session, generation.
HEADER_STRUCT = struct.Struct("!HHBBBBII")
MAX_WORKERS = 32  # width of the switch's bitmap of workers seen (INA_MAX_WORKERS in P4)
# group_id is 16 bits and 0 means "no group" (docs/dataplane.md): ids are 1..MAX_GROUP_ID.
MAX_GROUP_ID = (1 << 16) - 1
# agg_index, and the aggregation table's slot that it selects, are 16 bits: neither a group
# nor a switch can address more aggregators than this, whatever an inventory says.
MAX_AGGREGATOR_SLOTS = 1 << 16

FLAG_VERSION = 0x80
FLAG_RETX = 0x40
FLAG_RESULT = 0x20
FLAG_RESERVED = 0x07

GENERATIONS = 1 << 32  # the generation field is 32 bits
ROUND_MODULUS = 2 * GENERATIONS  # round numbers of one aggregator, as the header carries them
# The switch opens a new round on a copy only for the generation right after the copy's
# (a worker's packet of round r finds its copy at round r - 2 or r); any other generation is
# late, dropped and counted. A packet therefore aliases a newer round only when delayed by
# GENERATIONS - 1 generations of its aggregator: 2**33 - 2 rounds, 2.4 hours at 1 us a
# round (docs/dataplane.md, "Packet lifetime").
LIFETIME_GENERATIONS = GENERATIONS - 1
SESSIONS = 1 << 32  # the session field is 32 bits
# Sessions compare as RFC 1982 serial numbers: a session up to SESSIONS/2 - 1 ahead of a
# copy's is newer (it takes the copy over), any other is older (late).
SESSION_HALF = SESSIONS >> 1

DEFAULT_SCALE = 2**16  # 16 fractional bits: resolution 1.5e-5, range +-32768
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

_LANE_STRUCTS = {
    f.name: struct.Struct(f"!{f.lanes}{ {32: 'i', 16: 'h'}[f.lane_bits] }")
    for f in LANE_FORMATS.values()
}


class InaDecodeError(ValueError):
    """Bytes that are not a well-formed INA header + vector."""


@dataclass(frozen=True)
class InaHeader:
    """The 16-byte INA header; field widths as in ``ina_h`` of the P4 program."""

    group_id: int
    agg_index: int
    worker_id: int
    num_workers: int
    version: int = 0
    is_retx: bool = False
    is_result: bool = False
    generation: int = 0
    session: int = 0
    lanes: str = DEFAULT_LANE_FORMAT  # a name of LANE_FORMATS: how the vector is read
    exp: int = 0  # bfp16: the biased block exponent (EXP_BIAS + E, or EXP_BAD); int32: 0
    overflow: bool = False  # bfp16 results: some lane of the sum saturated

    @classmethod
    def at_round(
        cls,
        group_id: int,
        agg_index: int,
        worker_id: int,
        num_workers: int,
        round_number: int,
        *,
        is_retx: bool = False,
        session: int = 0,
        first_generation: int = 0,
        lanes: str = DEFAULT_LANE_FORMAT,
        exp: int = 0,
    ) -> InaHeader:
        """The header of a worker's contribution to round ``round_number`` (0, 1, 2, ...)
        of aggregator ``agg_index`` in ``session``: version and generation from the round
        number, generations counted from the session's ``first_generation``."""
        if round_number < 0:
            raise ValueError(f"round number {round_number} is negative")
        return cls(
            group_id,
            agg_index,
            worker_id,
            num_workers,
            version=round_number & 1,
            is_retx=is_retx,
            generation=(first_generation + (round_number >> 1)) % GENERATIONS,
            session=session,
            lanes=lanes,
            exp=exp,
        )

    @property
    def round_number(self) -> int:
        """The round this header belongs to, counted from generation 0, modulo
        ``ROUND_MODULUS``."""
        return (self.generation << 1) | self.version

    @property
    def flags(self) -> int:
        """The flags byte (version, retransmission, result, lane-format, overflow bits)."""
        return (
            (FLAG_VERSION if self.version else 0)
            | (FLAG_RETX if self.is_retx else 0)
            | (FLAG_RESULT if self.is_result else 0)
            | LANE_FORMATS[self.lanes].flag
            | (FLAG_OVERFLOW if self.overflow else 0)
        )


@dataclass(frozen=True)
class InaMessage:
    """An INA header with its vector: ``LANE_FORMATS[header.lanes].lanes`` signed lanes."""

    header: InaHeader
    values: tuple[int, ...]


def pack(header: InaHeader, values: Sequence[int]) -> bytes:
    """Encode header and values (exactly the lanes of ``header.lanes``, each a signed lane
    value) as UDP payload bytes."""
    fmt = LANE_FORMATS.get(header.lanes)
    if fmt is None:
        raise ValueError(f"unknown lane format {header.lanes!r}")
    if len(values) != fmt.lanes:
        raise ValueError(f"{fmt.name} INA vector needs {fmt.lanes} values, got {len(values)}")
    for name, value, bits in (
        ("group_id", header.group_id, 16),
        ("agg_index", header.agg_index, 16),
        ("worker_id", header.worker_id, 8),
        ("num_workers", header.num_workers, 8),
        ("generation", header.generation, 32),
        ("session", header.session, 32),
        ("exp", header.exp, 8 if fmt.exponent == "packet" else 0),
    ):
        if not 0 <= value < (1 << bits):
            raise ValueError(f"{name}={value} does not fit in {bits} bits")
    if header.version not in (0, 1):
        raise ValueError(f"version must be 0 or 1, got {header.version}")
    if header.overflow and fmt.overflow != "saturate":
        raise ValueError(f"{fmt.name} lanes wrap: they have no overflow flag")
    lo, hi = -(1 << (fmt.lane_bits - 1)), (1 << (fmt.lane_bits - 1)) - 1
    for v in values:
        if not lo <= v <= hi:
            raise ValueError(f"value {v} does not fit a {fmt.lane_bits}-bit lane")
    return HEADER_STRUCT.pack(
        header.group_id,
        header.agg_index,
        header.worker_id,
        header.num_workers,
        header.flags,
        header.exp,
        header.session,
        header.generation,
    ) + _LANE_STRUCTS[fmt.name].pack(*values)


def unpack(payload: bytes) -> InaMessage:
    """Decode UDP payload bytes; raises InaDecodeError when shorter than ``PAYLOAD_LEN``
    or when a reserved bit is set, an int32 packet has an exp byte or a contribution the
    overflow flag (the switch drops such packets too).

    Bytes past ``PAYLOAD_LEN`` are ignored, as the P4 parser ignores them.
    """
    if len(payload) < PAYLOAD_LEN:
        raise InaDecodeError(f"INA payload is {len(payload)} bytes, needs {PAYLOAD_LEN}")
    fields = HEADER_STRUCT.unpack_from(payload, 0)
    group_id, agg_index, worker_id, num_workers, flags, exp, session, generation = fields
    fmt = LANE_FORMATS["bfp16" if flags & FLAG_BFP16 else "int32"]
    if reserved_bits_set(flags, exp):
        raise InaDecodeError(f"INA reserved bits set: flags {flags:#04x}, exp byte {exp:#04x}")
    values = _LANE_STRUCTS[fmt.name].unpack_from(payload, HEADER_LEN)
    header = InaHeader(
        group_id=group_id,
        agg_index=agg_index,
        worker_id=worker_id,
        num_workers=num_workers,
        version=1 if flags & FLAG_VERSION else 0,
        is_retx=bool(flags & FLAG_RETX),
        is_result=bool(flags & FLAG_RESULT),
        generation=generation,
        session=session,
        lanes=fmt.name,
        exp=exp,
        overflow=bool(flags & FLAG_OVERFLOW),
    )
    return InaMessage(header=header, values=values)


def reserved_bits_set(flags: int, exp: int) -> bool:
    """The switch's reserved-bits rule (DROP_RESERVED_BITS): a reserved flag bit, an exp
    byte on an int32 packet, or the overflow flag on anything but a bfp16 result."""
    bfp16 = bool(flags & FLAG_BFP16)
    return bool(
        flags & FLAG_RESERVED
        or (not bfp16 and exp)
        or (flags & FLAG_OVERFLOW and not (bfp16 and flags & FLAG_RESULT))
    )


def to_fixed(x: float, scale: int = DEFAULT_SCALE) -> int:
    """Real -> int32 fixed point: ``round(x * scale)`` saturated to [-2**31, 2**31-1]."""
    if x != x:  # NaN has no fixed-point value
        raise ValueError("cannot convert NaN to fixed point")
    if x == float("inf"):
        return INT32_MAX
    if x == float("-inf"):
        return INT32_MIN
    return max(INT32_MIN, min(INT32_MAX, round(x * scale)))


def from_fixed(v: int, scale: int = DEFAULT_SCALE) -> float:
    """int32 fixed point -> real: ``v / scale``."""
    return v / scale


def to_fixed_vector(xs: Iterable[float], scale: int = DEFAULT_SCALE) -> list[int]:
    """Element-wise ``to_fixed``."""
    return [to_fixed(x, scale) for x in xs]


def from_fixed_vector(vs: Iterable[int], scale: int = DEFAULT_SCALE) -> list[float]:
    """Element-wise ``from_fixed``."""
    return [v / scale for v in vs]


def wrap_int32(v: int) -> int:
    """Two's-complement int32 wrap-around, the switch's addition semantics."""
    return ((v + 2**31) & 0xFFFFFFFF) - 2**31


def ipv4_checksum(header: bytes) -> int:
    """RFC 791 one's-complement checksum of an IPv4 header (checksum field zeroed)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def mac_bytes(mac: str) -> bytes:
    """'aa:bb:cc:dd:ee:ff' -> 6 bytes."""
    parts = mac.split(":")
    if len(parts) != 6:
        raise ValueError(f"bad MAC address {mac!r}")
    return bytes(int(p, 16) for p in parts)


def ip_bytes(ip: str) -> bytes:
    """Dotted quad -> 4 bytes."""
    parts = [int(p) for p in ip.split(".")]
    if len(parts) != 4 or not all(0 <= p <= 255 for p in parts):
        raise ValueError(f"bad IPv4 address {ip!r}")
    return bytes(parts)


def build_frame(
    header: InaHeader,
    values: Sequence[int],
    *,
    src_mac: str = "02:00:00:00:00:01",
    dst_mac: str = "02:00:00:00:00:ff",
    src_ip: str = "10.0.0.1",
    dst_ip: str = "10.0.0.254",
    src_port: int = INA_UDP_PORT,
) -> bytes:
    """A complete Ethernet/IPv4/UDP/INA frame (UDP checksum 0), without scapy."""
    payload = pack(header, values)
    udp = struct.pack("!HHHH", src_port, INA_UDP_PORT, 8 + len(payload), 0)
    ip_hdr = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(udp) + len(payload),
            0,
            0,
            64,
            17,
            0,
            ip_bytes(src_ip),
            ip_bytes(dst_ip),
        )
    )
    struct.pack_into("!H", ip_hdr, 10, ipv4_checksum(bytes(ip_hdr)))
    eth = mac_bytes(dst_mac) + mac_bytes(src_mac) + b"\x08\x00"
    return eth + bytes(ip_hdr) + udp + payload
