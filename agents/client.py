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
import os
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc

from agents.cliutil import UsageError, read_regular, split_address
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
    # where cert, key and ca came from (a flag or a HEROSERVE_TLS_* variable), for errors
    names: tuple[str, str, str] = ("--tls-cert", "--tls-key", "--tls-ca")


# The environment's stand-ins for absent flags (docs/control-plane.md, "Environment"): a flag
# given on the command line wins; a variable set but empty counts as unset.
CONTROLLER_ENV = "HEROSERVE_CONTROLLER"
TLS_ENV = {"tls_cert": "HEROSERVE_TLS_CERT", "tls_key": "HEROSERVE_TLS_KEY",
           "tls_ca": "HEROSERVE_TLS_CA"}  # fmt: skip


def add_tls_args(p: argparse.ArgumentParser, who: str = "this agent") -> None:
    """The client TLS flags, the same in the switch agent and ``heroserve admin``."""
    env = TLS_ENV
    p.add_argument("--tls-cert", help=f"client certificate (PEM) naming {who} [{env['tls_cert']}]")
    p.add_argument("--tls-key", help=f"client private key (PEM) [{env['tls_key']}]")
    p.add_argument("--tls-ca", help=f"CA of the controller's certificate (PEM) [{env['tls_ca']}]")
    p.add_argument("--tls-server-name", help="name expected in the controller's certificate")


def from_env(value: str | None, flag: str, var: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(value, name): the flag's value and ``flag`` when given, else the variable's and
    ``var`` (empty when neither is set). The name is what an error about the value cites."""
    if value:
        return value, flag
    got = env.get(var, "")
    if got and not got.isprintable():  # a newline or escape would forge a log or error line
        raise UsageError(f"{var}: control characters in the value")
    return got, var


def controller_from_args(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> str:
    """``--controller``, else ``HEROSERVE_CONTROLLER``, checked as an address (UsageError
    naming whichever gave it); ``a.controller_default`` (None: required) when neither."""
    env = os.environ if env is None else env
    addr, name = from_env(a.controller, "--controller", CONTROLLER_ENV, env)
    if not addr:
        default = getattr(a, "controller_default", None)
        if default is None:
            raise UsageError(
                f"the controller's address is needed: --controller or {CONTROLLER_ENV}"
            )
        addr = default
    split_address(addr, name)  # 99999 must not dial 34463
    return addr


def tls_from_args(a: argparse.Namespace, env: Mapping[str, str] | None = None) -> ClientTls | None:
    """What :func:`add_tls_args` parsed, each absent flag taken from its ``HEROSERVE_TLS_*``
    variable: None without TLS; ValueError naming the flag or variable when only some files
    are given or one cannot be read."""
    env = os.environ if env is None else env
    try:
        got = [
            from_env(getattr(a, dest), "--" + dest.replace("_", "-"), var, env)
            for dest, var in TLS_ENV.items()
        ]
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    if not any(v for v, _ in got):
        return None
    if not all(v for v, _ in got):
        missing = " and ".join(
            f"--{dest.replace('_', '-')} (or {var})"
            for (dest, var), (v, _) in zip(TLS_ENV.items(), got, strict=True)
            if not v
        )
        raise ValueError(f"mutual TLS needs all of the three TLS files; missing {missing}")
    try:
        cert, key, ca = (read_regular(v, name, MAX_PEM_BYTES) for v, name in got)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return ClientTls(cert, key, ca, a.tls_server_name, tuple(name for _, name in got))


def channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    opts = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.secure_channel(target, creds, options=opts)


PROBE_TIMEOUT_S = 3.0  # one TCP connect and one TLS handshake on a controller that answered


def tls_mismatch(
    target: str, tls: ClientTls | None, timeout: float = PROBE_TIMEOUT_S
) -> str | None:
    """Why a controller that gRPC could not talk to refused us, when the cause is TLS: a
    sentence, or None when the probe cannot tell (nothing listens, a unix socket, a timeout).

    The probe opens a TLS handshake of its own, verifying nothing, and looks at what comes
    back: a certificate (or a TLS alert) means the controller speaks TLS; bytes that are not
    TLS (gRPC's plaintext HTTP/2 answer) mean it does not. With ``tls`` given, the
    certificate is then checked against ``tls.ca``, so a wrong CA is named too."""
    import socket
    import ssl

    if target.startswith(("unix:", "unix-abstract:")):
        return None
    try:
        host, port = split_address(target, "--controller")
    except UsageError:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            try:
                with ctx.wrap_socket(raw, server_hostname=host) as s:
                    der = s.getpeercert(binary_form=True)
            except ssl.SSLError as exc:
                speaks_tls = "ALERT" in (exc.reason or "")  # an alert is a TLS record
                der = None
            else:
                speaks_tls = der is not None
    except (OSError, ValueError):
        return None  # nothing listens, or the handshake timed out: gRPC's own words stand
    if tls is None:
        if speaks_tls:
            return ("the controller requires TLS: give --tls-cert, --tls-key and --tls-ca (or "
                    "HEROSERVE_TLS_CERT, _KEY, _CA)")  # fmt: skip
        return None
    if not speaks_tls:
        return "the controller does not speak TLS (it listens in plaintext): drop the TLS files"
    if der is not None and not _signed_by(der, tls.ca):
        return f"the controller's certificate is not signed by the CA of {tls.names[2]}"
    return None


def _signed_by(der: bytes, ca_pem: bytes) -> bool:
    """Whether certificate ``der`` is signed by one of the certificates in ``ca_pem``."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    cert = x509.load_der_x509_certificate(der)
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return True  # not ours to judge here: check_pem refuses such a file first
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):  # another issuer, key type
            continue
    return False


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
        # a TLS mismatch found by one probe per outage (tls_mismatch), said on every retry
        self._probed_at = -1  # self.connects when last probed
        self._mismatch: str | None = None

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
                if code == grpc.StatusCode.UNAVAILABLE and self._probed_at != self.connects:
                    self._probed_at, self._mismatch = (
                        self.connects,
                        tls_mismatch(self.target, self.tls),
                    )
                why = exc.details() if hasattr(exc, "details") else exc
                if code == grpc.StatusCode.UNAVAILABLE and self._mismatch:
                    code, why = "TLS mismatch", self._mismatch
                log.warning(
                    "controller %s: %s (%s); retrying in %.2fs", self.target, code, why, delay
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
