"""The declarations of p4/heroserve_ina.p4 that its control blocks share, for the executable
model (agents/softswitch/pipeline.py): the program's constants (port and slot counts, the
``ina_drops`` reasons DROP_*, the ``ina_events`` EVT_*), ``headers_t`` (:class:`Headers`),
``ina_h`` (:class:`InaH`), ``metadata_t`` (:class:`Metadata`), and the v1model parts the
program uses (:class:`StandardMetadata`, :func:`mark_to_drop`).

The wire constants (UDP port, vector length, header layout, worker limit, late window) are
the wire format's, in agents/ina/packet.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DROP_PORT = 511
NUM_PORTS = 512
NUM_SLOTS = 1024

# ina_drops indices (the P4 program's DROP_* constants).
DROP_SHORT_HEADER = 0
DROP_BAD_WORKER_ID = 1
DROP_WORKER_MISMATCH = 2
DROP_NO_ENTRY = 3
DROP_SLOT_OUT_OF_RANGE = 4
DROP_RESERVED_BITS = 5
DROP_WRONG_PORT = 6
DROP_BAD_INDEX = 7
DROP_FRAGMENT = 8
DROP_LATE = 9
DROP_LANE_FORMAT = 10
INA_DROP_REASONS = 16
DROP_REASON_NAMES = {
    DROP_SHORT_HEADER: "short_header",
    DROP_BAD_WORKER_ID: "bad_worker_id",
    DROP_WORKER_MISMATCH: "worker_count_mismatch",
    DROP_NO_ENTRY: "no_entry",
    DROP_SLOT_OUT_OF_RANGE: "slot_out_of_range",
    DROP_RESERVED_BITS: "reserved_bits",
    DROP_WRONG_PORT: "wrong_port",
    DROP_BAD_INDEX: "agg_index_out_of_range",
    DROP_FRAGMENT: "fragment",
    DROP_LATE: "late",
    DROP_LANE_FORMAT: "lane_format",
}

# ina_events indices (EVT_*): one per packet that passed the checks.
EVT_ADDED = 0
EVT_COMPLETED = 1
EVT_RETX_ANSWERED = 2
EVT_RETX_ABSORBED = 3
EVT_TRANSIT = 4
INA_EVENTS = 8
EVENT_NAMES = {
    EVT_ADDED: "added",
    EVT_COMPLETED: "completed",
    EVT_RETX_ANSWERED: "retx_answered",
    EVT_RETX_ABSORBED: "retx_absorbed",
    EVT_TRANSIT: "transit",
}


class Headers:
    """``headers_t``: each header's fields, or None when the header is invalid."""

    __slots__ = ("eth", "ipv4", "udp", "ina", "ina_data", "payload")

    def __init__(self) -> None:
        self.eth: bytearray | None = None  # 14 bytes: dst, src, ether_type
        self.ipv4: bytearray | None = None  # 20 bytes, fields read in place
        self.udp: bytearray | None = None  # 8 bytes
        self.ina: InaH | None = None
        self.ina_data: list[int] | None = None  # VECTOR_LEN unsigned 32-bit values
        self.payload: bytes = b""  # what the parser did not extract

    def copy(self) -> Headers:
        h = Headers()
        h.eth = bytearray(self.eth) if self.eth is not None else None
        h.ipv4 = bytearray(self.ipv4) if self.ipv4 is not None else None
        h.udp = bytearray(self.udp) if self.udp is not None else None
        h.ina = self.ina.copy() if self.ina is not None else None
        h.ina_data = list(self.ina_data) if self.ina_data is not None else None
        h.payload = self.payload
        return h


@dataclass(slots=True)
class InaH:
    """``ina_h`` fields (flags byte split as in P4: version, is_retx, is_result, bfp16,
    overflow, reserved; then the exp byte, the session and the copy's generation)."""

    group_id: int
    agg_index: int
    worker_id: int
    num_workers: int
    version: int
    is_retx: int
    is_result: int
    bfp16: int
    overflow: int
    reserved: int
    exp: int
    session: int
    generation: int

    def copy(self) -> InaH:
        return InaH(
            self.group_id,
            self.agg_index,
            self.worker_id,
            self.num_workers,
            self.version,
            self.is_retx,
            self.is_result,
            self.bfp16,
            self.overflow,
            self.reserved,
            self.exp,
            self.session,
            self.generation,
        )


@dataclass(slots=True)
class Metadata:
    """``metadata_t`` (the fields the control blocks share)."""

    slot: int = 0
    expected: int = 0
    ina_mcast_grp: int = 0
    worker_port: int = 0
    ina_miss: int = 0
    do_l2: int = 0
    ina_result: int = 0
    l2_flood: int = 0


@dataclass(slots=True)
class StandardMetadata:
    """The v1model ``standard_metadata_t`` fields this program uses."""

    ingress_port: int
    packet_length: int
    egress_spec: int = 0
    egress_port: int = 0
    egress_rid: int = 0
    mcast_grp: int = 0
    dropped: bool = field(default=False)


def mark_to_drop(std: StandardMetadata) -> None:
    """v1model ``mark_to_drop``: egress_spec = drop port, mcast_grp = 0."""
    std.egress_spec = DROP_PORT
    std.mcast_grp = 0
    std.dropped = True
