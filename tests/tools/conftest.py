"""The engine environments the tests marked ``engines`` run (tools/engines.sh): opt-in, since
they take many minutes and GBs of packages. Set ``HEROSERVE_ENGINES`` to their folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def engines_dir() -> Path:
    """``$HEROSERVE_ENGINES``, or a skip that says why."""
    value = os.environ.get("HEROSERVE_ENGINES")
    if not value:
        pytest.skip("HEROSERVE_ENGINES is not set (tools/engines.sh makes the environments)")
    folder = Path(value)
    for exe in ("vllm/bin/vllm-router", "sglang/bin/python"):
        if not (folder / exe).exists():
            pytest.skip(f"no {exe} in {folder} (tools/engines.sh)")
    return folder
