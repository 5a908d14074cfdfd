"""INA header codec: the wire format of p4/heroserve_ina.p4 (docs/dataplane.md).

An INA packet is Ethernet / IPv4 (no options) / UDP with destination port
``INA_UDP_PORT`` / a 16-byte INA header / ``VECTOR_LEN`` int32 values, all big-endian::

    0      2      4      5      6      7     8         12           16
    | group_id | agg_index | worker | nwork | flags | 0 | session | generation | v[0] ... v[31]

``flags``: bit 7 = version (which shadow copy of the slot), bit 6 = retransmission,
bit 5 = result (set by the switch), bits 4..0 reserved; the byte after it is reserved too
(both must be zero: the switch drops the packet otherwise). ``session`` names the group's
session (one per job start, the same at every member; a later session takes the slots
over, docs/dataplane.md "Sessions"); ``generation`` is the use of the copy. Version and
generation number the uses of one aggregator: round ``r`` of a session travels as
``version = r % 2`` and ``generation = (first_generation + r // 2) % 2**32``
(:meth:`InaHeader.at_round`), which is what makes the switch's aggregation exactly-once
under loss, duplication, reordering and delay (docs/dataplane.md, "Slot protocol").

Values are fixed-point: a real ``x`` travels as ``round(x * scale)`` saturated to int32;
the switch adds them with two's-complement wrap-around, so the sender must pick a scale
for which ``num_workers * max|x| * scale < 2**31``.

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

INA_UDP_PORT = 48879  # 0xBEEF
VECTOR_LEN = 32
VECTOR_BYTES = 4 * VECTOR_LEN  # int32 lanes: 128 bytes
# The lane format the switch's program adds (the cost model's name for it,
# controller/costmodel/netparams.py INA_LANES): a plan priced for another format is refused
# where it would be served (the controller's admission, the export).
LANE_FORMAT = "int32"
HEADER_LEN = 16
PAYLOAD_LEN = HEADER_LEN + VECTOR_BYTES  # 144 bytes after the UDP header
# The header's fields in order: group_id, agg_index, worker_id, num_workers, flags, a reserved
# byte, session, generation.
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
FLAG_RESERVED = 0x1F

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

_VECTOR = struct.Struct(f"!{VECTOR_LEN}i")


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
        )

    @property
    def round_number(self) -> int:
        """The round this header belongs to, counted from generation 0, modulo
        ``ROUND_MODULUS``."""
        return (self.generation << 1) | self.version

    @property
    def flags(self) -> int:
        """The flags byte (version, retransmission and result bits)."""
        return (
            (FLAG_VERSION if self.version else 0)
            | (FLAG_RETX if self.is_retx else 0)
            | (FLAG_RESULT if self.is_result else 0)
        )


@dataclass(frozen=True)
class InaMessage:
    """An INA header with its vector of ``VECTOR_LEN`` int32 fixed-point values."""

    header: InaHeader
    values: tuple[int, ...]


def pack(header: InaHeader, values: Sequence[int]) -> bytes:
    """Encode header and values (int32 each, exactly ``VECTOR_LEN``) as UDP payload bytes."""
    if len(values) != VECTOR_LEN:
        raise ValueError(f"INA vector needs {VECTOR_LEN} values, got {len(values)}")
    for name, value, bits in (
        ("group_id", header.group_id, 16),
        ("agg_index", header.agg_index, 16),
        ("worker_id", header.worker_id, 8),
        ("num_workers", header.num_workers, 8),
        ("generation", header.generation, 32),
        ("session", header.session, 32),
    ):
        if not 0 <= value < (1 << bits):
            raise ValueError(f"{name}={value} does not fit in {bits} bits")
    if header.version not in (0, 1):
        raise ValueError(f"version must be 0 or 1, got {header.version}")
    for v in values:
        if not INT32_MIN <= v <= INT32_MAX:
            raise ValueError(f"value {v} is not an int32 (use to_fixed)")
    return HEADER_STRUCT.pack(
        header.group_id,
        header.agg_index,
        header.worker_id,
        header.num_workers,
        header.flags,
        0,
        header.session,
        header.generation,
    ) + _VECTOR.pack(*values)


def unpack(payload: bytes) -> InaMessage:
    """Decode UDP payload bytes; raises InaDecodeError when shorter than ``PAYLOAD_LEN``
    or when a reserved bit is set (the switch drops such packets too).

    Bytes past ``PAYLOAD_LEN`` are ignored, as the P4 parser ignores them.
    """
    if len(payload) < PAYLOAD_LEN:
        raise InaDecodeError(f"INA payload is {len(payload)} bytes, needs {PAYLOAD_LEN}")
    fields = HEADER_STRUCT.unpack_from(payload, 0)
    group_id, agg_index, worker_id, num_workers, flags, reserved, session, generation = fields
    if flags & FLAG_RESERVED or reserved:
        raise InaDecodeError(
            f"INA reserved bits set: flags {flags & FLAG_RESERVED:#04x}, byte {reserved:#04x}"
        )
    values = _VECTOR.unpack_from(payload, HEADER_LEN)
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
    )
    return InaMessage(header=header, values=values)


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
