"""Where HeroServe keeps state and output by default: out of the repository and the current
folder, in the XDG data directory (``$XDG_DATA_HOME/heroserve``, else
``~/.local/share/heroserve``), as freedesktop.org's base-directory specification puts
user data."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or ""
    # the specification: a relative XDG_DATA_HOME is invalid and must be ignored
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / "heroserve"
