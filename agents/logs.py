"""One log format for every HeroServe process, Python and C++ alike.

Text (the default), one line per record, UTC with milliseconds::

    2026-11-23T05:12:00.123Z INFO heroserve.controller plan applied epoch=3 plan=ab12

``--log-format json``: one JSON object per line with the keys ``ts``, ``level``, ``logger``
and ``msg``, plus the record's extra fields (``log.info("plan applied", extra={"epoch": 3})``)
and ``exc`` when an exception is attached.

The controller, the switch agent and the executable switch call :func:`setup_logging` with
what :func:`add_log_args` parsed. It lives under ``agents/`` so that a switch agent installed
without the controller (``heroserve[switch]``) has it too.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# What every LogRecord carries; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def utc_timestamp(created: float) -> str:
    """``2026-11-23T05:12:00.123Z`` for a ``time.time()`` value."""
    whole, ms = divmod(round(created * 1000), 1000)  # rounded: 0.123 is 0.12299... in binary
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _plain(value: Any) -> str:
    s = str(value)
    # quote values a reader (or a parser splitting on spaces) would otherwise misread
    return json.dumps(s) if not s or any(c in s for c in ' ="\n') else s


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        fields = " ".join(f"{k}={_plain(v)}" for k, v in extra_fields(record).items())
        line = f"{utc_timestamp(record.created)} {record.levelname} {record.name} {msg}"
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in extra_fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def add_log_args(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, the same in every command."""
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LEVELS, help="least severe level"
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text: 'UTC-TIME LEVEL LOGGER message key=value'; json: one object per line",
    )


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send every record to stderr in the shared format. Like ``logging.basicConfig``, this
    leaves a root logger that already has someone else's handlers alone (a test runner
    capturing logs, an embedding program); it replaces a handler it installed before."""
    root = logging.getLogger()
    if any(not getattr(h, "_heroserve", False) for h in root.handlers):
        return
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt))
    handler._heroserve = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
