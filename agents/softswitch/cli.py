"""Command line of the executable model: ``python -m agents.softswitch --p4runtime ADDR
[--interface [PORT@]NAME ...] [--device-id N] [--p4info PATH]``.

``main(argv)`` is what ``heroserve softswitch`` calls. The P4Runtime stubs need the
pure-Python protobuf runtime, chosen before protobuf is first imported; when ``main`` is
entered in a process where that is not so (the controller's CLI), it re-executes itself
as ``python -m agents.softswitch`` with the variable set, so the caller's process keeps
its own protobuf (docs/design.md §10).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from agents.cliutil import BriefParser, DefaultsHelpFormatter, UsageError, split_address
from agents.logs import add_log_args, setup_logging

ENV = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
log = logging.getLogger("heroserve.softswitch")


def _parser() -> argparse.ArgumentParser:
    p = BriefParser(
        prog="heroserve softswitch",
        description="Executable model of p4/heroserve_ina.p4 with a P4Runtime server.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--p4runtime",
        default="127.0.0.1:9559",
        metavar="ADDR",
        help="host:port of the P4Runtime gRPC server",
    )
    p.add_argument(
        "--interface",
        "-i",
        action="append",
        default=[],
        metavar="[PORT@]NAME",
        help="switch port: interface NAME as port PORT (bare names are numbered from 1)",
    )
    p.add_argument("--device-id", type=int, default=1, help="P4Runtime device id")
    p.add_argument(
        "--p4info",
        type=Path,
        default=None,
        help="load this P4Info at start, so frames are forwarded before a controller connects",
    )
    add_log_args(p)
    return p


def _fail(msg: str) -> int:
    print(f"heroserve softswitch: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the model until SIGINT/SIGTERM; 0 on a clean stop, 2 on bad arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(ENV) != "python":
        env = dict(os.environ, **{ENV: "python"})
        os.execve(sys.executable, [sys.executable, "-m", "agents.softswitch", *argv], env)

    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    setup_logging(args.log_level, args.log_format)
    try:
        host, _ = split_address(args.p4runtime, "--p4runtime", lowest_port=0)
    except UsageError as e:
        return _fail(str(e))
    if not 0 <= args.device_id < 2**64:
        return _fail(f"--device-id {args.device_id} is not a uint64")

    from .ports import PortIO, parse_interface_specs

    try:
        ports = parse_interface_specs(args.interface)
    except ValueError as e:
        return _fail(str(e))

    from google.protobuf import text_format

    from .p4info import P4InfoIndex, load_p4info
    from .pipeline import InaPipeline
    from .server import SoftSwitchP4Runtime, serve
    from .tables import ModelError

    pipeline = InaPipeline()
    service = SoftSwitchP4Runtime(pipeline, device_id=args.device_id)
    if args.p4info is not None:
        try:
            index = P4InfoIndex(load_p4info(args.p4info))
            index.check_against(pipeline)
        except (UsageError, text_format.ParseError, ModelError) as e:
            return _fail(f"--p4info {args.p4info}: {e}")
        service.p4info = index

    def process(port: int, frame: bytes) -> list[tuple[int, bytes]]:
        # No pipeline config yet: drop everything, as simple_switch_grpc --no-p4 does.
        if service.p4info is None:
            return []
        return pipeline.process(port, frame)

    io = PortIO(ports, process)
    try:
        io.open()
    except OSError as e:
        return _fail(str(e))
    try:
        server, bound = serve(service, args.p4runtime)
    except (OSError, RuntimeError) as e:
        io.close()
        return _fail(f"cannot serve P4Runtime on {args.p4runtime}: {e}")
    io.start()
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        log.warning("P4Runtime served without TLS on %s", args.p4runtime)
    log.info(
        "device %d: P4Runtime on %s:%d, ports %s",
        args.device_id,
        host,
        bound,
        ", ".join(f"{n}@{name}" for n, name in sorted(ports.items())) or "none",
    )
    # Tests read this line to learn the bound port when they ask for port 0.
    print(f"P4RUNTIME_PORT={bound}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()
    io.close()
    log.info("stopped")
    return 0
