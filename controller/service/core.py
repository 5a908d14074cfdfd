"""The controller's state machine: plans, epochs, agents, subscribers, telemetry (§9).

Transport-free (the gRPC servicer in :mod:`controller.service.servicer` calls it), and
single-threaded: every method runs on the server's asyncio event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.plan import Plan
from controller.service import policies
from controller.service.metrics import Metrics
from controller.slots import SlotError, SlotPool
from controller.store import Store, plan_id_of

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger("heroserve.controller")

KIND_NAMES = {pb.NODE_KIND_SWITCH: "switch", pb.NODE_KIND_GPU: "gpu"}
KIND_OF_NAME = {v: k for k, v in KIND_NAMES.items()}


class RequestError(ValueError):
    """A malformed request (INVALID_ARGUMENT)."""


class NotRegistered(RuntimeError):
    """A request from an agent with no current session (FAILED_PRECONDITION)."""


@dataclass
class Options:
    default_slots: int = 1024  # aggregator slots of a switch that has not registered yet
    slots_per_group: int = policies.DEFAULT_SLOTS_PER_GROUP
    window_s: float = 0.1  # T_u (seconds) written into policy tables
    gamma: float = 0.5  # Eq. 18 smoothing written into policy tables
    apply_margin: int = policies.DEFAULT_APPLY_MARGIN
    telemetry_interval_s: float = 1.0


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
        each plan's own ``topology`` is resolved (:func:`policies.resolve_cluster`)."""
        self.store = store
        self.opts = options or Options()
        self.metrics = metrics or Metrics()
        self.pool = SlotPool(store)
        self.topology = topology
        self.state: policies.PlanState | None = None
        self.sessions: dict[str, str] = {}  # node id -> session id (lost on restart)
        self.subscribers: dict[str, Subscriber] = {}
        self.utilisation: dict[str, float] = {}
        self.metrics.epoch.set(store.epoch())
        current = store.current_plan()
        if current is not None:
            # A restart: rebuild the messages of the stored plan at the stored epoch. The
            # slot allocations are already in the store, so this allocates nothing new.
            pid, text = current
            with store.transaction():  # a plan this controller cannot serve changes nothing
                self.state = self._derive(Plan.from_dict(json.loads(text)), pid, store.epoch())
            log.info("restored plan %s at epoch %d", pid, store.epoch())

    # --- plans --------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.state.epoch if self.state else self.store.epoch()

    def apply_plan(self, plan_json: str) -> tuple[int, str]:
        """Make ``plan_json`` current; returns (epoch, plan id). The same plan again is a
        no-op (same epoch). Raises RequestError / policies.PlanError (TopologyUnavailable
        when the plan's cluster cannot be resolved) / SlotError; then nothing changed."""
        try:
            plan = Plan.from_dict(json.loads(plan_json))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RequestError(f"plan is not a valid Plan JSON: {exc!r}") from exc
        policies.validate(plan)
        canonical = plan.to_json(indent=None)
        pid = plan_id_of(canonical)
        if self.state is not None and self.state.plan_id == pid:
            return self.state.epoch, pid
        with self.store.transaction():
            epoch = self.store.next_epoch()
            self.store.topology = plan.topology
            self.store.save_plan(canonical, epoch)
            state = self._derive(plan, pid, epoch)
        self.state = state
        self.metrics.epoch.set(epoch)
        for sw in self.pool.switches():
            self.metrics.slots.labels(sw).set(sum(a.count for a in self.pool.allocations(sw)))
        log.info(
            "plan %s (%s, topology %s) at epoch %d: %d INA groups, %d tables; notifying %d",
            pid,
            plan.planner,
            plan.topology,
            epoch,
            len(state.assignments),
            len(state.tables),
            len(self.subscribers),
        )
        for sub in self.subscribers.values():
            sub.queue.put_nowait(epoch)
        return epoch, pid

    def _derive(self, plan: Plan, pid: str, epoch: int) -> policies.PlanState:
        # One resolved cluster per plan: the tables' link capacities and the cost model's
        # prices (latency_s, bandwidth) both come from it.
        cluster = policies.resolve_cluster(plan, self.topology)
        slots = policies.allocate(
            plan, self.store, self.pool, self.opts.default_slots, self.opts.slots_per_group
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
            policies.PolicyTimer.for_plan(plan, cluster),
        )

    def _apply_from(self, group: str) -> int:
        last = self.store.last_seq(group)
        return 0 if last is None else last + 1 + self.opts.apply_margin

    # --- agents -------------------------------------------------------------------------

    def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        ident = _check_identity(req.identity)
        which = req.WhichOneof("inventory")
        if ident.kind == pb.NODE_KIND_SWITCH:
            if which != "switch_inventory":
                raise RequestError("a switch must register with switch_inventory")
            inv: pb.SwitchInventory | pb.GpuInventory = req.switch_inventory
            ports = [p.port for p in req.switch_inventory.ports]
            if len(ports) != len(set(ports)):
                raise RequestError("switch_inventory lists a port twice")
            if any(not math.isfinite(p.capacity) or p.capacity < 0 for p in inv.ports):
                raise RequestError("switch_inventory: port capacity must be finite and >= 0")
        else:
            if which != "gpu":
                raise RequestError("a GPU agent must register with gpu inventory")
            inv = req.gpu
            ids = [g.gpu_id for g in inv.gpus]
            if any(not i for i in ids) or len(ids) != len(set(ids)):
                raise RequestError("gpu inventory: every GPU needs a distinct gpu_id")
        kind = KIND_NAMES[ident.kind]
        old = self.store.agent(ident.node_id)
        if old is not None and old.kind != kind:
            raise RequestError(f"node {ident.node_id!r} registered before as a {old.kind}")
        self.store.upsert_agent(ident.node_id, kind, inv.SerializeToString(deterministic=True))
        if kind == "switch" and req.switch_inventory.aggregator_slots:
            try:
                self.pool.set_capacity(ident.node_id, req.switch_inventory.aggregator_slots)
            except SlotError as exc:
                log.warning("switch %s: %s; keeping the previous capacity", ident.node_id, exc)
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
        )

    def check_session(self, identity: pb.NodeIdentity, session_id: str) -> pb.NodeIdentity:
        ident = _check_identity(identity)
        if not session_id:
            raise RequestError("session_id is empty")
        rec = self.store.agent(ident.node_id)
        if rec is not None and KIND_OF_NAME[rec.kind] != ident.kind:
            raise RequestError(f"node {ident.node_id!r} is a {rec.kind}")
        if self.sessions.get(ident.node_id) != session_id:
            raise NotRegistered(f"node {ident.node_id!r} has no session {session_id}: register")
        return ident

    def node_state(self, ident: pb.NodeIdentity) -> policies.NodeState:
        if self.state is None:
            return policies.NodeState()
        rec = self.store.agent(ident.node_id)
        inv: pb.SwitchInventory | pb.GpuInventory | None = None
        if rec is not None:
            cls = pb.SwitchInventory if rec.kind == "switch" else pb.GpuInventory
            inv = cls.FromString(rec.inventory)
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
            raise RequestError(f"ack of epoch {req.epoch}: current epoch is {self.epoch}")
        self.metrics.acks.labels(str(req.ok).lower()).inc()
        if req.ok:
            self.store.ack(ident.node_id, req.epoch)
        else:
            log.warning("%s failed to apply epoch %d: %s", ident.node_id, req.epoch, req.error)
        return pb.AckResponse(current_epoch=self.epoch)

    def telemetry(self, req: pb.TelemetryReport) -> pb.TelemetryAck:
        ident = self.check_session(req.identity, req.session_id)
        if not math.isfinite(req.window_s) or req.window_s < 0:
            raise RequestError(f"window_s {req.window_s} must be finite and >= 0")
        for lk in req.links:
            if not lk.link_id or lk.link_id.count("|") != 1:
                raise RequestError(f"link id {lk.link_id!r} is not '<nodeA>|<nodeB>'")
            if not (0.0 <= lk.utilisation <= 1.0) or not math.isfinite(lk.bytes_per_s):
                raise RequestError(f"link {lk.link_id}: utilisation {lk.utilisation} not in [0,1]")
        for s in req.selections:
            if not s.group_id:
                raise RequestError("a policy selection has no group_id")
        n = 0
        for lk in req.links:
            self.utilisation[policies.link_id(*lk.link_id.split("|"))] = lk.utilisation
            self.metrics.link_util.labels(lk.link_id).set(lk.utilisation)
            n += 1
        for s in req.selections:
            labels = (s.group_id, str(s.policy_id))
            self.metrics.selections.labels(*labels).inc(s.selections)
            self.metrics.selected_bytes.labels(*labels).inc(s.bytes)
            if s.last_seq:
                self.store.note_seq(s.group_id, s.last_seq)
            n += 1
        n += len(req.ports) + len(req.counters)
        self.store.touch_agent(ident.node_id)
        self.metrics.telemetry.inc()
        return pb.TelemetryAck(accepted=n)

    def agent_states(self) -> list[pb.AgentState]:
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
        for sub in self.subscribers.values():
            sub.queue.put_nowait(_CLOSE)


def _check_identity(identity: pb.NodeIdentity) -> pb.NodeIdentity:
    node = identity.node_id
    if not node:
        raise RequestError("identity.node_id is empty")
    if len(node) > 128 or not node.isprintable() or any(c.isspace() for c in node):
        raise RequestError(f"identity.node_id {node[:40]!r} is not a node name")
    if identity.kind not in KIND_NAMES:
        raise RequestError(f"identity.kind {identity.kind} is not switch or gpu")
    return identity


def now_ns() -> int:
    return time.time_ns()
