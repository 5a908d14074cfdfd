"""``heroserve-switch-agent``: one process per switch (docs/design.md §10).

    heroserve-switch-agent --switch ADDR --controller ADDR --device-id N [--node-id ID]
        [--port PORT=PEER[,mac=MAC][,ip=IPV4][,gbps=G]] ... [--p4info PATH]
        [--device-config PATH] [--tls-cert PEM --tls-key PEM --tls-ca PEM]

``--port`` describes what is behind each switch port (the peer's node name in the
controller's topology, and its NIC addresses for result delivery); the controller uses it
to map INA workers to ports.
"""

import os

# p4runtime-shell's stubs come from an old protoc: they need the pure-Python protobuf
# runtime, which must be chosen before anything imports protobuf (docs/design.md §10).
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from agents import __version__  # noqa: E402
from agents.client import CONTROLLER_ENV, add_tls_args  # noqa: E402
from agents.cliutil import (  # noqa: E402
    DefaultsHelpFormatter,
    UsageError,
    missing_dependency,
    read_regular,
    split_address,
)
from agents.logs import add_log_args, setup_logging  # noqa: E402

log = logging.getLogger("heroserve.switch")
# --device-config is a compiled program (BMv2 JSON); 64 MiB bounds a wrong file given as one.
MAX_DEVICE_CONFIG_BYTES = 64 << 20


def parse_port(spec: str) -> "PortInfo":  # noqa: F821, UP037 - imported lazily below
    """``"3=h3,mac=02:00:00:00:00:03,ip=10.0.0.3,gbps=100"`` -> PortInfo."""
    from agents.switch.tables import PortInfo, ipv4_int, mac_int

    head, *opts = spec.split(",")
    port_s, sep, peer = head.partition("=")
    if not sep or not port_s.strip().isdigit() or not peer.strip():
        raise UsageError(f"--port {spec!r}: expected PORT=PEER[,mac=..][,ip=..][,gbps=..]")
    port = int(port_s)
    if not 0 <= port < 512:
        raise UsageError(f"--port {spec!r}: port {port} is outside 0..511 (bit<9>)")
    kw: dict[str, str] = {}
    for o in opts:
        k, sep, v = o.partition("=")
        if not sep or k not in ("mac", "ip", "gbps"):
            raise UsageError(f"--port {spec!r}: unknown option {o!r}")
        kw[k] = v
    try:
        if "mac" in kw:
            mac_int(kw["mac"])
        if "ip" in kw:
            ipv4_int(kw["ip"])
        gbps = float(kw.get("gbps", "100"))
        if not gbps > 0:
            raise ValueError("gbps must be > 0")
    except ValueError as exc:
        raise UsageError(f"--port {spec!r}: {exc}") from exc
    # Gb/s at the edge of the program, bytes/s inside.
    return PortInfo(port, peer.strip(), kw.get("mac", ""), kw.get("ip", ""), gbps * 1e9 / 8)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="heroserve-switch-agent",
        description=__doc__.split("\n")[0],
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--switch", required=True, help="P4Runtime address of the switch HOST:PORT")
    p.add_argument("--controller", help=f"controller address HOST:PORT [{CONTROLLER_ENV}]")
    p.add_argument("--device-id", type=int, required=True, help="P4Runtime device id")
    p.add_argument("--node-id", help="switch node name in the topology (default: s<device-id>)")
    p.add_argument("--port", action="append", default=[], help="PORT=PEER[,mac=][,ip=][,gbps=]")
    p.add_argument("--p4info", help="P4Info text file (default: the repository's)")
    p.add_argument("--device-config", help="device config (BMv2 JSON); default empty")
    p.add_argument("--slots", type=int, default=1024, help="aggregator slots of the program")
    p.add_argument("--telemetry-interval", type=float, default=1.0, help="seconds")
    add_tls_args(p, "this switch (heroserve pki issue DIR --name NODE)")
    add_log_args(p)
    p.add_argument("--version", action="version", version=f"heroserve-switch-agent {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    setup_logging(args.log_level, args.log_format)
    try:
        agent = _build(args)
    except UsageError as exc:
        print(f"heroserve-switch-agent: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # p4runtime-shell is installed apart (docs/install.md)
        install = "pip install 'heroserve[switch]', then pip install --no-deps p4runtime-shell"
        return missing_dependency(exc, "heroserve-switch-agent", install)

    def _stop(*_: object) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run()
    return 0


def _build(args: argparse.Namespace):  # noqa: ANN202 - SwitchAgent, imported lazily
    from agents.client import controller_from_args, tls_from_args
    from agents.switch.agent import SwitchAgent
    from agents.switch.p4rt import DEFAULT_P4INFO, SwitchConnection, SwitchError, load_p4info

    if not 0 <= args.device_id < 2**64:
        raise UsageError(f"--device-id {args.device_id} is not a uint64")
    if args.slots <= 0 or args.telemetry_interval <= 0:
        raise UsageError("--slots and --telemetry-interval must be > 0")
    split_address(args.switch, "--switch")  # a port past 65535 is refused, never wrapped
    controller = controller_from_args(args)  # the flag, else HEROSERVE_CONTROLLER, checked
    ports = {}
    for spec in args.port:
        p = parse_port(spec)
        if p.port in ports:
            raise UsageError(f"--port {p.port} given twice")
        ports[p.port] = p
    try:
        p4info = load_p4info(args.p4info or DEFAULT_P4INFO)
    except SwitchError as exc:
        raise UsageError(str(exc)) from exc
    config = b""
    if args.device_config:
        config = read_regular(args.device_config, "--device-config", MAX_DEVICE_CONFIG_BYTES)
    try:
        tls = tls_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    conn = SwitchConnection(args.switch, args.device_id, p4info, config)
    return SwitchAgent(
        args.node_id or f"s{args.device_id}",
        conn,
        controller,
        ports,
        aggregator_slots=args.slots,
        tls=tls,
        telemetry_interval_s=args.telemetry_interval,
    )


if __name__ == "__main__":
    sys.exit(main())
