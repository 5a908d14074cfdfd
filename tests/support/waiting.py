"""Waiting in tests on a condition, never on time.

Holds :data:`HANG_GUARD_S` and :func:`wait_for`. The guard only stops a test that would
otherwise hang: a correct run returns as soon as its condition holds, so the guard is set for
the slowest machine the suite must pass on (CI on a shared 2-core machine with ``stress-ng
--cpu 4`` beside it, where starting a Python process with grpc takes tens of seconds), not
for a typical run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HANG_GUARD_S = 300.0
POLL_S = 0.05


def wait_for(what: str, fn: Callable[[], object], timeout: float = HANG_GUARD_S) -> object:
    """Poll ``fn`` until it returns a truthy value, and return that value; past ``timeout``
    seconds, fail the test naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
