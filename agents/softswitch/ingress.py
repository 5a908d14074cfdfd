"""``control InaIngress`` of p4/heroserve_ina.p4 for the executable model
(agents/softswitch/pipeline.py): :class:`InaIngress` (port counters, the INA checks, the slot
protocol of docs/dataplane.md, L2 forwarding) and its tables :class:`AggregationTable`,
:class:`WorkerPort` and :class:`L2Forward`.
"""

from __future__ import annotations

from agents.ina.packet import INA_UDP_PORT, MAX_WORKERS, SESSION_HALF, VECTOR_LEN

from .headers import (
    DROP_BAD_INDEX,
    DROP_BAD_WORKER_ID,
    DROP_FRAGMENT,
    DROP_LANE_FORMAT,
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
    INA_DROP_REASONS,
    INA_EVENTS,
    NUM_PORTS,
    NUM_SLOTS,
    Headers,
    InaH,
    Metadata,
    StandardMetadata,
    mark_to_drop,
)
from .tables import ActionSpec, ExactTable, IndirectCounter, Register

_ALL_ONES = 0xFFFFFFFF
# lane_state bits (per copy): the round's lane format, and whether a bfp16 lane saturated.
STATE_BFP16 = 1
STATE_OVERFLOW = 2


def add_halves(a: int, b: int) -> tuple[int, bool]:
    """Two 32-bit words as pairs of int16 lanes (lane 2i high, 2i+1 low) added with
    saturation, the program's ``AGG16``; and whether a half saturated."""
    out, sat = 0, False
    for shift in (16, 0):
        x = (a >> shift) & 0xFFFF
        y = (b >> shift) & 0xFFFF
        s = (x - 0x10000 if x & 0x8000 else x) + (y - 0x10000 if y & 0x8000 else y)
        if s > 0x7FFF or s < -0x8000:
            sat = True
            s = 0x7FFF if s > 0 else -0x8000
        out |= (s & 0xFFFF) << shift
    return out, sat


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


class InaIngress:
    """``control InaIngress``: port counters, INA checks, aggregation, L2 forwarding."""

    def __init__(self) -> None:
        self.pool = Register("InaIngress.pool", NUM_SLOTS * 64, 32)
        self.contrib_count = Register("InaIngress.contrib_count", NUM_SLOTS * 2, 8)
        self.seen = Register("InaIngress.seen", NUM_SLOTS * 2, 32)
        self.slot_gen = Register("InaIngress.slot_gen", NUM_SLOTS * 2, 32)
        self.slot_tag = Register("InaIngress.slot_tag", NUM_SLOTS * 2, 64)
        self.lane_state = Register("InaIngress.lane_state", NUM_SLOTS * 2, 8)
        self.exp_max = Register("InaIngress.exp_max", NUM_SLOTS * 2, 8)
        self.ina_drops = IndirectCounter("InaIngress.ina_drops", INA_DROP_REASONS, "PACKETS")
        self.ina_events = IndirectCounter("InaIngress.ina_events", INA_EVENTS, "PACKETS")
        self.slot_reclaims = IndirectCounter("InaIngress.slot_reclaims", 1, "PACKETS")
        self.lane_overflows = IndirectCounter("InaIngress.lane_overflows", 1, "PACKETS")
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
            elif (
                ina.reserved != 0
                or (ina.bfp16 == 0 and ina.exp != 0)
                or (ina.overflow == 1 and (ina.bfp16 == 0 or ina.is_result == 0))
            ):
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
        tag = (ina.group_id << 48) | (ina.agg_index << 32) | ina.session

        # Owner (group ++ agg_index) and session of the copy: another owner, or a newer
        # session of this one, takes the copy over; an older session is late.
        held = self.slot_tag.read(copy)
        newer = (ina.session - held) & _ALL_ONES
        reclaimed = held >> 32 != tag >> 32 or 0 < newer < SESSION_HALF
        late = not reclaimed and newer != 0
        if reclaimed:
            self.slot_tag.write(copy, tag)
            self.slot_reclaims.count(0, nbytes)
        # The copy's round: the packet's generation is the copy's (same round), the next
        # one (a new round), or anything else (late: its round's result is gone).
        ahead = (ina.generation - self.slot_gen.read(copy)) & _ALL_ONES
        late = late or (not reclaimed and ahead > 1)
        wbit = (1 << ina.worker_id) & _ALL_ONES
        bitmap = self.seen.read(copy)
        cnt = self.contrib_count.read(copy)
        pool = self.pool.values

        if reclaimed or (not late and ahead == 1):  # a new round on this copy
            self.slot_gen.write(copy, ina.generation)
            bitmap = 0
            cnt = 0
        state = self.lane_state.read(copy)
        if late:
            self._drop(DROP_LATE, std)
        elif bitmap & wbit == 0 and cnt != 0 and (state & STATE_BFP16) != ina.bfp16:
            # Another lane format than the round's first contribution: never added.
            self._drop(DROP_LANE_FORMAT, std)
        elif bitmap & wbit == 0:
            self.seen.write(copy, bitmap | wbit)
            # pool = (pool & keep) + v, keep = 0 on the round's first packet (count 0).
            end = base + VECTOR_LEN
            if cnt == 0:
                state = STATE_BFP16 if ina.bfp16 else 0
                self.exp_max.write(copy, ina.exp)
            elif ina.bfp16:
                sat = False
                for i, (a, b) in enumerate(zip(pool[base:end], values, strict=True)):
                    values[i], s = add_halves(a, b)
                    sat = sat or s
                if sat:
                    state |= STATE_OVERFLOW
                    self.lane_overflows.count(0, nbytes)
                self.exp_max.write(copy, max(self.exp_max.read(copy), ina.exp))
            else:
                values[:] = [
                    (a + b) & _ALL_ONES for a, b in zip(pool[base:end], values, strict=True)
                ]
            self.lane_state.write(copy, state)
            pool[base:end] = values
            cnt = (cnt + 1) & 0xFF
            if cnt == meta.expected:
                self.contrib_count.write(copy, 0)
                self._lane_result(ina, copy, state)
                self._make_result(hdr, meta)
                std.mcast_grp = meta.ina_mcast_grp
                self.ina_events.count(EVT_COMPLETED, nbytes)
            else:
                self.contrib_count.write(copy, cnt)
                self.ina_events.count(EVT_ADDED, nbytes)
                mark_to_drop(std)
        elif cnt == 0:
            values[:] = pool[base : base + VECTOR_LEN]
            self._lane_result(ina, copy, state)
            self._make_result(hdr, meta)
            std.egress_spec = std.ingress_port
            self.ina_events.count(EVT_RETX_ANSWERED, nbytes)
        else:
            self.ina_events.count(EVT_RETX_ABSORBED, nbytes)
            mark_to_drop(std)

    def _lane_result(self, ina: InaH, copy: int, state: int) -> None:
        """``lane_result``: a result carries the round's format, and for bfp16 the agreed
        exponent (the maximum of the proposals) and the overflow flag."""
        ina.bfp16 = state & STATE_BFP16
        ina.exp = self.exp_max.read(copy)  # an int32 round's: its first exp byte, 0
        ina.overflow = 1 if state & STATE_OVERFLOW else 0

    @staticmethod
    def _make_result(hdr: Headers, meta: Metadata) -> None:
        """``make_result``: the result comes from the address and port the workers sent to
        (MACs and IPs swapped, UDP source port ``INA_UDP_PORT``), flagged as a result, UDP
        checksum 0."""
        eth, ip, udp, ina = hdr.eth, hdr.ipv4, hdr.udp, hdr.ina
        assert eth is not None and ip is not None and udp is not None and ina is not None
        eth[0:6], eth[6:12] = eth[6:12], eth[0:6]
        ip[12:16], ip[16:20] = ip[16:20], ip[12:16]
        ina.is_result = 1
        ina.is_retx = 0
        udp[0:2] = INA_UDP_PORT.to_bytes(2, "big")
        udp[6] = 0
        udp[7] = 0
        meta.ina_result = 1
