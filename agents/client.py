"""Agent side of the control plane (docs/design.md §9), shared by the switch agent, tests and
benchmarks: the epoch rule for policy updates and a reconnecting client.

The rule (:meth:`PolicyState.apply`): a full update replaces the state; an incremental one
applies only when it comes from the same controller generation and its epoch is above the
last applied epoch, so a stale or repeated update is ignored, never acknowledged. The
client (:class:`AgentClient`) registers (saying which generation's state it holds and the
table versions it holds, so a controller that lost its database issues versions above
them), subscribes, hands each applied state to a callback, acknowledges it, and on any
failure reconnects with exponential backoff (registering again: a restarted controller has
no session for it). A new generation (docs/control-plane.md, "Controller generation")
restarts the epoch count: the controller's epochs are not comparable across databases.
"""

from __future__ import annotations

import argparse
import copy
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from agents.cliutil import UsageError, read_regular
from agents.proto.heroserve.v1 import control_pb2 as pb
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc

log = logging.getLogger("heroserve.agent")

# A PEM chain of a few certificates is a few KB; 1 MiB bounds a wrong file given as one.
MAX_PEM_BYTES = 1 << 20


@dataclass
class PolicyState:
    """What an agent holds, keyed like the controller's ``NodeState``."""

    epoch: int = 0
    plan_id: str = ""
    generation: str = ""  # the controller generation the epochs belong to
    switch_groups: dict[int, pb.InaAssignment] = field(default_factory=dict)
    tables: dict[str, pb.PolicyTable] = field(default_factory=dict)
    gpu_ina: dict[int, pb.InaAssignment] = field(default_factory=dict)

    def applied(self, upd: pb.PolicyUpdate) -> PolicyState | None:
        """The state after ``upd``, or None when ``upd`` is stale (ignored): an incremental
        update from another generation, or at or below the last applied epoch."""
        if not upd.full and (upd.generation != self.generation or upd.epoch <= self.epoch):
            return None
        new = PolicyState() if upd.full else copy.deepcopy(self)
        new.epoch, new.plan_id, new.generation = upd.epoch, upd.plan_id, upd.generation
        which = upd.WhichOneof("body")
        if which == "switch_policy":
            sp = upd.switch_policy
            for gid in sp.removed_group_ids:
                new.switch_groups.pop(gid, None)
            for a in sp.assignments:
                new.switch_groups[a.group_id] = a
        elif which == "gpu_policy":
            gp = upd.gpu_policy
            for g in gp.removed_group_ids:
                new.tables.pop(g, None)
            for t in gp.tables:
                new.tables[t.group_id] = t
            for gid in gp.removed_ina_group_ids:
                new.gpu_ina.pop(gid, None)
            for a in gp.ina:
                new.gpu_ina[a.group_id] = a
        return new

    def apply(self, upd: pb.PolicyUpdate) -> bool:
        """Apply ``upd`` in place; False (and no change) when it is stale."""
        new = self.applied(upd)
        if new is None:
            return False
        self.__dict__.update(new.__dict__)
        return True


@dataclass
class ClientTls:
    cert: bytes  # client certificate chain (PEM)
    key: bytes  # client private key (PEM)
    ca: bytes  # CA of the controller's certificate (PEM)
    server_name: str | None = None  # expected name in the controller's certificate


def add_tls_args(p: argparse.ArgumentParser, who: str = "this agent") -> None:
    """The client TLS flags, the same in the switch agent and ``heroserve admin``."""
    p.add_argument("--tls-cert", help=f"client certificate (PEM) naming {who}")
    p.add_argument("--tls-key", help="client private key (PEM)")
    p.add_argument("--tls-ca", help="CA of the controller's certificate (PEM)")
    p.add_argument("--tls-server-name", help="name expected in the controller's certificate")


def tls_from_args(a: argparse.Namespace) -> ClientTls | None:
    """What :func:`add_tls_args` parsed: None without TLS; ValueError naming the problem when
    only some files are given or one cannot be read."""
    files = [a.tls_cert, a.tls_key, a.tls_ca]
    if not any(files):
        return None
    if not all(files):
        raise ValueError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    try:
        cert, key, ca = (read_regular(f, "TLS file", MAX_PEM_BYTES) for f in files)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return ClientTls(cert, key, ca, a.tls_server_name)


def channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    opts = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.secure_channel(target, creds, options=opts)


@dataclass
class Backoff:
    """Exponential backoff with jitter: initial, initial*factor, ... capped at ``maximum``
    seconds; :meth:`reset` after a success."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 5.0
    jitter: float = 0.2
    _next: float = 0.0

    def reset(self) -> None:
        self._next = 0.0

    def next(self) -> float:
        self._next = (
            self.initial if self._next == 0 else min(self.maximum, self._next * self.factor)
        )
        return self._next * (1 + random.uniform(-self.jitter, self.jitter))


Inventory = pb.SwitchInventory | pb.GpuInventory
# Called with the new state before it is acknowledged; raising marks the epoch failed.
OnState = Callable[[PolicyState, PolicyState, pb.PolicyUpdate], None]


class AgentClient:
    """Register, subscribe, apply, acknowledge; reconnect with backoff until stopped."""

    def __init__(
        self,
        target: str,
        identity: pb.NodeIdentity,
        inventory: Callable[[], Inventory],
        on_state: OnState,
        tls: ClientTls | None = None,
        backoff: Backoff | None = None,
        agent_version: str = "heroserve-agent/0.1",
    ) -> None:
        self.target = target
        self.identity = identity
        self.inventory = inventory
        self.on_state = on_state
        self.tls = tls
        self.backoff = backoff or Backoff()
        self.agent_version = agent_version
        self.state = PolicyState()
        self.session = ""
        self.stop_event = threading.Event()
        self.connects = 0  # successful registrations, for tests and logs
        self._stub: pb_grpc.ControlStub | None = None
        self._call: grpc.Future | None = None
        self._lock = threading.Lock()

    def stop(self) -> None:
        self.stop_event.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def run(self) -> None:
        """Serve until :meth:`stop`."""
        while not self.stop_event.is_set():
            try:
                self._session()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if self.stop_event.is_set():
                    break
                delay = self.backoff.next()
                log.warning(
                    "controller %s: %s (%s); retrying in %.2fs",
                    self.target,
                    code,
                    exc.details() if hasattr(exc, "details") else exc,
                    delay,
                )
                self.stop_event.wait(delay)
            except _Reconnect as exc:
                delay = self.backoff.next()
                log.warning("%s; reconnecting in %.2fs", exc, delay)
                self.stop_event.wait(delay)

    def _session(self) -> None:
        with channel(self.target, self.tls) as ch:
            stub = pb_grpc.ControlStub(ch)
            inv = self.inventory()
            req = pb.RegisterRequest(
                identity=self.identity,
                agent_version=self.agent_version,
                last_applied_epoch=self.state.epoch,
                generation=self.state.generation,
            )
            for name, t in sorted(self.state.tables.items()):
                req.held_tables.add(group_id=name, version=t.version)
            if isinstance(inv, pb.SwitchInventory):
                req.switch_inventory.CopyFrom(inv)
            else:
                req.gpu.CopyFrom(inv)
            resp = stub.Register(req, timeout=10)
            if self.state.generation and resp.generation != self.state.generation:
                log.warning(
                    "controller %s has a new state generation (%s, was %s): it lost its "
                    "database; taking its full state and counting epochs from its own",
                    self.target,
                    resp.generation,
                    self.state.generation,
                )
            self.session = resp.session_id
            self._stub = stub
            self.connects += 1
            log.info(
                "registered %s with %s (controller epoch %d)",
                self.identity.node_id,
                self.target,
                resp.current_epoch,
            )
            call = stub.Subscribe(
                pb.SubscribeRequest(identity=self.identity, session_id=self.session)
            )
            with self._lock:
                self._call = call
            if self.stop_event.is_set():
                call.cancel()
            try:
                for upd in call:
                    self.backoff.reset()
                    self._handle(stub, upd)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED and self.stop_event.is_set():
                    return
                raise
            finally:
                with self._lock:
                    self._call = None
                self._stub = None
            if not self.stop_event.is_set():
                raise _Reconnect("policy stream ended")

    def _handle(self, stub: pb_grpc.ControlStub, upd: pb.PolicyUpdate) -> None:
        new = self.state.applied(upd)
        if new is None:  # never acknowledged: the controller must not count it as applied
            log.info("ignoring stale epoch %d (applied %d)", upd.epoch, self.state.epoch)
            return
        try:
            self.on_state(self.state, new, upd)
        except Exception as exc:  # noqa: BLE001 - reported to the controller, then resync
            log.error("applying epoch %d failed: %s", upd.epoch, exc)
            stub.Ack(
                pb.AckRequest(
                    identity=self.identity,
                    session_id=self.session,
                    epoch=upd.epoch,
                    ok=False,
                    error=str(exc)[:1000],
                ),
                timeout=10,
            )
            raise _Reconnect(f"epoch {upd.epoch} not applied") from exc
        self.state = new
        if upd.epoch == 0:
            return  # the controller has issued no epoch yet (no plan): nothing to ack
        stub.Ack(
            pb.AckRequest(
                identity=self.identity, session_id=self.session, epoch=upd.epoch, ok=True
            ),
            timeout=10,
        )

    def report(self, report: pb.TelemetryReport) -> bool:
        """Send telemetry on the current session; False when not connected or refused."""
        stub = self._stub
        if stub is None or not self.session:
            return False
        report.identity.CopyFrom(self.identity)
        report.session_id = self.session
        try:
            stub.ReportTelemetry(report, timeout=5)
        except grpc.RpcError as exc:
            log.warning("telemetry refused: %s", exc.details() if hasattr(exc, "details") else exc)
            return False
        return True


class _Reconnect(Exception):
    pass
