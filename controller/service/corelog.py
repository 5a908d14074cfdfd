"""gRPC C-core's own log lines, routed into the controller's log format (agents/logs.py).

gRPC's C core writes to file descriptor 2 through absl logging, in its own format
(``I1129 05:05:47.817386 11745 ssl_transport_security.cc:2563] Handshake failed ...``),
outside Python's ``logging``. :func:`route_core_logs` points descriptor 2 at a pipe, keeps
Python's ``sys.stderr`` on the original descriptor, and re-logs each core line from a thread:

- a failed TLS handshake becomes one line of our own naming the mismatch (a plaintext client
  at a TLS controller, a client certificate the CA did not sign), at most one per kind every
  :data:`RATE_S` seconds, the next one counting those left out;
- any other line becomes ``grpc: MESSAGE`` (made printable, bounded) at the line's level.

:func:`handshake_kind` and :class:`CoreLogRelay` are the pieces tests drive directly.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time

log = logging.getLogger("heroserve.controller")

RATE_S = 10.0  # one line per kind of refused handshake per 10 s: a retrying agent every 0.1 s
MAX_LINE = 300  # characters of a core line kept (a line is data from gRPC, never trusted)

# absl's prefix: severity letter, MMDD, time, thread id, file:line]
_CORE = re.compile(r"^([IWEF])\d{4} [0-9:.]+\s+\d+ \S+:\d+\] ?(.*)$")
_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}

# OpenSSL/BoringSSL reasons of a server-side handshake failure, and what they mean here
KINDS = {
    "WRONG_VERSION_NUMBER": "a client spoke plaintext to this mutual-TLS controller (give it "
    "--tls-cert/--tls-key/--tls-ca or HEROSERVE_TLS_*)",
    "HTTP_REQUEST": "a client spoke plaintext HTTP to this mutual-TLS controller",
    "CERTIFICATE_VERIFY_FAILED": "a client's certificate is not signed by this controller's "
    "--tls-ca (wrong CA)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "a client sent no certificate (mutual TLS needs one)",
}


def handshake_kind(message: str) -> str | None:
    """The :data:`KINDS` key of a core "Handshake failed" message ("OTHER" for a reason not
    listed), None for any other message."""
    if "Handshake failed" not in message:
        return None
    return next((k for k in KINDS if k in message), "OTHER")


class CoreLogRelay:
    """Turns core lines into records of ``logger``, rate-limiting refused handshakes."""

    def __init__(self, logger: logging.Logger = log, rate_s: float = RATE_S) -> None:
        self.log, self.rate_s = logger, rate_s
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def line(self, text: str, now: float | None = None) -> None:
        text = "".join(c if c.isprintable() else "?" for c in text.rstrip("\r\n"))[:MAX_LINE]
        if not text:
            return
        m = _CORE.match(text)
        level, msg = (_LEVELS[m.group(1)], m.group(2)) if m else (logging.WARNING, text)
        kind = handshake_kind(msg)
        if kind is None:
            self.log.log(level, "grpc: %s", msg)
            return
        now = time.monotonic() if now is None else now
        if now - self._last.get(kind, -1e18) < self.rate_s:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return
        self._last[kind] = now
        more = self._left_out.pop(kind, 0)
        what = KINDS.get(kind, "a client's TLS handshake failed")
        self.log.warning(
            "TLS handshake refused: %s", what, extra={"reason": kind, "refused_since_last": more}
        )


_routed = False


def route_core_logs(relay: CoreLogRelay | None = None) -> bool:
    """Route descriptor 2 (gRPC's core logs) through ``relay``; Python's ``sys.stderr``, and
    so every handler made after this call, keeps writing to the original stderr. Call once,
    before logging is set up, in a process that owns its stderr (the controller's ``main``).
    Done once per process, and not when ``sys.stderr`` was replaced already (a test
    runner capturing output, an embedding program): theirs is left alone. True if routed."""
    global _routed
    if _routed or sys.stderr is not sys.__stderr__:
        return False
    _routed = True
    relay = relay or CoreLogRelay()
    original = os.dup(2)
    sys.stderr = open(original, "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with open(read_fd, encoding="utf-8", errors="replace") as lines:
            for text in lines:
                try:
                    relay.line(text)
                except Exception:  # noqa: BLE001 - a relay bug must not kill the pump
                    pass

    threading.Thread(target=pump, name="grpc-core-log", daemon=True).start()
    return True
