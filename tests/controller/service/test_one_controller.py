"""One controller per database (no split brain): a second ``heroserve controller`` on
the same ``--db`` refused in one line, exit 2, while the first runs; the lock freed when the
first stops any way (closed, killed), so a restart is never locked out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.waiting import wait_for

from controller.service.sample import sample_plan, save_sample_topology
from controller.service.store import Store, StoreError, StoreInUse


def test_a_second_store_on_one_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    a = Store(db)
    with pytest.raises(StoreInUse, match=rf"in use by another controller \(pid {os.getpid()}\)"):
        Store(db)
    a.set_meta("k", "v")
    reader = Store(db, readonly=True)  # beside the holder: reads, takes no lock
    assert reader.get_meta("k") == "v"
    with pytest.raises(Exception, match="readonly"):
        reader.set_meta("k", "w")
    reader.close()
    a.close()
    b = Store(db)  # closed: free again
    assert b.get_meta("k") == "v"
    b.close()


def test_a_database_refused_frees_its_lock(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = Store(db)
    s.set_meta("schema_version", "999")  # a newer controller's database
    s.close()
    for _ in range(2):  # the first refusal did not keep the lock: the same answer again
        with pytest.raises(StoreError, match="999") as e:
            Store(db)
        assert not isinstance(e.value, StoreInUse)


def test_the_lock_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "c.db.lock").symlink_to(target)
    with pytest.raises(StoreError, match="cannot open the lock file"):
        Store(tmp_path / "c.db")
    assert target.read_text() == "keep"


def _controller(tmp: Path, db: Path, name: str) -> tuple[subprocess.Popen, Path]:
    port_file = tmp / f"{name}.port"
    args = [sys.executable, "-m", "controller.service", "--db", str(db), "--listen",
            "127.0.0.1:0", "--port-file", str(port_file), "--plan", str(tmp / "plan.json"),
            "--topology", str(tmp / "topology.json")]  # fmt: skip
    p = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         text=True)  # fmt: skip
    return p, port_file


def test_a_second_controller_on_one_db_exits_2_in_one_line(tmp_path: Path) -> None:
    sample_plan().save(tmp_path / "plan.json")
    save_sample_topology(tmp_path / "topology.json")
    db = tmp_path / "c.db"
    first, port = _controller(tmp_path, db, "first")
    try:
        wait_for("the first controller listens", port.exists, timeout=60)
        second, port2 = _controller(tmp_path, db, "second")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert err.strip().splitlines() == [
            f"heroserve controller: database {db}: in use by another controller "
            f"(pid {first.pid}): one controller per database (lock {db}.lock)"
        ]
        assert not port2.exists()  # it never listened
        first.send_signal(signal.SIGKILL)  # a crash: the kernel drops the lock
        first.wait(10)
        third, port3 = _controller(tmp_path, db, "third")
        try:
            wait_for("a restart after the crash listens", port3.exists, timeout=60)
        finally:
            third.send_signal(signal.SIGTERM)
            third.communicate(timeout=30)
        assert third.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate(timeout=30)
