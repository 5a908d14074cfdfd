"""The switch agent: controller policies in, P4Runtime entries out (docs/design.md §10).

On every policy state (the controller's full state on (re)connect, then each epoch) it
reconciles the switch with that state: multicast groups first (so entries never point at
a missing group), then ``aggregation_table`` and ``result_rewrite``, then stale groups
are deleted. Reconciling reads the switch back each time, so after an agent or switch
restart whatever is on the switch converges to what the controller says. Telemetry
(port utilisation, INA counters) is polled on a thread and reported on the session.
"""

from __future__ import annotations

import logging
import threading

from agents.client import AgentClient, Backoff, ClientTls, PolicyState
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.switch.counters import InaCounters, PortCounters
from agents.switch.p4rt import SwitchConnection, SwitchError
from agents.switch.tables import (
    AggregationTable,
    Diff,
    L2Forward,
    MulticastGroups,
    PortInfo,
    ResultRewrite,
    WorkerPort,
)

log = logging.getLogger("heroserve.switch")


class SwitchAgent:
    def __init__(
        self,
        node_id: str,
        conn: SwitchConnection,
        controller: str,
        ports: dict[int, PortInfo],
        aggregator_slots: int = 1024,
        slot_bytes: int = 128,
        tls: ClientTls | None = None,
        telemetry_interval_s: float = 1.0,
    ) -> None:
        self.node_id = node_id
        self.conn = conn
        self.ports = ports
        self.aggregator_slots = aggregator_slots
        self.slot_bytes = slot_bytes
        self.telemetry_interval_s = telemetry_interval_s
        self.lock = threading.Lock()  # one reconcile or poll on the switch at a time
        self.switch_backoff = Backoff(initial=0.2, maximum=5.0)
        self.client = AgentClient(
            controller,
            pb.NodeIdentity(node_id=node_id, kind=pb.NODE_KIND_SWITCH),
            self.inventory,
            self.on_state,
            tls=tls,
            agent_version="heroserve-switch-agent/0.1",
        )
        self.applied = 0  # reconciles done, for logs and tests
        self._connected = False
        self._desired: PolicyState | None = None  # last state reconciled (or being)

    # --- switch -------------------------------------------------------------------------

    def connect_switch(self) -> bool:
        """Connect to the switch, retrying with backoff; False if stopped first."""
        while not self.client.stop_event.is_set():
            try:
                with self.lock:
                    self.conn.connect()
                    self._connected = True
                    # Static entries (the port map) are ours regardless of the controller.
                    L2Forward(self.conn).reconcile(L2Forward.desired(self.ports))
                self.switch_backoff.reset()
                return True
            except SwitchError as exc:
                delay = self.switch_backoff.next()
                log.warning("%s; retrying in %.2fs", exc, delay)
                self.client.stop_event.wait(delay)
        return False

    def inventory(self) -> pb.SwitchInventory:
        inv = pb.SwitchInventory(
            device_id=self.conn.device_id,
            aggregator_slots=self.aggregator_slots,
            slot_bytes=self.slot_bytes,
            p4_program=self.conn.p4info.pkg_info.name or "heroserve_ina",
        )
        for p in sorted(self.ports.values(), key=lambda x: x.port):
            inv.ports.add(
                port=p.port,
                peer=p.peer,
                capacity=p.capacity,
                peer_mac=p.mac,
                peer_ipv4=p.ipv4,
            )
        return inv

    def reconcile(self, state: PolicyState | None = None) -> Diff:
        """Make the switch hold ``state`` (default: the last state given). Serialised by
        the lock, so the newest state always wins."""
        with self.lock:
            if state is not None:
                self._desired = state
            state = self._desired
            if state is None:
                return Diff()
            if not self._connected:
                raise SwitchError("not connected to the switch")
            groups = [state.switch_groups[g] for g in sorted(state.switch_groups)]
            total = Diff()
            try:
                mc = MulticastGroups(self.conn)
                want_mc = MulticastGroups.desired(groups)
                total += mc.reconcile(want_mc, "add")
                total += ResultRewrite(self.conn).reconcile(
                    ResultRewrite.desired(groups, self.ports)
                )
                # Bindings first: an aggregation entry without them refuses every packet.
                total += WorkerPort(self.conn).reconcile(WorkerPort.desired(groups))
                total += AggregationTable(self.conn).reconcile(AggregationTable.desired(groups))
                total += mc.reconcile(want_mc, "remove")
            except SwitchError:
                self._connected = False
                raise
            self.applied += 1
        return total

    def on_state(self, old: PolicyState, new: PolicyState, upd: pb.PolicyUpdate) -> None:
        if not self._connected and not self.connect_switch():
            raise SwitchError("stopped")
        d = self.reconcile(new)
        log.info(
            "epoch %d (%s, plan %s): %d INA groups; +%d ~%d -%d entries",
            upd.epoch,
            "full" if upd.full else "delta",
            upd.plan_id or "-",
            len(new.switch_groups),
            d.inserted,
            d.modified,
            d.deleted,
        )

    # --- telemetry ----------------------------------------------------------------------

    def _telemetry_loop(self) -> None:
        ports = PortCounters(self.conn, self.node_id, self.ports)
        ina = InaCounters(self.conn)
        while not self.client.stop_event.wait(self.telemetry_interval_s):
            rep = pb.TelemetryReport()
            try:
                with self.lock:
                    if not self._connected:
                        continue
                    ports.poll(rep)
                    ina.poll(rep)
            except (SwitchError, ValueError) as exc:
                log.warning("telemetry poll failed: %s", exc)
                self._resync()
                continue
            self.client.report(rep)

    def _resync(self) -> None:
        """The switch stopped answering (restarted?): reconnect, reinstall the pipeline if
        it lost it, and reconcile it with the last state the controller gave us."""
        with self.lock:
            self._connected = False
        if not self.connect_switch():
            return
        try:
            d = self.reconcile()
            log.info("switch resynchronised: +%d ~%d -%d", d.inserted, d.modified, d.deleted)
        except SwitchError as exc:
            log.warning("resynchronising the switch failed: %s", exc)

    # --- lifecycle ----------------------------------------------------------------------

    def run(self) -> None:
        """Serve until :meth:`stop`."""
        if not self.connect_switch():
            return
        t = threading.Thread(target=self._telemetry_loop, name="telemetry", daemon=True)
        t.start()
        try:
            self.client.run()
        finally:
            self.client.stop()
            t.join(5)
            with self.lock:
                self.conn.close()
                self._connected = False

    def stop(self) -> None:
        self.client.stop()
