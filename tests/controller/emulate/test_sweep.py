"""Sweeping what a dead emulation run left (controller/emulate/sweep.py), without Mininet: a
run is faked by its work dir, a shared-memory segment and a process carrying its tag. A run
whose process is gone is swept; a live run, and a work dir whose file names another run,
are left alone; the watchdog sweeps when its run is killed and leaves when released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT

from controller.emulate.sweep import (
    ENV_TAG,
    RUN_FILE,
    SHM_DIR,
    WORKDIR_PREFIX,
    shm_prefix,
    start_time,
    sweep_dead_runs,
    tagged_pids,
)

GUARD_S = 120  # a hang guard only: each wait below ends on its condition


def _until(cond, what: str) -> None:  # noqa: ANN001 - a callable returning bool
    deadline = time.monotonic() + GUARD_S
    while not cond():
        assert time.monotonic() < deadline, f"not within {GUARD_S} s: {what}"
        time.sleep(0.05)


class FakeRun:
    """A run's traces: work dir under ``tmp``, a segment, a tagged process."""

    def __init__(self, tmp: Path, tag: str, pid: int, started: int | None) -> None:
        self.tag = tag
        self.workdir = tmp / f"{WORKDIR_PREFIX}{tag}-x1"
        self.workdir.mkdir()
        doc = {"tag": tag, "pid": pid, "start_time": started}
        (self.workdir / RUN_FILE).write_text(json.dumps(doc))
        self.segment = SHM_DIR / f"heroserve-{shm_prefix(tag)}prefill.0.0"
        self.segment.write_bytes(b"\0" * 64)
        env = dict(os.environ, **{ENV_TAG: tag})
        self.proc = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)
        _until(lambda: self.proc.pid in tagged_pids(tag), "the tagged process shows")

    def present(self) -> tuple[bool, bool, bool]:
        return self.workdir.exists(), self.segment.exists(), self.proc.poll() is None

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self.segment.unlink(missing_ok=True)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[FakeRun]]:
    made: list[FakeRun] = []
    yield made
    for r in made:
        r.cleanup()


def test_dead_runs_are_swept_and_live_ones_kept(tmp_path: Path, runs: list[FakeRun]) -> None:
    me = os.getpid()
    dead = FakeRun(tmp_path, "hzd1", _dead_pid(), 12345)
    reused = FakeRun(tmp_path, "hzd2", me, (start_time(me) or 0) + 1)  # pid reused since
    live = FakeRun(tmp_path, "hzl1", me, start_time(me))
    runs += [dead, reused, live]
    forged = FakeRun(tmp_path, "hzl2", _dead_pid(), 1)
    runs.append(forged)  # its file names another tag than its folder: not trusted
    (forged.workdir / RUN_FILE).write_text(json.dumps({"tag": "hzl1", "pid": 1, "start_time": 1}))
    swept = sweep_dead_runs(tmp_path)
    assert sorted(swept) == ["hzd1", "hzd2"]
    assert swept["hzd1"]["shm"] == [dead.segment.name]
    for r in (dead, reused):
        _until(lambda r=r: r.proc.poll() is not None, "the killed process is reaped")
        assert r.present() == (False, False, False)
    assert live.present() == (True, True, True)
    assert forged.present() == (True, True, True)


def _owner(tmp: Path, tag: str, release: bool) -> subprocess.Popen:
    """A process that starts a watchdog for ``tag`` and, with ``release``, releases it."""
    code = (
        "import sys, time; from pathlib import Path\n"
        "from controller.emulate.sweep import start_watchdog\n"
        f"w = start_watchdog({tag!r}, Path({str(tmp)!r}))\n"
        f"{'w.release()' if release else ''}\n"
        "print('ready', w.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("killed", [True, False])
def test_watchdog_sweeps_a_killed_run_only(
    tmp_path: Path, runs: list[FakeRun], killed: bool
) -> None:
    run = FakeRun(tmp_path, "hzw1" if killed else "hzw2", os.getpid(), start_time(os.getpid()))
    runs.append(run)
    owner = _owner(run.workdir, run.tag, release=not killed)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert line[0] == "ready"
        watchdog = int(line[1])
        owner.kill()  # SIGKILL: no teardown of its own
        owner.wait(30)
        if killed:
            _until(lambda: not run.workdir.exists(), "the watchdog swept the work dir")
            _until(lambda: run.proc.poll() is not None, "the tagged process was killed")
            assert not run.segment.exists()
        else:  # released: it left at once, without sweeping
            _until(lambda: not Path(f"/proc/{watchdog}").exists(), "the watchdog exited")
            assert run.present() == (True, True, True)
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.communicate()
