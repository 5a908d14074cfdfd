"""One class per P4 table / PRE object the switch agent programs, named after it (SwitchML
style): :class:`AggregationTable` (``InaIngress.aggregation_table``), :class:`WorkerPort`
(``InaIngress.worker_port``), :class:`L2Forward` (``InaIngress.l2_forward``),
:class:`ResultRewrite` (``InaEgress.result_rewrite``) and :class:`MulticastGroups` (the
packet replication engine).

Each computes its desired entries from the controller's INA assignments and the switch's
port map, reads the switch's entries back, and reconciles: delete what is stale, modify
what differs, insert what is missing (docs/design.md §10). Entries are compared as plain
tuples of integers, so a read-back equals what was written.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import p4runtime_sh.shell as sh
from p4.v1 import p4runtime_pb2
from p4runtime_sh.context import P4Type

from agents.switch.p4rt import DELETE, INSERT, MODIFY, SwitchConnection, update

log = logging.getLogger("heroserve.switch")

Key = tuple[int, ...]
Value = tuple[str, tuple[int, ...]]  # (action alias, params in P4Info order)


@dataclass(frozen=True)
class PortInfo:
    """A switch port and what is at its other end (``--port`` of the agent)."""

    port: int
    peer: str
    mac: str = ""
    ipv4: str = ""
    capacity: float = 0.0  # bytes/s


def mac_int(mac: str) -> int:
    parts = mac.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ValueError(f"{mac!r} is not a MAC address")
    return int("".join(parts), 16)


def ipv4_int(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


@dataclass
class Diff:
    inserted: int = 0
    modified: int = 0
    deleted: int = 0

    def __iadd__(self, o: Diff) -> Diff:
        self.inserted += o.inserted
        self.modified += o.modified
        self.deleted += o.deleted
        return self


class _Table:
    """A P4 table with exact keys, reconciled against desired entries."""

    name = ""  # P4Info alias

    def __init__(self, conn: SwitchConnection) -> None:
        self.conn = conn
        info = sh.context.get_obj(P4Type.table, self.name)
        if info is None:
            raise ValueError(f"P4Info has no table {self.name}")
        self.table_id = info.preamble.id
        self.fields = [mf.name for mf in sorted(info.match_fields, key=lambda m: m.id)]
        self.field_ids = [mf.id for mf in sorted(info.match_fields, key=lambda m: m.id)]
        self.actions: dict[int, tuple[str, list[int], list[str]]] = {}
        for ref in info.action_refs:
            a = sh.context.p4info_obj_map_by_id[ref.id]
            params = sorted(a.params, key=lambda p: p.id)
            self.actions[ref.id] = (
                a.preamble.alias,
                [p.id for p in params],
                [p.name for p in params],
            )

    def entry(self, key: Key, value: Value) -> p4runtime_pb2.TableEntry:
        action, params = value
        te = sh.TableEntry(self.name)(action=action)
        for f, v in zip(self.fields, key, strict=True):
            te.match[f] = str(v)
        aid = sh.context.get_obj_id(P4Type.action, action)
        for pname, v in zip(self.actions[aid][2], params, strict=True):
            te.action[pname] = str(v)
        return te.msg()

    def read(self) -> dict[Key, Value]:
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = self.table_id
        out: dict[Key, Value] = {}
        for e in self.conn.read(ent):
            te = e.table_entry
            if te.is_default_action:
                continue
            by_id = {m.field_id: int.from_bytes(m.exact.value, "big") for m in te.match}
            key = tuple(by_id.get(f, 0) for f in self.field_ids)
            act = te.action.action
            alias, pids, _ = self.actions.get(act.action_id, (str(act.action_id), [], []))
            pv = {p.param_id: int.from_bytes(p.value, "big") for p in act.params}
            out[key] = (alias, tuple(pv.get(p, 0) for p in pids))
        return out

    def reconcile(self, desired: dict[Key, Value]) -> Diff:
        """Make the switch hold exactly ``desired``."""
        current = self.read()
        d = Diff()
        ups: list[p4runtime_pb2.Update] = []
        for k in sorted(set(current) - set(desired)):
            ups.append(update(DELETE, table_entry=self.entry(k, current[k])))
            d.deleted += 1
        for k in sorted(desired):
            if k not in current:
                ups.append(update(INSERT, table_entry=self.entry(k, desired[k])))
                d.inserted += 1
            elif current[k] != desired[k]:
                ups.append(update(MODIFY, table_entry=self.entry(k, desired[k])))
                d.modified += 1
        self.conn.write(ups)
        if ups:
            log.info("%s: +%d ~%d -%d", self.name, d.inserted, d.modified, d.deleted)
        return d


class AggregationTable(_Table):
    """``(group_id, agg_index) -> set_slot(slot, num_workers, mcast_grp)``: one entry per
    aggregator index of every INA group the controller assigned to this switch."""

    name = "aggregation_table"

    @staticmethod
    def desired(assignments: Iterable) -> dict[Key, Value]:  # InaAssignment messages
        out: dict[Key, Value] = {}
        for a in assignments:
            for i in range(a.slots.count):
                out[(a.group_id, i)] = (
                    "set_slot",
                    (a.slots.start + i, a.worker_count, a.multicast_group_id),
                )
        return out


class WorkerPort(_Table):
    """``(group_id, worker_id) -> set_worker_port(port)``: the one port each worker of a
    group aggregated here may send from (a packet claiming the id from another port is
    dropped). A member whose port the switch's inventory does not know gets no entry, so
    its packets are refused until the controller knows the port."""

    name = "worker_port"

    @staticmethod
    def desired(assignments: Iterable) -> dict[Key, Value]:  # InaAssignment messages
        out: dict[Key, Value] = {}
        for a in assignments:
            for m in a.members:
                if m.port_known:
                    out[(a.group_id, m.worker_id)] = ("set_worker_port", (m.port,))
        return out


class ResultRewrite(_Table):
    """``egress_port -> set_result_dst(dmac, dip)``: each replica of a result reaches its
    worker's socket. From the members' addresses (controller) or the port map."""

    name = "result_rewrite"

    @staticmethod
    def desired(assignments: Iterable, ports: dict[int, PortInfo]) -> dict[Key, Value]:
        out: dict[Key, Value] = {}
        for a in assignments:
            for m in a.members:
                if not m.port_known:
                    continue
                p = ports.get(m.port)
                mac = m.mac or (p.mac if p else "")
                ip = m.ipv4 or (p.ipv4 if p else "")
                if mac and ip:
                    out[(m.port,)] = ("set_result_dst", (mac_int(mac), ipv4_int(ip)))
        return out


class L2Forward(_Table):
    """``dst_addr -> forward(port)`` for every host MAC in the port map (plain L2 for
    traffic that is not aggregated here)."""

    name = "l2_forward"

    @staticmethod
    def desired(ports: dict[int, PortInfo]) -> dict[Key, Value]:
        return {(mac_int(p.mac),): ("forward", (p.port,)) for p in ports.values() if p.mac}


def replica_port(r: p4runtime_pb2.Replica) -> int:
    """A replica's port: the ``port`` bytestring of P4Runtime 1.4 and later, else the
    deprecated ``egress_port`` an older server (or an older writer) used."""
    if r.WhichOneof("port_kind") == "port":
        return int.from_bytes(r.port, "big")
    return r.egress_port


class MulticastGroups:
    """Packet replication engine: group ``multicast_group_id`` -> the members' ports."""

    def __init__(self, conn: SwitchConnection) -> None:
        self.conn = conn

    @staticmethod
    def desired(assignments: Iterable) -> dict[int, tuple[int, ...]]:
        out: dict[int, tuple[int, ...]] = {}
        for a in assignments:
            ports = sorted({m.port for m in a.members if m.port_known})
            if ports:
                out[a.multicast_group_id] = tuple(ports)
        return out

    def read(self) -> dict[int, tuple[int, ...]]:
        ent = p4runtime_pb2.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        out: dict[int, tuple[int, ...]] = {}
        for e in self.conn.read(ent):
            g = e.packet_replication_engine_entry.multicast_group_entry
            out[g.multicast_group_id] = tuple(sorted(replica_port(r) for r in g.replicas))
        return out

    def _msg(self, gid: int, ports: tuple[int, ...]) -> p4runtime_pb2.PacketReplicationEngineEntry:
        pre = p4runtime_pb2.PacketReplicationEngineEntry()
        pre.multicast_group_entry.multicast_group_id = gid
        for p in ports:
            r = pre.multicast_group_entry.replicas.add(instance=0)
            if self.conn.replica_port_bytes:
                r.port = p.to_bytes(max(1, (p.bit_length() + 7) // 8), "big")
            else:
                r.egress_port = p
        return pre

    def reconcile(self, desired: dict[int, tuple[int, ...]], stage: str) -> Diff:
        """``stage="add"``: insert and modify (before table entries point at groups);
        ``stage="remove"``: delete stale groups (after the entries are gone)."""
        current = self.read()
        d = Diff()
        ups: list[p4runtime_pb2.Update] = []
        if stage == "add":
            for gid in sorted(desired):
                if gid not in current:
                    ups.append(
                        update(INSERT, packet_replication_engine_entry=self._msg(gid, desired[gid]))
                    )
                    d.inserted += 1
                elif current[gid] != desired[gid]:
                    ups.append(
                        update(MODIFY, packet_replication_engine_entry=self._msg(gid, desired[gid]))
                    )
                    d.modified += 1
        else:
            for gid in sorted(set(current) - set(desired)):
                ups.append(
                    update(DELETE, packet_replication_engine_entry=self._msg(gid, current[gid]))
                )
                d.deleted += 1
        self.conn.write(ups)
        if ups:
            log.info("multicast groups: +%d ~%d -%d", d.inserted, d.modified, d.deleted)
        return d
