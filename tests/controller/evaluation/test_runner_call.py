"""``Runner.call``: a module-level function over items, in order, in this process or on the
pool, with one progress line per job done."""

from __future__ import annotations

import os

import pytest

from controller.errors import WorkerLost
from controller.evaluation.sweep import Runner


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_back_in_the_items_order(workers):
    said: list[str] = []
    with Runner(workers, progress=said.append) as run:
        out = run.call(_square_and_pid, [5, 1, 4, 2, 3], "squares")
    assert [r for r, _ in out] == [25, 1, 16, 4, 9]
    pids = {p for _, p in out}
    # one worker runs here; a pool runs its jobs in other processes
    assert (pids == {os.getpid()}) == (workers == 1)
    assert said[-1] == f"squares: 5/5 done ({workers} worker(s))"
    assert len(said) == 5


def test_no_items_no_work():
    with Runner(1) as run:
        assert run.call(_square_and_pid, [], "nothing") == []


def _die(x: int) -> int:
    os._exit(9)  # as the kernel's out-of-memory killer leaves a worker: gone mid-job


def test_a_worker_that_dies_is_one_line_not_the_pools_traceback():
    with (
        Runner(2) as run,
        pytest.raises(WorkerLost, match="a worker process died .* fewer --workers"),
    ):
        run.call(_die, [1, 2])
