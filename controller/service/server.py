"""``heroserve controller``: serve the control plane (docs/design.md §9).

    heroserve controller [--listen ADDR] [--db PATH] [--plan PLAN.json] [--topology NAME|FILE]
                         [--tls-cert PEM --tls-key PEM --tls-ca PEM] [--metrics-port N]

With the three TLS files the controller requires client certificates signed by the CA
(mutual TLS). Without them it listens on loopback only (and says it is insecure) unless
``--insecure-listen-any``. The controller also serves ``grpc.health.v1.Health``.

The database is the truth (docs/control-plane.md, "Restart"): ``--plan`` is applied only
when the database has never held that plan, and the log says which case it was.

Link capacities (and the cost model's prices) come from the cluster graph: ``--topology``,
else the built-in each plan's ``topology`` names (a plan never makes the controller open a
file); a plan naming another cluster is refused (FAILED_PRECONDITION; a path,
INVALID_ARGUMENT; at start-up, exit status 2).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import math
import signal
import sqlite3
import sys
import threading
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agents.client import MAX_PEM_BYTES, ClientTls
from agents.cliutil import DefaultsHelpFormatter, UsageError, read_regular, split_address
from agents.logs import add_log_args, setup_logging
from agents.proto.heroserve.v1 import control_pb2_grpc as pb_grpc
from controller.errors import InputError
from controller.service.core import Controller, Options
from controller.service.corelog import route_core_logs
from controller.service.groups import DEFAULT_SLOTS_PER_GROUP
from controller.service.metrics import Metrics
from controller.service.paths import data_dir
from controller.service.planinput import MAX_PLAN_BYTES
from controller.service.servicer import AdminServicer, ControlServicer
from controller.service.slots import MAX_SLOTS, SlotError
from controller.service.store import Store, StoreError

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger("heroserve.controller")

CONTROL_SERVICE = "heroserve.v1.Control"
ADMIN_SERVICE = "heroserve.v1.Admin"
# The largest request the server reads: an ApplyPlan body of MAX_PLAN_BYTES plus its
# framing. Agents' messages are far smaller; gRPC refuses bigger ones with
# RESOURCE_EXHAUSTED before any handler runs.
MAX_MESSAGE_BYTES = MAX_PLAN_BYTES + 4096
# The largest message it sends: a full policy update for one agent. The C++ GPU agent
# reads 4 MiB at most (gRPC's default receive limit), so the controller never sends more.
MAX_SEND_BYTES = 4 << 20
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.max_metadata_size", 16 << 10),
]


@dataclass
class Tls:
    cert: bytes
    key: bytes
    ca: bytes


def listen_host(addr: str) -> str:
    """Host part of ``HOST:PORT`` / ``[V6]:PORT`` (``unix:`` paths give ``unix``); a port
    outside 0..65535 or a malformed address is a UsageError."""
    return split_address(addr, "--listen", lowest_port=0)[0]


def is_loopback(host: str) -> bool:
    if host in ("unix", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tls(cert: str | None, key: str | None, ca: str | None) -> Tls | None:
    given = [x for x in (cert, key, ca) if x]
    if not given:
        return None
    if len(given) != 3:
        raise UsageError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    # regular files only (a folder, a FIFO refused in one line), bounded like the agents'
    files = ((cert, "--tls-cert"), (key, "--tls-key"), (ca, "--tls-ca"))
    tls = Tls(*(read_regular(f, flag, MAX_PEM_BYTES) for f, flag in files))  # type: ignore[arg-type]
    check_pem(tls)
    return tls


def check_pem(tls: Tls | ClientTls) -> None:
    """Refuse TLS files that are not PEM certificates / a private key before gRPC sees them
    (gRPC only fails at the first handshake, far from the cause: a client would call the
    controller unreachable)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    # a client's files may come from HEROSERVE_TLS_* variables: the error names what gave them
    cert_name, key_name, ca_name = getattr(tls, "names", ("--tls-cert", "--tls-key", "--tls-ca"))
    for flag, data in ((cert_name, tls.cert), (ca_name, tls.ca)):
        try:
            x509.load_pem_x509_certificates(data)
        except ValueError:
            raise UsageError(f"{flag}: not a PEM certificate") from None
    try:
        load_pem_private_key(tls.key, password=None)
    except (ValueError, TypeError):
        raise UsageError(f"{key_name}: not an unencrypted PEM private key") from None


# Methods whose handler gets the request serialised, to decode it once in a worker thread
# (servicer.decode_apply_plan): grpc would decode it on the event loop.
RAW_REQUEST_METHODS = frozenset({"ApplyPlan"})


class RawRequests:
    """Stands for a ``grpc.aio.Server`` while generated code registers a service, so the
    methods in ``raw`` are registered without their request deserializer (the handler gets
    bytes); everything else is registered as generated."""

    def __init__(self, server: grpc.aio.Server, raw: frozenset[str]) -> None:
        self.server, self.raw = server, raw

    def add_generic_rpc_handlers(self, handlers: tuple) -> None:
        """Ignored: :meth:`add_registered_method_handlers` registers both kinds."""

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        handlers = {
            name: h._replace(request_deserializer=None) if name in self.raw else h
            for name, h in handlers.items()
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self.server.add_registered_method_handlers(service, handlers)


class ControllerServer:
    """The controller's gRPC server on an asyncio loop (owns core, store, server)."""

    def __init__(
        self,
        store: Store,
        listen: str = "127.0.0.1:0",
        tls: Tls | None = None,
        insecure_listen_any: bool = False,
        options: Options | None = None,
        admin_name: str = "heroserve-admin",
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
        topology: nx.Graph | None = None,
    ) -> None:
        host = listen_host(listen)
        if tls is None and not is_loopback(host) and not insecure_listen_any:
            raise UsageError(
                f"refusing to listen on {listen} without TLS: give --tls-cert/--tls-key/"
                "--tls-ca, listen on loopback, or pass --insecure-listen-any"
            )
        self.store = store
        self.listen = listen
        self.tls = tls
        self.metrics = Metrics()
        self.core = Controller(store, options, self.metrics, topology)
        self._loopback = is_loopback(host)
        self.admin_name = admin_name
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.health = health.aio.HealthServicer()

    async def start(self) -> int:
        # Said when listening, not before: a controller that fails earlier (its database, its
        # --plan) says only why, on one line.
        if self.tls is None and not self._loopback:
            log.warning(
                "INSECURE: listening on %s without TLS (--insecure-listen-any)", self.listen
            )
        elif self.tls is None:
            log.warning("insecure (no TLS): listening on loopback %s only", self.listen)
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_ControlServicer_to_server(
            ControlServicer(self.core, self.tls is not None), self.server
        )
        pb_grpc.add_AdminServicer_to_server(
            AdminServicer(self.core, self.tls is not None, self.admin_name),
            RawRequests(self.server, RAW_REQUEST_METHODS),
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # Server reflection, so grpcurl and other generic clients can list and call methods.
        reflection.enable_server_reflection(
            (CONTROL_SERVICE, ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME),
            self.server,
        )
        try:
            if self.tls is not None:
                creds = grpc.ssl_server_credentials(
                    [(self.tls.key, self.tls.cert)],
                    root_certificates=self.tls.ca,
                    require_client_auth=True,
                )
                self.port = self.server.add_secure_port(self.listen, creds)
            else:
                self.port = self.server.add_insecure_port(self.listen)
        except RuntimeError:  # gRPC's "Failed to bind" (a unix path it cannot create)
            raise UsageError(f"cannot listen on {self.listen}") from None
        if self.port == 0 and not self.listen.startswith("unix"):
            raise UsageError(f"cannot listen on {self.listen}")
        await self.server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for svc in ("", CONTROL_SERVICE, ADMIN_SERVICE):
            await self.health.set(svc, serving)
        if self.metrics_port is not None:
            try:
                self.metrics.serve(self.metrics_port, self.metrics_addr)
            except (OSError, OverflowError, ValueError) as exc:
                await self.server.stop(0)
                raise UsageError(
                    f"--metrics-port {self.metrics_port}: cannot listen on "
                    f"{self.metrics_addr}: {exc}"
                ) from None
            log.info("metrics on http://%s:%d/metrics", self.metrics_addr, self.metrics_port)
        log.info(
            "controller listening on %s (port %d, %s), epoch %d",
            self.listen,
            self.port,
            "mutual TLS" if self.tls else "insecure",
            self.core.epoch,
        )
        return self.port

    async def stop(self, grace: float = 0.5) -> None:
        if self.server is not None:
            await self.health.enter_graceful_shutdown()
            self.core.close()
            await self.server.stop(grace)
            self.server = None


class ThreadedServer:
    """A :class:`ControllerServer` on its own event loop thread (tests, benchmarks)."""

    def __init__(self, server: ControllerServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self.call(server.start())

    def call(self, coro_or_fn):  # noqa: ANN001, ANN201 - a coroutine or a plain callable
        """Run a coroutine (or a callable) on the server's loop and return its result."""
        if asyncio.iscoroutine(coro_or_fn):
            return asyncio.run_coroutine_threadsafe(coro_or_fn, self.loop).result(30)

        async def wrap():  # noqa: ANN202
            return coro_or_fn()

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(30)

    def stop(self) -> None:
        self.call(self.server.stop(0.2))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def load_cluster(spec: str) -> nx.Graph:
    """The cluster graph of ``--topology`` (a built-in name or a topology file), resolved as
    ``heroserve plan --topology`` resolves it."""
    from controller.topology import resolve_topology

    try:
        return resolve_topology(spec)
    except (InputError, OSError) as exc:
        raise UsageError(f"--topology: {exc}") from exc


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not in 1..65535")
    return port


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the problem and exit status 2 (no usage dump)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="heroserve controller",
        description=__doc__.split("\n")[0],
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT, port 0..65535")
    p.add_argument(
        "--db",
        default=str(data_dir() / "controller.db"),
        help="SQLite state file (the default folder is $XDG_DATA_HOME/heroserve)",
    )
    p.add_argument("--plan", help="plan JSON (heroserve plan --json PATH writes one)")
    p.add_argument(
        "--topology",
        help="cluster (built-in name or topology file) of every plan; default: the built-in "
        "each plan names (a plan never makes the controller open a file)",
    )
    p.add_argument("--tls-cert", help="server certificate (PEM)")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-ca", help="CA that signs agents' client certificates (PEM)")
    p.add_argument(
        "--insecure-listen-any",
        action="store_true",
        help="allow a non-loopback address without TLS (logged as insecure)",
    )
    p.add_argument(
        "--admin-name",
        default="heroserve-admin",
        help="certificate name allowed to call the Admin service (TLS only)",
    )
    p.add_argument(
        "--metrics-port", type=_port, help="serve Prometheus /metrics on this port (1..65535)"
    )
    p.add_argument("--metrics-addr", default="127.0.0.1")
    p.add_argument(
        "--default-slots",
        type=int,
        default=1024,
        help="aggregator slots of a switch before it registers",
    )
    p.add_argument(
        "--slots-per-group",
        type=int,
        default=DEFAULT_SLOTS_PER_GROUP,
        help="slots of an INA group whose plan gives no range",
    )
    p.add_argument("--window-s", type=float, default=0.1, help="T_u of policy tables (s)")
    p.add_argument("--gamma", type=float, default=0.5, help="Eq. 18 smoothing factor")
    p.add_argument("--port-file", help="write the bound port here once listening")
    add_log_args(p)
    return p


def check_port_file(path: str) -> None:
    """Refuse a ``--port-file`` that cannot be written before anything listens: a folder, or
    a path whose folder does not exist."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--port-file {path}: is a directory")
    if not p.parent.is_dir():
        raise UsageError(f"--port-file {path}: folder {str(p.parent)!r} does not exist")


def write_port_file(path: str, port: int) -> None:
    """Write the bound port atomically (a reader never sees a partial number)."""
    tmp = Path(path + ".tmp")
    try:
        tmp.write_text(f"{port}\n")
        tmp.replace(path)
    except OSError as exc:
        if tmp.is_file():
            tmp.unlink()
        raise UsageError(f"--port-file {path}: cannot write ({exc.strerror})") from None


async def _serve(server: ControllerServer, port_file: str | None) -> None:
    try:
        port = await server.start()
        if port_file:
            write_port_file(port_file, port)
    except BaseException:
        await server.stop(0)  # the gRPC server is stopped on this loop, before it closes
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop()


def read_plan_file(path: str) -> bytes:
    """The bytes of ``--plan`` (a regular file, bounded; decoding and checks are the
    controller's)."""
    return read_regular(path, "--plan", MAX_PLAN_BYTES)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        if not 0.0 <= args.gamma <= 1.0:
            raise UsageError(f"--gamma {args.gamma} is not in [0, 1]")
        if not (math.isfinite(args.window_s) and 0 < args.window_s <= 3600):
            raise UsageError(f"--window-s {args.window_s} is not in (0, 3600] seconds")
        for flag, n in (
            ("--default-slots", args.default_slots),
            ("--slots-per-group", args.slots_per_group),
        ):
            if not 0 < n <= MAX_SLOTS:
                raise UsageError(f"{flag} {n} is not in 1..{MAX_SLOTS} (16-bit slot index)")
        listen_host(args.listen)  # a malformed address or port: refused before anything opens
        if args.port_file:
            check_port_file(args.port_file)
        tls = load_tls(args.tls_cert, args.tls_key, args.tls_ca)
        plan_text = read_plan_file(args.plan) if args.plan else None
        try:
            Path(args.db).parent.mkdir(parents=True, exist_ok=True)
            store = Store(args.db)
        except (sqlite3.Error, OSError) as exc:
            raise UsageError(f"cannot open state database {args.db}: {exc}") from exc
        try:  # the store holds the database's lock (storedb.hold) until it is closed
            if plan_text is None and store.current_plan() is None:
                raise UsageError(
                    f"no plan: give --plan PLAN.json ({args.db} holds none yet); "
                    "`heroserve plan --json PATH` writes one"
                )
            opts = Options(
                default_slots=args.default_slots,
                slots_per_group=args.slots_per_group,
                window_s=args.window_s,
                gamma=args.gamma,
            )
            cluster = load_cluster(args.topology) if args.topology else None
            server = ControllerServer(
                store,
                args.listen,
                tls,
                args.insecure_listen_any,
                opts,
                args.admin_name,
                args.metrics_port,
                args.metrics_addr,
                cluster,
            )
            if plan_text is not None:
                log.info("%s", server.core.apply_startup_plan(plan_text, args.plan))
            # gRPC's core logs (a refused TLS handshake among them) into our log format
            if route_core_logs():
                setup_logging(args.log_level, args.log_format)  # a handler on the new stderr
            asyncio.run(_serve(server, args.port_file))
        finally:
            store.close()
    except (UsageError, InputError, SlotError) as exc:
        print(f"heroserve controller: {exc}", file=sys.stderr)
        return 2
    except (StoreError, sqlite3.Error) as exc:
        print(f"heroserve controller: database {args.db}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
