"""Counters the switch agent polls for telemetry: :class:`PortCounters` (``port_rx`` /
``port_tx``, packets and bytes per port) into link utilisation, and :class:`InaCounters`
(``ina_drops`` / ``ina_events``) as switch counters (docs/design.md §9, §10).

Utilisation of the link behind port p over a window of dt seconds:
``max(rx_bytes delta, tx_bytes delta) / (dt * capacity)``, clipped to [0, 1] (the link is
full duplex, so the busier direction is the one a new flow would contend with).
"""

from __future__ import annotations

import time

import p4runtime_sh.shell as sh
from p4.v1 import p4runtime_pb2
from p4runtime_sh.context import P4Type

from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.switch.p4rt import SwitchConnection
from agents.switch.tables import PortInfo


def _read_counter(conn: SwitchConnection, name: str) -> dict[int, tuple[int, int]]:
    """index -> (packets, bytes) of every cell of counter ``name``."""
    cid = sh.context.get_obj_id(P4Type.counter, name)
    if cid is None:
        raise ValueError(f"P4Info has no counter {name}")
    ent = p4runtime_pb2.Entity()
    ent.counter_entry.counter_id = cid
    return {
        e.counter_entry.index.index: (
            e.counter_entry.data.packet_count,
            e.counter_entry.data.byte_count,
        )
        for e in conn.read(ent)
    }


def link_id(a: str, b: str) -> str:
    return "|".join(sorted((a, b)))


class PortCounters:
    """``port_rx`` / ``port_tx``: per-port totals and the utilisation since last poll."""

    def __init__(self, conn: SwitchConnection, switch: str, ports: dict[int, PortInfo]) -> None:
        self.conn = conn
        self.switch = switch
        self.ports = ports
        self._last: tuple[float, dict[int, tuple[int, int, int, int]]] | None = None

    def poll(self, report: pb.TelemetryReport) -> None:
        now = time.monotonic()
        rx = _read_counter(self.conn, "port_rx")
        tx = _read_counter(self.conn, "port_tx")
        sample = {
            p: (*rx.get(p, (0, 0)), *tx.get(p, (0, 0))) for p in sorted(self.ports)
        }  # (rx_pkts, rx_bytes, tx_pkts, tx_bytes)
        for p, (rp, rb, tp, tb) in sample.items():
            report.ports.add(port=p, rx_bytes=rb, tx_bytes=tb, rx_packets=rp, tx_packets=tp)
        if self._last is not None:
            t0, old = self._last
            dt = now - t0
            report.window_s = dt
            for p, info in self.ports.items():
                if not info.peer or p not in old or dt <= 0:
                    continue
                d_rx = max(0, sample[p][1] - old[p][1])
                d_tx = max(0, sample[p][3] - old[p][3])
                rate = max(d_rx, d_tx) / dt
                util = min(1.0, rate / info.capacity) if info.capacity > 0 else 0.0
                report.links.add(
                    link_id=link_id(self.switch, info.peer), utilisation=util, bytes_per_s=rate
                )
        self._last = (now, sample)


class InaCounters:
    """``ina_drops`` (drop reasons) and ``ina_events``: the non-zero cells."""

    NAMES = ("ina_drops", "ina_events")

    def __init__(self, conn: SwitchConnection) -> None:
        self.conn = conn

    def poll(self, report: pb.TelemetryReport) -> None:
        for name in self.NAMES:
            for i, (pk, by) in sorted(_read_counter(self.conn, name).items()):
                if pk or by:
                    report.counters.add(name=name, index=i, packets=pk, bytes=by)
