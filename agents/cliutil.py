"""What every HeroServe command line shares (controller and agents alike).

:class:`DefaultsHelpFormatter`: ``--help`` shows each option's default; like
``argparse.ArgumentDefaultsHelpFormatter``, but also for options given no help text, and
not for defaults that mean "not given" (None, False, an empty list) or that the help text
already states. :func:`missing_dependency`: one line when an extra is not installed.
:class:`UsageError`: a bad command line or configuration, one line and exit status 2.
:func:`split_address`: ``HOST:PORT``, ``[V6]:PORT`` or ``unix:PATH`` checked (a port out of
range is refused, never wrapped). :class:`BriefParser`: argparse whose errors are one line
(``PROG: error: MESSAGE``, exit 2) without the usage block. :func:`read_regular`: a file's
bytes, bounded, refusing what is not a regular file (a FIFO would block the read forever)."""

from __future__ import annotations

import argparse
import copy
import os
import stat
import sys
from typing import NoReturn


class UsageError(Exception):
    """Bad command line or configuration: the message is the one line the user sees, and the
    command exits with status 2."""


class BriefParser(argparse.ArgumentParser):
    """A bad command line: one line naming the problem and exit status 2 (``--help`` shows
    the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _shows_default(action: argparse.Action) -> bool:
    d = action.default
    # identity, not equality: a default of 0 or 0.0 is a value to show (0 == False)
    unset = d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, list) and not d)
    return bool(action.option_strings) and not unset


class DefaultsHelpFormatter(argparse.HelpFormatter):
    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _shows_default(action):
            action = copy.copy(action)  # argparse prints no help line for an empty help
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not _shows_default(action) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def missing_dependency(exc: ModuleNotFoundError, prog: str, install: str) -> int:
    """One line for a third-party module this installation lacks (an extra not installed),
    exit status 2; our own modules missing is a broken installation: re-raised."""
    if (exc.name or "").split(".")[0] in ("controller", "agents"):
        raise exc
    print(
        f"{prog}: error: {exc.name} is not installed: {install} (docs/install.md)", file=sys.stderr
    )
    return 2


def _printable(text: str) -> bool:
    return text.isprintable() and not any(c.isspace() for c in text)


def split_address(addr: str, flag: str, lowest_port: int = 1) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``[V6]:PORT``; ``("unix", 0)`` for ``unix:PATH`` and
    ``unix-abstract:NAME`` (gRPC's forms). The port must be in ``lowest_port..65535`` (0 is a
    listener's "any port"); a larger number is refused, since a socket API would wrap it
    (99999 dials 34463). UsageError naming ``flag`` otherwise."""
    if not _printable(addr):
        raise UsageError(f"{flag} {addr!r}: spaces or control characters in an address")
    if addr.startswith(("unix:", "unix-abstract:")):
        if not addr.partition(":")[2]:
            raise UsageError(f"{flag} {addr!r}: no socket path after 'unix:'")
        return "unix", 0
    if addr.startswith("["):
        host, close, rest = addr[1:].partition("]")
        port = rest.removeprefix(":")
        if not close or not host or not rest.startswith(":"):
            raise UsageError(f"{flag} {addr!r} is not [IPV6]:PORT")
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or ":" in host:
            raise UsageError(f"{flag} {addr!r} is not HOST:PORT")
    if not (port.isascii() and port.isdigit()) or not lowest_port <= int(port) <= 65535:
        raise UsageError(f"{flag} {addr!r}: port {port or '(none)'} is not in {lowest_port}..65535")
    return host, int(port)


def read_regular(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``). A FIFO, device or
    folder is refused before it is read (reading a FIFO blocks until a writer comes);
    UsageError naming ``what`` and the path, never the content."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"{what} {str(path)!r}: cannot open ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder
        os.close(fd)
        raise UsageError(f"{what} {str(path)!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise UsageError(f"{what} {str(path)!r}: cannot read ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise UsageError(f"{what} {str(path)!r} is larger than {max_bytes} bytes")
    return data
