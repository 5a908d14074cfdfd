"""Files the project ships beside its code: the P4 programs, the P4Info and the .proto files.

In a checkout they are at the repository root (``p4/``, ``proto/``); an installed wheel
carries copies under ``agents/_data/`` (setup.py puts them there). :func:`shipped` finds
either, so the same code runs from a checkout and from an installation."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_INSTALLED = _PACKAGE / "_data"
_CHECKOUT = _PACKAGE.parent


def shipped(relpath: str) -> Path:
    """``relpath`` (e.g. ``"p4/heroserve_ina.p4info.txtpb"``) in the wheel's data, else in
    the checkout; the checkout's path when neither has it (the caller's open fails, naming
    it)."""
    installed = _INSTALLED / relpath
    return installed if installed.exists() else _CHECKOUT / relpath
