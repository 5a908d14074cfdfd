"""Executable model of p4/heroserve_ina.p4 (v1model): parser, ingress, PRE, egress,
checksum and deparser, with no sockets: ``InaPipeline.process(port, frame)`` returns the
frames to send as ``[(egress_port, bytes)]``.

Each class is named after the P4 block or table it models and follows its code line by
line (same registers, counters, drop reasons, v1model semantics: egress_spec defaults to
port 0, ``mark_to_drop`` sets it to 511 and clears mcast_grp, a non-zero mcast_grp wins,
an unknown multicast group replicates to nothing). Field values are unsigned as in P4;
vector sums wrap modulo 2**32 (two's-complement int32 on the wire).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field

from agents.ina.packet import (
    HEADER_LEN,
    HEADER_STRUCT,
    INA_UDP_PORT,
    LATE_WINDOW,
    MAX_WORKERS,
    VECTOR_BYTES,
    VECTOR_LEN,
    ipv4_checksum,
)

from .tables import (
    ActionSpec,
    ExactTable,
    IndirectCounter,
    PacketReplicationEngine,
    Register,
    TableEntry,
)

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

_ETH_LEN = 14
_IPV4_LEN = 20
_UDP_LEN = 8
_DATA = struct.Struct(f"!{VECTOR_LEN}I")  # the lanes as P4 reads them: unsigned bit<32>
_ALL_ONES = 0xFFFFFFFF


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
    """``ina_h`` fields (flags byte split as in P4: version, is_retx, is_result, reserved;
    then the copy's generation)."""

    group_id: int
    agg_index: int
    worker_id: int
    num_workers: int
    version: int
    is_retx: int
    is_result: int
    reserved: int
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
            self.reserved,
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


class InaParser:
    """``parser InaParser``: Ethernet -> IPv4 (ihl 5, fragment offset 0, UDP) -> UDP -> INA."""

    @staticmethod
    def parse(frame: bytes) -> Headers | None:
        """Headers of ``frame``; None when shorter than Ethernet (no NIC delivers that)."""
        h = Headers()
        n = len(frame)
        if n < _ETH_LEN:
            return None
        h.eth = bytearray(frame[:_ETH_LEN])
        off = _ETH_LEN
        if frame[12] == 0x08 and frame[13] == 0x00 and n >= off + _IPV4_LEN:
            h.ipv4 = bytearray(frame[off : off + _IPV4_LEN])
            off += _IPV4_LEN
            ip = h.ipv4
            ihl = ip[0] & 0x0F
            frag_offset = ((ip[6] & 0x1F) << 8) | ip[7]
            if ihl == 5 and frag_offset == 0 and ip[9] == 17 and n >= off + _UDP_LEN:
                h.udp = bytearray(frame[off : off + _UDP_LEN])
                off += _UDP_LEN
                if (h.udp[2] << 8 | h.udp[3]) == INA_UDP_PORT and n >= off + HEADER_LEN:
                    g, a, w, nw, flags, gen = HEADER_STRUCT.unpack_from(frame, off)
                    h.ina = InaH(
                        g, a, w, nw, flags >> 7, (flags >> 6) & 1, (flags >> 5) & 1, flags & 31, gen
                    )
                    off += HEADER_LEN
                    if n >= off + VECTOR_BYTES:
                        h.ina_data = list(_DATA.unpack_from(frame, off))
                        off += VECTOR_BYTES
        h.payload = frame[off:]
        return h


class AggregationTable(ExactTable):
    """``aggregation_table``: (group_id, agg_index) -> set_slot(slot, num_workers, mcast_grp)."""

    NAME = "InaIngress.aggregation_table"
    KEY = (("group_id", 16), ("agg_index", 16))
    ACTIONS = (
        ActionSpec("InaIngress.set_slot", (("slot", 16), ("num_workers", 8), ("mcast_grp", 16))),
        ActionSpec("NoAction", (), default_only=True),
    )
    DEFAULT_ACTION = "NoAction"
    CONST_DEFAULT = True
    SIZE = 4096


class WorkerPort(ExactTable):
    """``worker_port``: (group_id, worker_id) -> set_worker_port(port), the one ingress port
    each worker of a group aggregated here may send from."""

    NAME = "InaIngress.worker_port"
    KEY = (("group_id", 16), ("worker_id", 8))
    ACTIONS = (
        ActionSpec("InaIngress.set_worker_port", (("port", 9),)),
        ActionSpec("NoAction", (), default_only=True),
    )
    DEFAULT_ACTION = "NoAction"
    CONST_DEFAULT = True
    SIZE = 4096


class L2Forward(ExactTable):
    """``l2_forward``: dst MAC -> forward(port) | l2_multicast(mcast_grp) | drop (default)."""

    NAME = "InaIngress.l2_forward"
    KEY = (("dst_addr", 48),)
    ACTIONS = (
        ActionSpec("InaIngress.forward", (("port", 9),)),
        ActionSpec("InaIngress.l2_multicast", (("mcast_grp", 16),)),
        ActionSpec("InaIngress.drop", ()),
    )
    DEFAULT_ACTION = "InaIngress.drop"
    CONST_DEFAULT = False
    SIZE = 1024


class ResultRewrite(ExactTable):
    """``result_rewrite`` (egress): egress_port -> set_result_dst(dmac, dip)."""

    NAME = "InaEgress.result_rewrite"
    KEY = (("egress_port", 9),)
    ACTIONS = (
        ActionSpec("InaEgress.set_result_dst", (("dmac", 48), ("dip", 32))),
        ActionSpec("NoAction", (), default_only=True),
    )
    DEFAULT_ACTION = "NoAction"
    CONST_DEFAULT = True
    SIZE = 512


class InaIngress:
    """``control InaIngress``: port counters, INA checks, aggregation, L2 forwarding."""

    def __init__(self) -> None:
        self.pool = Register("InaIngress.pool", NUM_SLOTS * 64, 32)
        self.contrib_count = Register("InaIngress.contrib_count", NUM_SLOTS * 2, 8)
        self.seen = Register("InaIngress.seen", NUM_SLOTS * 2, 32)
        self.slot_gen = Register("InaIngress.slot_gen", NUM_SLOTS * 2, 8)
        self.slot_tag = Register("InaIngress.slot_tag", NUM_SLOTS * 2, 32)
        self.ina_drops = IndirectCounter("InaIngress.ina_drops", INA_DROP_REASONS, "PACKETS")
        self.ina_events = IndirectCounter("InaIngress.ina_events", INA_EVENTS, "PACKETS")
        self.slot_reclaims = IndirectCounter("InaIngress.slot_reclaims", 1, "PACKETS")
        self.port_rx = IndirectCounter("InaIngress.port_rx", NUM_PORTS, "BOTH")
        self.aggregation_table = AggregationTable()
        self.worker_port = WorkerPort()
        self.l2_forward = L2Forward()

    def _drop(self, reason: int, std: StandardMetadata) -> None:
        self.ina_drops.count(reason, std.packet_length)
        mark_to_drop(std)

    def apply(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
        nbytes = std.packet_length
        self.port_rx.count(std.ingress_port, nbytes)
        meta.do_l2 = 1
        ina = hdr.ina
        udp = hdr.udp
        if udp is not None and (udp[2] << 8 | udp[3]) == INA_UDP_PORT:
            meta.do_l2 = 0
            assert hdr.ipv4 is not None
            if hdr.ipv4[6] & 0x20:  # More-Fragments (flags are the top 3 bits of byte 6)
                self._drop(DROP_FRAGMENT, std)
            elif ina is None or hdr.ina_data is None:
                self._drop(DROP_SHORT_HEADER, std)
            elif ina.reserved != 0:
                self._drop(DROP_RESERVED_BITS, std)
            elif ina.is_result == 1:
                meta.do_l2 = 1  # a result from another switch: plain L2 traffic
            elif ina.worker_id >= ina.num_workers or ina.num_workers > MAX_WORKERS:
                self._drop(DROP_BAD_WORKER_ID, std)
            else:
                self._contribution(hdr, ina, meta, std)

        if meta.do_l2 == 1:
            hit = self._l2_forward(hdr, meta, std)
            if hit:
                if meta.ina_miss == 1:
                    self.ina_events.count(EVT_TRANSIT, nbytes)
            elif meta.ina_miss == 1:
                self.ina_drops.count(DROP_NO_ENTRY, nbytes)

    def _contribution(self, hdr: Headers, ina: InaH, meta: Metadata, std: StandardMetadata) -> None:
        """Table checks of a well-formed contribution, then the slot protocol."""
        entry = self.aggregation_table.lookup((ina.group_id, ina.agg_index))
        if entry is not None:  # set_slot
            p = entry.params
            meta.slot = p["slot"]
            meta.expected = p["num_workers"]
            meta.ina_mcast_grp = p["mcast_grp"]
        binding = self.worker_port.lookup((ina.group_id, ina.worker_id))
        if binding is not None:  # set_worker_port
            meta.worker_port = binding.params["port"]
        if entry is None and binding is None:
            meta.do_l2 = 1
            meta.ina_miss = 1
        elif binding is None or meta.worker_port != std.ingress_port:
            self._drop(DROP_WRONG_PORT, std)
        elif entry is None:
            self._drop(DROP_BAD_INDEX, std)
        elif meta.expected != ina.num_workers:
            self._drop(DROP_WORKER_MISMATCH, std)
        elif meta.slot >= NUM_SLOTS:
            self._drop(DROP_SLOT_OUT_OF_RANGE, std)
        else:
            self._aggregate(hdr, meta, std)

    def _l2_forward(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> bool:
        """Apply ``l2_forward``; True on a hit."""
        assert hdr.eth is not None
        entry = self.l2_forward.lookup((int.from_bytes(hdr.eth[0:6], "big"),))
        hit = entry is not None
        if entry is None:
            entry = self.l2_forward.default
        if entry.action == "InaIngress.forward":
            std.egress_spec = entry.params["port"]
        elif entry.action == "InaIngress.l2_multicast":
            std.mcast_grp = entry.params["mcast_grp"]
            meta.l2_flood = 1
        else:  # InaIngress.drop
            mark_to_drop(std)
        return hit

    def _aggregate(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
        """The slot protocol of the P4 apply block (docs/dataplane.md, "Slot protocol")."""
        ina = hdr.ina
        values = hdr.ina_data
        assert ina is not None and values is not None
        nbytes = std.packet_length
        copy = (meta.slot << 1) | ina.version
        base = copy << 5
        tag = (ina.group_id << 16) | ina.agg_index

        reclaimed = False
        if self.slot_tag.read(copy) != tag:  # the copy has a new owner
            self.slot_tag.write(copy, tag)
            self.slot_reclaims.count(0, nbytes)
            reclaimed = True
        ahead = (ina.generation - self.slot_gen.read(copy)) & 0xFF
        wbit = (1 << ina.worker_id) & _ALL_ONES
        bitmap = self.seen.read(copy)
        cnt = self.contrib_count.read(copy)
        pool = self.pool.values

        if reclaimed or 0 < ahead < LATE_WINDOW:  # a new round on this copy
            self.slot_gen.write(copy, ina.generation)
            bitmap = 0
            cnt = 0
        if not reclaimed and ahead >= LATE_WINDOW:
            self._drop(DROP_LATE, std)
        elif bitmap & wbit == 0:
            self.seen.write(copy, bitmap | wbit)
            # pool = (pool & keep) + v, keep = 0 on the round's first packet (count 0).
            if cnt != 0:
                end = base + VECTOR_LEN
                values[:] = [
                    (a + b) & _ALL_ONES for a, b in zip(pool[base:end], values, strict=True)
                ]
            pool[base : base + VECTOR_LEN] = values
            cnt = (cnt + 1) & 0xFF
            if cnt == meta.expected:
                self.contrib_count.write(copy, 0)
                self._make_result(hdr, meta)
                std.mcast_grp = meta.ina_mcast_grp
                self.ina_events.count(EVT_COMPLETED, nbytes)
            else:
                self.contrib_count.write(copy, cnt)
                self.ina_events.count(EVT_ADDED, nbytes)
                mark_to_drop(std)
        elif cnt == 0:
            values[:] = pool[base : base + VECTOR_LEN]
            self._make_result(hdr, meta)
            std.egress_spec = std.ingress_port
            self.ina_events.count(EVT_RETX_ANSWERED, nbytes)
        else:
            self.ina_events.count(EVT_RETX_ABSORBED, nbytes)
            mark_to_drop(std)

    @staticmethod
    def _make_result(hdr: Headers, meta: Metadata) -> None:
        """``make_result``: the result comes from the address the workers sent to (MACs
        and IPs swapped), flagged as a result, UDP checksum 0."""
        eth, ip, udp, ina = hdr.eth, hdr.ipv4, hdr.udp, hdr.ina
        assert eth is not None and ip is not None and udp is not None and ina is not None
        eth[0:6], eth[6:12] = eth[6:12], eth[0:6]
        ip[12:16], ip[16:20] = ip[16:20], ip[12:16]
        ina.is_result = 1
        ina.is_retx = 0
        udp[6] = 0
        udp[7] = 0
        meta.ina_result = 1


class InaEgress:
    """``control InaEgress``: no hairpin for floods, result_rewrite, port_tx."""

    def __init__(self) -> None:
        self.port_tx = IndirectCounter("InaEgress.port_tx", NUM_PORTS, "BOTH")
        self.result_rewrite = ResultRewrite()

    def apply(self, hdr: Headers, meta: Metadata, std: StandardMetadata) -> None:
        if meta.l2_flood == 1 and std.egress_port == std.ingress_port:
            mark_to_drop(std)
            return
        if meta.ina_result == 1:
            entry = self.result_rewrite.lookup((std.egress_port,))
            if entry is not None:  # set_result_dst; the miss runs NoAction
                assert hdr.eth is not None and hdr.ipv4 is not None
                hdr.eth[0:6] = entry.params["dmac"].to_bytes(6, "big")
                hdr.ipv4[16:20] = entry.params["dip"].to_bytes(4, "big")
        self.port_tx.count(std.egress_port, std.packet_length)


class InaComputeChecksum:
    """``control InaComputeChecksum``: IPv4 checksum of results this switch produced."""

    @staticmethod
    def apply(hdr: Headers, meta: Metadata) -> None:
        if hdr.ina is not None and hdr.ina.is_result == 1 and meta.ina_result == 1:
            ip = hdr.ipv4
            assert ip is not None
            ip[10] = 0
            ip[11] = 0
            c = ipv4_checksum(bytes(ip))
            ip[10] = c >> 8
            ip[11] = c & 0xFF


class InaDeparser:
    """``control InaDeparser``: emit the valid headers, then the unparsed payload."""

    @staticmethod
    def emit(hdr: Headers) -> bytes:
        parts: list[bytes] = []
        if hdr.eth is not None:
            parts.append(bytes(hdr.eth))
        if hdr.ipv4 is not None:
            parts.append(bytes(hdr.ipv4))
        if hdr.udp is not None:
            parts.append(bytes(hdr.udp))
        if hdr.ina is not None:
            i = hdr.ina
            flags = (i.version << 7) | (i.is_retx << 6) | (i.is_result << 5) | i.reserved
            parts.append(
                HEADER_STRUCT.pack(
                    i.group_id, i.agg_index, i.worker_id, i.num_workers, flags, i.generation
                )
            )
        if hdr.ina_data is not None:
            parts.append(_DATA.pack(*hdr.ina_data))
        parts.append(hdr.payload)
        return b"".join(parts)


class InaPipeline:
    """The whole v1model switch: ``process(ingress_port, frame) -> [(egress_port, frame)]``.

    ``lock`` serialises packet processing against control-plane writes (the P4Runtime
    server takes it too), as BMv2 applies a table update between two packets.
    """

    def __init__(self) -> None:
        self.parser = InaParser()
        self.ingress = InaIngress()
        self.pre = PacketReplicationEngine()
        self.egress = InaEgress()
        self.checksum = InaComputeChecksum()
        self.deparser = InaDeparser()
        self.lock = threading.RLock()
        self.tables: dict[str, ExactTable] = {
            t.NAME: t
            for t in (
                self.ingress.aggregation_table,
                self.ingress.worker_port,
                self.ingress.l2_forward,
                self.egress.result_rewrite,
            )
        }
        self.counters: dict[str, IndirectCounter] = {
            c.name: c
            for c in (
                self.ingress.ina_drops,
                self.ingress.ina_events,
                self.ingress.slot_reclaims,
                self.ingress.port_rx,
                self.egress.port_tx,
            )
        }
        self.registers: dict[str, Register] = {
            r.name: r
            for r in (
                self.ingress.pool,
                self.ingress.contrib_count,
                self.ingress.seen,
                self.ingress.slot_gen,
                self.ingress.slot_tag,
            )
        }

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run one frame through the switch; the frames it sends, in replica order."""
        with self.lock:
            return self._process(ingress_port, frame)

    def _process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        hdr = self.parser.parse(frame)
        if hdr is None:
            return []
        std = StandardMetadata(ingress_port=ingress_port, packet_length=len(frame))
        meta = Metadata()
        self.ingress.apply(hdr, meta, std)
        if std.mcast_grp != 0:
            replicas = self.pre.replicas(std.mcast_grp)
        elif std.egress_spec == DROP_PORT:
            return []
        else:
            replicas = [(std.egress_spec, 0)]
        out: list[tuple[int, bytes]] = []
        last = len(replicas) - 1
        for n, (port, rid) in enumerate(replicas):
            h = hdr if n == last else hdr.copy()
            m = Metadata(
                meta.slot,
                meta.expected,
                meta.ina_mcast_grp,
                meta.worker_port,
                meta.ina_miss,
                meta.do_l2,
                meta.ina_result,
                meta.l2_flood,
            )
            estd = StandardMetadata(
                ingress_port=ingress_port,
                packet_length=len(frame),
                egress_spec=port,
                egress_port=port,
                egress_rid=rid,
            )
            self.egress.apply(h, m, estd)
            if estd.dropped:
                continue
            self.checksum.apply(h, m)
            out.append((port, self.deparser.emit(h)))
        return out

    def add_l2(self, mac: int, port: int) -> None:
        """Convenience for tests and benchmarks: l2_forward dst MAC -> forward(port)."""
        with self.lock:
            self.ingress.l2_forward.insert(TableEntry((mac,), "InaIngress.forward", {"port": port}))

    def add_group(self, group_id: int, agg_index: int, slot: int, workers: int, mcast: int) -> None:
        """Convenience: aggregation_table (group_id, agg_index) -> set_slot(...)."""
        with self.lock:
            self.ingress.aggregation_table.insert(
                TableEntry(
                    (group_id, agg_index),
                    "InaIngress.set_slot",
                    {"slot": slot, "num_workers": workers, "mcast_grp": mcast},
                )
            )

    def bind_worker(self, group_id: int, worker_id: int, port: int) -> None:
        """Convenience: worker_port (group_id, worker_id) -> set_worker_port(port)."""
        with self.lock:
            self.ingress.worker_port.insert(
                TableEntry((group_id, worker_id), "InaIngress.set_worker_port", {"port": port})
            )
