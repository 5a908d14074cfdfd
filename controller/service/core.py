"""The controller's state machine (docs/design.md §9): plans, epochs, agents, telemetry.

Transport-free (the gRPC servicer in :mod:`controller.service.servicer` calls it), and
single-threaded: every method runs on the server's asyncio event loop. A plan becomes what
every agent should hold through :func:`controller.service.state.derive`. Nothing an agent says
is trusted: every request passes the checks of :mod:`controller.service.binding` (bounds, and
what the plan's cluster gives the speaking identity) before it changes anything; a request is
applied whole or refused whole. A malformed request or plan is
:class:`~controller.errors.InputError`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.plan import Plan
from controller.service.admission import validate
from controller.service.binding import (
    KIND_NAMES,
    KIND_OF_NAME,
    LIMITS,
    ClusterIndex,
    check_held,
    check_identity,
    check_registration,
    check_selections,
    check_session_id,
    check_telemetry,
)
from controller.service.groups import DEFAULT_SLOTS_PER_GROUP
from controller.service.metrics import Metrics
from controller.service.planinput import Parsed, parse_plan, parse_plan_canonical
from controller.service.slots import SlotError, SlotPool
from controller.service.state import NodeState, PlanState, derive, node_state
from controller.service.store import Store, StoreError, plan_id_of

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger("heroserve.controller")

# How long the controller gathers registrations that report table versions above its own
# (agents of a controller that lost its database) before it re-issues those tables in one
# epoch rather than one per agent.
RESYNC_DELAY_S = 0.1
# Acknowledged epochs are written to the database in one transaction per this many seconds
# rather than one per ack (a push to 1,000 agents is 1,000 acks within a second). A crash
# loses at most this window of acks, which the agents repeat: on reconnect they get the full
# state and acknowledge it again.
ACK_FLUSH_S = 0.05
# Collective sequence numbers a new table version waits before it applies, beyond the
# highest one any member reported: every member must receive the table before that.
DEFAULT_APPLY_MARGIN = 1024


class NotRegistered(RuntimeError):
    """A request from an agent with no current session (FAILED_PRECONDITION)."""


class RegistryFull(RuntimeError):
    """The agent registry holds LIMITS.agents identities (RESOURCE_EXHAUSTED)."""


@dataclass
class Options:
    default_slots: int = 1024  # aggregator slots of a switch that has not registered yet
    slots_per_group: int = DEFAULT_SLOTS_PER_GROUP
    window_s: float = 0.1  # T_u (seconds) written into policy tables
    gamma: float = 0.5  # Eq. 18 smoothing written into policy tables
    apply_margin: int = DEFAULT_APPLY_MARGIN
    telemetry_interval_s: float = 1.0


@dataclass
class _Agent:
    """The registry row of one agent, kept in memory: every request reads it."""

    kind: str  # "switch" | "gpu"
    inventory: pb.SwitchInventory | pb.GpuInventory
    acked: int


@dataclass
class Subscriber:
    identity: pb.NodeIdentity
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


_CLOSE = object()


class Controller:
    def __init__(
        self,
        store: Store,
        options: Options | None = None,
        metrics: Metrics | None = None,
        topology: nx.Graph | None = None,
    ) -> None:
        """``topology``: the cluster graph of ``--topology``, used for every plan; without it
        each plan's own ``topology`` is resolved
        (:func:`controller.service.admission.resolve_cluster`). Raises
        :class:`StoreError` when the database holds something it cannot serve."""
        self.store = store
        self.opts = options or Options()
        self.metrics = metrics or Metrics()
        self.pool = SlotPool(store)
        self.topology = topology
        self._index_cache: tuple[nx.Graph, ClusterIndex] | None = None
        self.state: PlanState | None = None
        self.plan: Plan | None = None
        self.sessions: dict[str, str] = {}  # node id -> session id (lost on restart)
        self.subscribers: dict[str, Subscriber] = {}
        self.utilisation: dict[str, float] = {}
        self._resync_pending = False
        self._acks: dict[str, int] = {}  # acked epochs not yet written (ACK_FLUSH_S)
        self._gauged: set[str] = set()  # agents with a heroserve_agent_acked_epoch series
        # The database is data from disk: check it before serving anything from it.
        store.verify()
        try:
            self.pool.check_all()
        except SlotError as exc:
            raise StoreError(f"slot pool: {exc}") from None
        self.generation = store.generation
        self.agents: dict[str, _Agent] = {}
        for rec in store.agents():
            cls = pb.SwitchInventory if rec.kind == "switch" else pb.GpuInventory
            try:
                inv = cls.FromString(rec.inventory)
            except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
                raise StoreError(
                    f"agents[{rec.node_id!r}].inventory does not parse: {exc}"
                ) from None
            self.agents[rec.node_id] = _Agent(rec.kind, inv, rec.acked_epoch)
        self.metrics.epoch.set(store.epoch())
        current = store.current_plan()
        if current is not None:
            # A restart: rebuild the messages of the stored plan at the stored epoch. The
            # slot allocations are already in the store, so this allocates nothing new.
            pid, text = current
            try:
                plan = parse_plan(text, f"stored plan {pid}")
            except InputError as exc:
                raise StoreError(str(exc)) from None
            try:
                validate(plan)
            except InputError as exc:
                raise StoreError(f"stored plan {pid}: {exc}") from None
            with store.transaction():  # a plan this controller cannot serve changes nothing
                self.state = self._derive(plan, pid, store.epoch())
            self.plan = plan
            log.info("restored plan %s at epoch %d", pid, store.epoch())
        self._update_gauges()

    # --- plans --------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.state.epoch if self.state else self.store.epoch()

    @property
    def index(self) -> ClusterIndex | None:
        """Names of the cluster the current plan is served on (None before any cluster)."""
        if self.state is not None and self.state.cluster is not None:
            return self.state.cluster
        return self._index_of(self.topology) if self.topology is not None else None

    def _index_of(self, cluster: nx.Graph) -> ClusterIndex:
        """The names of ``cluster``, indexed once per graph (``--topology`` serves every plan)."""
        if self._index_cache is None or self._index_cache[0] is not cluster:
            self._index_cache = (cluster, ClusterIndex.of(cluster))
        return self._index_cache[1]

    def apply_plan(self, plan_json: str | bytes, parsed: Parsed | None = None) -> tuple[int, str]:
        """Make ``plan_json`` current (``parsed``: its ``parse_plan_canonical``, done off the
        loop); returns (epoch, plan id); the same plan again is a no-op. Raises InputError
        (``TopologyUnavailable``: the plan's cluster cannot be resolved) / SlotError."""
        plan, canonical = parsed or parse_plan_canonical(plan_json)
        validate(plan)
        pid = plan_id_of(canonical)
        if self.state is not None and self.state.plan_id == pid:
            return self.state.epoch, pid
        with self.store.transaction():
            epoch = self.store.next_epoch()
            self.store.topology = plan.topology
            self.store.save_plan(canonical, epoch)
            state = self._derive(plan, pid, epoch)
        self._publish(state, plan)
        log.info(
            "plan %s (%s, topology %s) at epoch %d: %d aggregation groups, %d tables; notifying %d",
            pid,
            plan.planner,
            plan.topology,
            epoch,
            len(state.assignments),
            len(state.tables),
            len(self.subscribers),
        )
        return epoch, pid

    def apply_startup_plan(self, plan_json: str | bytes, source: str = "--plan") -> str:
        """``--plan`` at start-up (docs/control-plane.md, "Restart"): the database is the
        truth. The plan is applied only when the database has never held it; the plan it
        holds, or one it superseded, is left as it is. Returns what was done, for the log."""
        _, canonical = parse_plan_canonical(plan_json, source)
        pid = plan_id_of(canonical)
        current = self.state.plan_id if self.state is not None else None
        if pid == current:
            return f"--plan {pid} is the plan the database holds (epoch {self.epoch}): unchanged"
        before = self.store.plan_epoch(pid)
        if before is not None and current is not None:
            return (
                f"--plan {pid} was applied at epoch {before} and plan {current} superseded it: "
                f"serving {current} from the database at epoch {self.epoch} (Admin.ApplyPlan "
                f"returns to {pid})"
            )
        epoch, pid = self.apply_plan(plan_json)
        held = f"the database held plan {current}" if current else "the database held no plan"
        return f"--plan {pid} applied at epoch {epoch} ({held})"

    def _derive(self, plan: Plan, pid: str, epoch: int) -> PlanState:
        with self.metrics.plan_seconds.time():
            return derive(
                plan,
                pid,
                epoch,
                self.store,
                self.pool,
                self.topology,
                self._apply_from,
                default_slots=self.opts.default_slots,
                slots_per_group=self.opts.slots_per_group,
                window_s=self.opts.window_s,
                gamma=self.opts.gamma,
                index_of=self._index_of,
            )

    def _publish(self, state: PlanState, plan: Plan) -> None:
        self.state, self.plan = state, plan
        self.metrics.epoch.set(state.epoch)
        self._update_gauges()
        for sub in self.subscribers.values():
            sub.queue.put_nowait(state.epoch)

    def _update_gauges(self) -> None:
        switches = self.pool.switches()
        self.metrics.slots.clear()
        for sw in switches:
            self.metrics.slots.labels(sw).set(sum(a.count for a in self.pool.allocations(sw)))
        # Only identities of the plan's cluster have an acked-epoch series: the label set
        # is what the plan names, never what clients choose. Series are added and removed
        # as the cluster changes, not rebuilt (a plan of 1,000 agents would rebuild 1,000).
        index = self.index
        want = {
            node
            for node, a in self.agents.items()
            if index is not None and index.has_agent(a.kind == "switch", node)
        }
        for node in self._gauged - want:
            self.metrics.acked_epoch.remove(node)
        for node in want - self._gauged:
            self.metrics.acked_epoch.labels(node).set(self.agents[node].acked)
        self._gauged = want

    def _apply_from(self, group: str, quorum: int) -> int:
        last = self.store.last_seq(group, quorum)  # no one agent can push it (Store.last_seq)
        return 0 if last is None else last + 1 + self.opts.apply_margin

    def _schedule_resync(self) -> None:
        """Re-issue the current plan's tables whose versions agents hold above ours, once for
        every registration within RESYNC_DELAY_S (a reconnecting fleet is one epoch)."""
        if self._resync_pending:
            return
        self._resync_pending = True
        try:
            asyncio.get_running_loop().call_later(RESYNC_DELAY_S, self._resync)
        except RuntimeError:  # no loop (the core driven directly): now
            self._resync()

    def _resync(self) -> None:
        self._resync_pending = False
        if self.state is None or self.plan is None:
            return
        stale = [
            t.group_id for t in self.state.tables if t.version <= self.store.table_floor(t.group_id)
        ]
        if not stale:
            return
        pid = self.state.plan_id
        with self.store.transaction():
            epoch = self.store.next_epoch()
            state = self._derive(self.plan, pid, epoch)
        self._publish(state, self.plan)
        log.warning(
            "agents hold table versions above this controller's for %d group(s) (%s%s): "
            "re-issued above them at epoch %d",
            len(stale),
            ", ".join(stale[:3]),
            ", ..." if len(stale) > 3 else "",
            epoch,
        )

    # --- agents -------------------------------------------------------------------------

    def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        index = self.index
        ident, inv = check_registration(req, index)
        is_switch = ident.kind == pb.NODE_KIND_SWITCH
        # Versions held under another controller generation (this one lost its database):
        # new versions must exceed them. Under ours they are ours already.
        foreign = bool(req.generation) and req.generation != self.generation
        held = check_held(req.held_tables, self._agent_groups(ident), self._dropped)
        kind = KIND_NAMES[ident.kind]
        old = self.agents.get(ident.node_id)
        if old is not None and old.kind != kind:
            raise InputError(f"node {ident.node_id!r} registered before as a {old.kind}")
        if old is None and len(self.agents) >= LIMITS.agents:
            raise RegistryFull(f"the agent registry holds {LIMITS.agents} identities")
        # Checked: from here on the request changes state.
        with self.store.transaction():
            self.store.upsert_agent(ident.node_id, kind, inv.SerializeToString(deterministic=True))
            if is_switch and req.switch_inventory.aggregator_slots:
                try:
                    self.pool.set_capacity(ident.node_id, req.switch_inventory.aggregator_slots)
                except SlotError as exc:
                    log.warning("switch %s: %s; keeping the previous capacity", ident.node_id, exc)
            resync = False
            for group, version, last_seq in held:
                if last_seq:
                    self.store.note_seq(group, ident.node_id, last_seq)
                if foreign:
                    self.store.raise_table_floor(group, version)
                    resync |= version >= self.store.current_table_version(group)
        self.agents[ident.node_id] = _Agent(kind, inv, old.acked if old else 0)
        if index is not None and ident.node_id not in self._gauged:
            self._gauged.add(ident.node_id)  # checked against the cluster above
            self.metrics.acked_epoch.labels(ident.node_id).set(self.agents[ident.node_id].acked)
        if resync:
            self._schedule_resync()
        session = secrets.token_hex(8)
        self.sessions[ident.node_id] = session
        self.metrics.registrations.labels(kind).inc()
        log.info(
            "registered %s %s (agent %s, last applied epoch %d)",
            kind,
            ident.node_id,
            req.agent_version or "?",
            req.last_applied_epoch,
        )
        return pb.RegisterResponse(
            session_id=session,
            current_epoch=self.epoch,
            topology=self.store.topology,
            telemetry_interval_s=self.opts.telemetry_interval_s,
            generation=self.generation,
        )

    def _dropped(self, reason: str) -> None:
        """Count an item of a request left out (``heroserve_telemetry_dropped_total``)."""
        self.metrics.telemetry_dropped.labels(reason).inc()

    def _agent_groups(self, ident: pb.NodeIdentity) -> set[str]:
        """The table names whose members include a GPU of ``ident`` under the current plan."""
        if self.state is None or ident.kind != pb.NODE_KIND_GPU or self.state.cluster is None:
            return set()
        gpus = self.state.cluster.owned_gpus(ident.node_id)
        return set().union(*(self.state.by_gpu.get(g, set()) for g in gpus))

    def check_session(self, identity: pb.NodeIdentity, session_id: str) -> pb.NodeIdentity:
        """``identity`` when it holds session ``session_id``, else :class:`NotRegistered`."""
        ident = check_identity(identity)
        check_session_id(session_id)
        rec = self.agents.get(ident.node_id)
        if rec is not None and KIND_OF_NAME[rec.kind] != ident.kind:
            raise InputError(f"node {ident.node_id!r} is a {rec.kind}")
        if self.sessions.get(ident.node_id) != session_id:
            raise NotRegistered(f"node {ident.node_id!r} has no session {session_id}: register")
        return ident

    def node_state(self, ident: pb.NodeIdentity) -> NodeState:
        """What agent ``ident`` should hold now (nothing before any plan)."""
        if self.state is None:
            return NodeState()
        rec = self.agents.get(ident.node_id)
        inv = rec.inventory if rec is not None else None
        return node_state(self.state, ident, inv, self.utilisation)

    def subscribe(self, ident: pb.NodeIdentity) -> Subscriber:
        old = self.subscribers.get(ident.node_id)
        if old is not None:
            old.queue.put_nowait(_CLOSE)  # one stream per node: the newest wins
        sub = Subscriber(ident)
        self.subscribers[ident.node_id] = sub
        self.metrics.connected.set(len(self.subscribers))
        log.info("%s %s subscribed", KIND_NAMES[ident.kind], ident.node_id)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if self.subscribers.get(sub.identity.node_id) is sub:
            del self.subscribers[sub.identity.node_id]
            log.info("%s disconnected", sub.identity.node_id)
        self.metrics.connected.set(len(self.subscribers))

    @staticmethod
    def is_close(item: object) -> bool:
        return item is _CLOSE

    def ack(self, req: pb.AckRequest) -> pb.AckResponse:
        ident = self.check_session(req.identity, req.session_id)
        if req.epoch == 0 or req.epoch > self.epoch:
            raise InputError(f"ack of epoch {req.epoch}: current epoch is {self.epoch}")
        index = self.index
        if index is not None:
            index.check_agent(ident.kind == pb.NODE_KIND_SWITCH, ident.node_id)
        self.metrics.acks.labels(str(req.ok).lower()).inc()
        rec = self.agents.get(ident.node_id)
        if req.ok and rec is not None and req.epoch > rec.acked:
            rec.acked = req.epoch
            self._acks[ident.node_id] = req.epoch
            self._schedule_ack_flush()
            if ident.node_id in self._gauged:
                self.metrics.acked_epoch.labels(ident.node_id).set(rec.acked)
        else:
            log.warning(
                "%s failed to apply epoch %d: %s",
                ident.node_id,
                req.epoch,
                req.error[: LIMITS.error_chars],
            )
        return pb.AckResponse(current_epoch=self.epoch)

    def _schedule_ack_flush(self) -> None:
        if len(self._acks) > 1:
            return  # a flush is already due
        try:
            asyncio.get_running_loop().call_later(ACK_FLUSH_S, self.flush_acks)
        except RuntimeError:  # no loop (the core driven directly): now
            self.flush_acks()

    def flush_acks(self) -> None:
        """Write the acknowledged epochs gathered since the last flush (one transaction)."""
        if self._acks:
            acks, self._acks = self._acks, {}
            self.store.ack_many(acks)

    def telemetry(self, req: pb.TelemetryReport) -> pb.TelemetryAck:
        ident = self.check_session(req.identity, req.session_id)
        links = check_telemetry(req, ident, self.index, self._dropped)
        selections = check_selections(
            ident.node_id,
            req.selections,
            self.state.policy_ids if self.state is not None else {},
            self._agent_groups(ident),
            self._dropped,
        )
        # Checked: apply.
        for lid, u in links:
            self.utilisation[lid] = u
            self.metrics.link_util.labels(lid).set(u)
        with self.store.transaction():
            for s in selections:
                labels = (s.group_id, str(s.policy_id))
                self.metrics.selections.labels(*labels).inc(s.selections)
                self.metrics.selected_bytes.labels(*labels).inc(s.bytes)
                if s.last_seq:
                    self.store.note_seq(s.group_id, ident.node_id, s.last_seq)
            self.store.touch_agent(ident.node_id)
        self.metrics.telemetry.inc()
        n = len(links) + len(selections) + len(req.ports) + len(req.counters)
        return pb.TelemetryAck(accepted=n)

    def agent_states(self) -> list[pb.AgentState]:
        self.flush_acks()
        return [
            pb.AgentState(
                identity=pb.NodeIdentity(node_id=r.node_id, kind=KIND_OF_NAME[r.kind]),
                acked_epoch=r.acked_epoch,
                connected=r.node_id in self.subscribers,
                last_seen_unix_s=r.last_seen,
            )
            for r in self.store.agents()
        ]

    def close(self) -> None:
        self.flush_acks()
        for sub in self.subscribers.values():
            sub.queue.put_nowait(_CLOSE)


def now_ns() -> int:
    return time.time_ns()
