"""Running a test's callables at once, each in its own thread.

Holds :func:`in_threads`, for tests where every member of a group must be in a blocking
call together (an all-reduce, a ring connect) before any of them can return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

JOIN_GUARD_S = 120  # a hang guard per thread, not a measurement


def in_threads(fns: list[Callable[[], object]]) -> list[object]:
    """Each ``fns[i]()`` in its own thread, their results in order; the first exception any
    of them raised is raised here, in the caller's thread."""
    out: list[object] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_GUARD_S)
    if errors:
        raise errors[0]
    return out
