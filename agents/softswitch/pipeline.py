"""Executable model of p4/heroserve_ina.p4 (v1model): parser, ingress, PRE, egress,
checksum and deparser, with no sockets: ``InaPipeline.process(port, frame)`` returns the
frames to send as ``[(egress_port, bytes)]``.

Each class is named after the P4 block or table it models and follows its code line by
line (same registers, counters, drop reasons, v1model semantics: egress_spec defaults to
port 0, ``mark_to_drop`` sets it to 511 and clears mcast_grp, a non-zero mcast_grp wins,
an unknown multicast group replicates to nothing). Field values are unsigned as in P4;
vector sums wrap modulo 2**32 (two's-complement int32 on the wire).

One module per part of the P4 program, in its order: ``headers.py`` (constants,
``headers_t``, ``metadata_t``), ``parser.py`` (``InaParser``, ``InaDeparser``),
``ingress.py`` (``InaIngress`` and its tables), ``tables.py`` (the v1model externs and the
packet replication engine), ``egress.py`` (``InaEgress``, ``InaComputeChecksum``); this
module holds :class:`InaPipeline`, the ``V1Switch`` package that runs them.
"""

from __future__ import annotations

import threading

from .egress import InaComputeChecksum, InaEgress
from .headers import DROP_PORT, Metadata, StandardMetadata
from .ingress import InaIngress
from .parser import InaDeparser, InaParser
from .tables import ExactTable, IndirectCounter, PacketReplicationEngine, Register, TableEntry


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
                self.ingress.lane_overflows,
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
                self.ingress.lane_state,
                self.ingress.exp_max,
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
