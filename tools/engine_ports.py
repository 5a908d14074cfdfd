"""The ports an end-to-end engine run binds, checked before anything starts
(docs/engine-check.md): a port another process holds (a router left by an earlier run keeps
29000, its Prometheus exporter's default) is named in one line with the process that holds it,
instead of an engine or router dying minutes later.

Holds: ``free_port`` (a port the tool may choose), ``holder`` (who listens on a port, from
/proc), ``needed_ports`` (the ports of an export's commands as this machine runs them) and
``check_ports`` (the one-line refusal).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

LISTEN = "0A"  # /proc/net/tcp's state of a listening socket
MAX_CMDLINE = 120  # characters of a holder's command line shown
# the flags that carry a port to bind in an engine's or router's argv, and what they are
PORT_FLAGS = {
    "--port": "HTTP port",
    "--prometheus-port": "Prometheus exporter",
    "--disaggregation-bootstrap-port": "bootstrap port",
}
PORT_ENV = {"VLLM_NIXL_SIDE_CHANNEL_PORT": "NIXL side channel"}


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice); for a port the tool chooses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on every address (as the engines' 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """``pid N (command line)`` of a process listening on ``port``, or None when none this
    user can see does."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port, proc)}
    if not inodes:
        return None
    for pid in sorted((d for d in os.listdir(proc) if d.isdigit()), key=int):
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / pid / "fd" / fd) in inodes:
                    raw = (proc / pid / "cmdline").read_bytes()[: MAX_CMDLINE * 4]
                    # one line: a command line may hold newlines (python -c '...')
                    cmd = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
                    return f"pid {pid} ({cmd[:MAX_CMDLINE]})"
            except OSError:
                continue
    return None


def needed_ports(runs: list[tuple[str, list[str], dict[str, str]]]) -> dict[int, str]:
    """Port -> what binds it, for each (name, argv, env) about to start. vLLM's NIXL side
    channel is one port per instance (its data-parallel index 0 adds nothing)."""
    need: dict[int, str] = {}
    for name, argv, env in runs:
        for i, arg in enumerate(argv[:-1]):
            if arg in PORT_FLAGS and argv[i + 1].isdigit():
                need.setdefault(int(argv[i + 1]), f"{name}'s {PORT_FLAGS[arg]} ({arg})")
        for var, what in PORT_ENV.items():
            if env.get(var, "").isdigit():
                need.setdefault(int(env[var]), f"{name}'s {what} ({var})")
    return need


def check_ports(need: dict[int, str]) -> str | None:
    """One line naming each needed port already held and who holds it; None when all are
    free."""
    held = [
        f"port {port}, {what}, is held by {holder(port) or 'a process this user cannot see'}"
        for port, what in sorted(need.items())
        if not bindable(port)
    ]
    return "; ".join(held) or None
