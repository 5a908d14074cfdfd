"""The controller's state machine: plans, epochs, agents, subscribers, telemetry (§9).

Transport-free (the gRPC servicer in :mod:`controller.service.servicer` calls it), and
single-threaded: every method runs on the server's asyncio event loop.

Nothing an agent says is trusted (a malformed request is
:class:`~controller.errors.InputError`): every request is bounded
(:data:`controller.service.binding.LIMITS`) and checked against what the plan's cluster gives
the speaking identity (:class:`controller.service.binding.ClusterIndex`) before it changes
anything; a request is applied whole or refused whole.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.plan import Plan
from controller.service import policies
from controller.service.binding import LIMITS, ClusterIndex, Denied
from controller.service.metrics import Metrics
from controller.service.planinput import parse_plan, parse_plan_canonical
from controller.service.slots import MAX_SLOTS, SlotError, SlotPool
from controller.service.store import MAX_SEQ, Store, StoreError, plan_id_of

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger("heroserve.controller")

KIND_NAMES = {pb.NODE_KIND_SWITCH: "switch", pb.NODE_KIND_GPU: "gpu"}
KIND_OF_NAME = {v: k for k, v in KIND_NAMES.items()}
# How long the controller gathers registrations that report table versions above its own
# (agents of a controller that lost its database) before it re-issues those tables in one
# epoch rather than one per agent.
RESYNC_DELAY_S = 0.1
# Acknowledged epochs are written to the database in one transaction per this many seconds
# rather than one per ack (a push to 1,000 agents is 1,000 acks within a second). A crash
# loses at most this window of acks, which the agents repeat: on reconnect they get the full
# state and acknowledge it again.
ACK_FLUSH_S = 0.05
_MAC = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$")


class NotRegistered(RuntimeError):
    """A request from an agent with no current session (FAILED_PRECONDITION)."""


class RegistryFull(RuntimeError):
    """The agent registry holds LIMITS.agents identities (RESOURCE_EXHAUSTED)."""


@dataclass
class Options:
    default_slots: int = 1024  # aggregator slots of a switch that has not registered yet
    slots_per_group: int = policies.DEFAULT_SLOTS_PER_GROUP
    window_s: float = 0.1  # T_u (seconds) written into policy tables
    gamma: float = 0.5  # Eq. 18 smoothing written into policy tables
    apply_margin: int = policies.DEFAULT_APPLY_MARGIN
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
        each plan's own ``topology`` is resolved (:func:`policies.resolve_cluster`). Raises
        :class:`StoreError` when the database holds something it cannot serve."""
        self.store = store
        self.opts = options or Options()
        self.metrics = metrics or Metrics()
        self.pool = SlotPool(store)
        self.topology = topology
        self._index_cache: tuple[nx.Graph, ClusterIndex] | None = None
        self.state: policies.PlanState | None = None
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
                policies.validate(plan)
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

    def apply_plan(self, plan_json: str | bytes) -> tuple[int, str]:
        """Make ``plan_json`` current; returns (epoch, plan id). The same plan again is a
        no-op (same epoch). Raises InputError (its subclass
        :class:`~controller.service.policies.TopologyUnavailable` when the plan's cluster
        cannot be resolved) / SlotError; then nothing changed."""
        plan, canonical = parse_plan_canonical(plan_json)
        policies.validate(plan)
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

    def _derive(self, plan: Plan, pid: str, epoch: int) -> policies.PlanState:
        with self.metrics.plan_seconds.time():
            return self._derive_timed(plan, pid, epoch)

    def _derive_timed(self, plan: Plan, pid: str, epoch: int) -> policies.PlanState:
        # One resolved cluster per plan: the tables' link capacities, the cost model's prices
        # (latency_s, bandwidth) and the agents' bindings all come from it.
        cluster = policies.resolve_cluster(plan, self.topology)
        index = self._index_of(cluster)
        policies.check_cluster(plan, cluster)
        timer = policies.PolicyTimer.for_plan(plan, cluster)
        alternatives = policies.Alternatives(cluster, timer)
        specs = policies.aggregation_groups(plan, alternatives)
        slots = policies.allocate(
            plan,
            self.store,
            self.pool,
            self.opts.default_slots,
            self.opts.slots_per_group,
            specs=specs,
        )
        return policies.build(
            plan,
            pid,
            epoch,
            self.store,
            slots,
            cluster,
            self.opts.window_s,
            self.opts.gamma,
            self._apply_from,
            timer,
            specs=specs,
            alternatives=alternatives,
            index=index,
        )

    def _publish(self, state: policies.PlanState, plan: Plan) -> None:
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
            if index is not None and _in_cluster(index, a.kind, node)
        }
        for node in self._gauged - want:
            self.metrics.acked_epoch.remove(node)
        for node in want - self._gauged:
            self.metrics.acked_epoch.labels(node).set(self.agents[node].acked)
        self._gauged = want

    def _apply_from(self, group: str) -> int:
        last = self.store.last_seq(group)
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
        ident = _check_identity(req.identity)
        is_switch = ident.kind == pb.NODE_KIND_SWITCH
        inv: pb.SwitchInventory | pb.GpuInventory
        if is_switch:
            inv = _check_switch_inventory(req)
        else:
            inv = _check_gpu_inventory(req)
        _bounded_text(req.agent_version, LIMITS.agent_version_chars, "agent_version")
        if len(req.held_tables) > LIMITS.held_tables:
            raise InputError(
                f"held_tables lists {len(req.held_tables)}, limit {LIMITS.held_tables}"
            )
        index = self.index
        if index is not None:
            index.check_agent(is_switch, ident.node_id)
            if not is_switch:
                index.check_gpus(ident.node_id, (g.gpu_id for g in req.gpu.gpus))
                for g in req.gpu.gpus:
                    if g.server and g.server != index.gpu_server.get(g.gpu_id, g.server):
                        raise InputError(
                            f"GPU {g.gpu_id}: server {g.server!r} differs from topology's "
                            f"{index.gpu_server[g.gpu_id]!r}"
                        )
        _bounded_text(req.generation, 64, "generation")
        # Versions held under another controller generation (this one lost its database):
        # new versions must exceed them. Under ours they are ours already.
        foreign = bool(req.generation) and req.generation != self.generation
        held = self._check_held(ident, req.held_tables)
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
                    self.store.note_seq(group, last_seq)
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

    def _check_held(
        self, ident: pb.NodeIdentity, held: list[pb.HeldTable]
    ) -> list[tuple[str, int, int]]:
        """The held tables worth acting on: the agent's own groups in the current plan. The
        others are ignored, counted: a plan change may have moved the agent's GPUs while it
        was away, and a table it holds for another group never touches that group."""
        out = []
        mine = self._agent_groups(ident)
        for h in held:
            _bounded_text(h.group_id, LIMITS.name_chars, "held_tables.group_id")
            if h.version > MAX_SEQ or h.last_seq > MAX_SEQ:
                raise InputError(f"held table {h.group_id}: version or last_seq above {MAX_SEQ}")
            if h.group_id not in mine:
                self.metrics.telemetry_dropped.labels("held_table_not_own").inc()
                continue
            out.append((h.group_id, h.version, h.last_seq))
        return out

    def _agent_groups(self, ident: pb.NodeIdentity) -> set[str]:
        """The table names whose members include a GPU of ``ident`` under the current plan."""
        if self.state is None or ident.kind != pb.NODE_KIND_GPU or self.state.cluster is None:
            return set()
        gpus = self.state.cluster.owned_gpus(ident.node_id)
        return set().union(*(self.state.by_gpu.get(g, set()) for g in gpus))

    def check_session(self, identity: pb.NodeIdentity, session_id: str) -> pb.NodeIdentity:
        ident = _check_identity(identity)
        if not session_id:
            raise InputError("session_id is empty")
        _bounded_text(session_id, 64, "session_id")
        rec = self.agents.get(ident.node_id)
        if rec is not None and KIND_OF_NAME[rec.kind] != ident.kind:
            raise InputError(f"node {ident.node_id!r} is a {rec.kind}")
        if self.sessions.get(ident.node_id) != session_id:
            raise NotRegistered(f"node {ident.node_id!r} has no session {session_id}: register")
        return ident

    def node_state(self, ident: pb.NodeIdentity) -> policies.NodeState:
        if self.state is None:
            return policies.NodeState()
        rec = self.agents.get(ident.node_id)
        inv = rec.inventory if rec is not None else None
        return policies.node_state(self.state, ident, inv, self.utilisation)

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
        is_switch = ident.kind == pb.NODE_KIND_SWITCH
        if not math.isfinite(req.window_s) or not 0 <= req.window_s <= LIMITS.window_s:
            raise InputError(f"window_s {req.window_s} must be in [0, {LIMITS.window_s}]")
        for what, items in (
            ("links", req.links),
            ("ports", req.ports),
            ("counters", req.counters),
            ("selections", req.selections),
        ):
            if len(items) > LIMITS.telemetry_records:
                raise InputError(f"{what}: {len(items)} records, limit {LIMITS.telemetry_records}")
        index = self.index
        links: list[tuple[str, float]] = []
        for lk in req.links:
            lid = _check_link_report(lk)
            if index is None:
                self.metrics.telemetry_dropped.labels("no_cluster").inc()
                continue  # nothing to check it against, and nothing uses it before a plan
            if lid not in index.links:
                raise InputError(f"link {lid} is not in topology {index.name!r}")
            if not index.link_ends_owned(is_switch, ident.node_id, lid):
                raise Denied(f"link {lid} does not end at {ident.node_id!r} or its GPUs")
            links.append((lid, lk.utilisation))
        for p in req.ports:
            if p.port >= LIMITS.ports:
                raise InputError(f"port {p.port} is not below {LIMITS.ports}")
        for c in req.counters:
            _bounded_text(c.name, LIMITS.name_chars, "counter name")
        selections = self._check_selections(ident, req.selections)
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
                    self.store.note_seq(s.group_id, s.last_seq)
            self.store.touch_agent(ident.node_id)
        self.metrics.telemetry.inc()
        n = len(links) + len(selections) + len(req.ports) + len(req.counters)
        return pb.TelemetryAck(accepted=n)

    def _check_selections(
        self, ident: pb.NodeIdentity, selections: list[pb.PolicySelection]
    ) -> list[pb.PolicySelection]:
        """Selections for the sender's own groups with the table's policy ids and bounded
        counters. A group the current plan does not have is dropped (a report racing a plan
        change), counted; another agent's group is PERMISSION_DENIED."""
        out = []
        mine = self._agent_groups(ident)
        for s in selections:
            _bounded_text(s.group_id, LIMITS.name_chars, "selection group_id")
            if self.state is None or s.group_id not in self.state.members:
                self.metrics.telemetry_dropped.labels("unknown_group").inc()
                continue
            if s.group_id not in mine:
                raise Denied(f"group {s.group_id} has none of {ident.node_id!r}'s GPUs")
            if s.last_seq > MAX_SEQ or s.version > MAX_SEQ:
                raise InputError(
                    f"group {s.group_id}: last_seq {s.last_seq} / version {s.version} above "
                    f"{MAX_SEQ}"
                )
            if s.policy_id not in self.state.policy_ids[s.group_id]:
                raise InputError(f"group {s.group_id} has no policy {s.policy_id}")
            out.append(s)
        return out

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


def _in_cluster(index: ClusterIndex, kind: str, node_id: str) -> bool:
    try:
        index.check_agent(kind == "switch", node_id)
    except Denied:
        return False
    return True


def _bounded_text(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        raise InputError(f"{what} is {len(value)} characters, limit {limit}")
    return value


def _check_identity(identity: pb.NodeIdentity) -> pb.NodeIdentity:
    node = identity.node_id
    if not node:
        raise InputError("identity.node_id is empty")
    if len(node) > LIMITS.name_chars or not node.isprintable() or any(c.isspace() for c in node):
        raise InputError(f"identity.node_id {node[:40]!r} is not a node name")
    if "|" in node:
        raise InputError(f"identity.node_id {node[:40]!r} holds '|' (the link id separator)")
    if identity.kind not in KIND_NAMES:
        raise InputError(f"identity.kind {identity.kind} is not switch or gpu")
    return identity


def _check_node_name(value: str, what: str, allow_empty: bool = False) -> None:
    if not value and allow_empty:
        return
    if not value or len(value) > LIMITS.name_chars or not value.isprintable() or "|" in value:
        raise InputError(f"{what} {value[:40]!r} is not a node name")


def _check_switch_inventory(req: pb.RegisterRequest) -> pb.SwitchInventory:
    if req.WhichOneof("inventory") != "switch_inventory":
        raise InputError("a switch must register with switch_inventory")
    inv = req.switch_inventory
    if len(inv.ports) > LIMITS.ports:
        raise InputError(f"switch_inventory lists {len(inv.ports)} ports, limit {LIMITS.ports}")
    ports = [p.port for p in inv.ports]
    if len(ports) != len(set(ports)):
        raise InputError("switch_inventory lists a port twice")
    for p in inv.ports:
        if p.port >= LIMITS.ports:
            raise InputError(f"switch_inventory: port {p.port} is not below {LIMITS.ports}")
        if not math.isfinite(p.capacity) or p.capacity < 0:
            raise InputError("switch_inventory: port capacity must be finite and >= 0")
        _check_node_name(p.peer, f"port {p.port} peer", allow_empty=True)
        _bounded_text(p.name, LIMITS.name_chars, f"port {p.port} name")
        if p.peer_mac and not _MAC.match(p.peer_mac):
            raise InputError(f"port {p.port}: peer_mac {p.peer_mac[:40]!r} is not a MAC")
        if p.peer_ipv4 and not _IPV4.match(p.peer_ipv4):
            raise InputError(f"port {p.port}: peer_ipv4 {p.peer_ipv4[:40]!r} is not IPv4")
    if inv.aggregator_slots > MAX_SLOTS:
        raise InputError(
            f"switch_inventory: aggregator_slots {inv.aggregator_slots} above {MAX_SLOTS} "
            "(the slot index is 16 bits)"
        )
    if inv.slot_bytes > LIMITS.slot_bytes:
        raise InputError(f"switch_inventory: slot_bytes {inv.slot_bytes} above {LIMITS.slot_bytes}")
    _bounded_text(inv.p4_program, LIMITS.name_chars, "p4_program")
    return inv


def _check_gpu_inventory(req: pb.RegisterRequest) -> pb.GpuInventory:
    if req.WhichOneof("inventory") != "gpu":
        raise InputError("a GPU agent must register with gpu inventory")
    inv = req.gpu
    if len(inv.gpus) > LIMITS.gpus_per_agent:
        raise InputError(f"gpu inventory lists {len(inv.gpus)} GPUs, limit {LIMITS.gpus_per_agent}")
    ids = [g.gpu_id for g in inv.gpus]
    if any(not i for i in ids) or len(ids) != len(set(ids)):
        raise InputError("gpu inventory: every GPU needs a distinct gpu_id")
    for g in inv.gpus:
        _check_node_name(g.gpu_id, "gpu_id")
        _check_node_name(g.server, f"GPU {g.gpu_id} server", allow_empty=True)
        _bounded_text(g.gpu_type, LIMITS.name_chars, f"GPU {g.gpu_id} gpu_type")
        if g.local_index >= LIMITS.gpus_per_agent:
            raise InputError(f"GPU {g.gpu_id}: local_index {g.local_index} out of range")
        if g.mac and not _MAC.match(g.mac):
            raise InputError(f"GPU {g.gpu_id}: mac {g.mac[:40]!r} is not a MAC")
        if g.ipv4 and not _IPV4.match(g.ipv4):
            raise InputError(f"GPU {g.gpu_id}: ipv4 {g.ipv4[:40]!r} is not IPv4")
    return inv


def _check_link_report(lk: pb.LinkUtilisation) -> str:
    """The canonical id of a well-formed link report, else InputError."""
    ends = lk.link_id.split("|")
    if len(ends) != 2 or not all(ends) or len(lk.link_id) > 2 * LIMITS.name_chars + 1:
        raise InputError(f"link id {lk.link_id[:80]!r} is not '<nodeA>|<nodeB>'")
    if not (0.0 <= lk.utilisation <= 1.0):
        raise InputError(f"link {lk.link_id}: utilisation {lk.utilisation} not in [0,1]")
    if not math.isfinite(lk.bytes_per_s) or lk.bytes_per_s < 0:
        raise InputError(f"link {lk.link_id}: bytes_per_s {lk.bytes_per_s} not finite >= 0")
    return policies.link_id(*ends)


def now_ns() -> int:
    return time.time_ns()
