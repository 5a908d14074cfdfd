"""The controller's SQLite store: state survives a re-open (a controller restart)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.store import Store, plan_id_of


def test_epochs_increase_and_survive_reopen(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = Store(db)
    assert s.epoch() == 0
    assert [s.next_epoch() for _ in range(3)] == [1, 2, 3]
    s.close()
    s = Store(db)
    assert s.epoch() == 3
    assert s.next_epoch() == 4


def test_wal_mode(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    mode = sqlite3.connect(tmp_path / "c.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    s.close()


def test_plan_topology_and_agents_survive_reopen(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = Store(db)
    assert s.current_plan() is None
    s.topology = "testbed"
    pid = s.save_plan('{"a": 1}', epoch=s.next_epoch())
    assert pid == plan_id_of('{"a": 1}') and len(pid) == 16
    s.upsert_agent("s1", "switch", b"\x08\x01")
    assert s.ack("s1", 5) == 5
    assert s.ack("s1", 3) == 5  # a stale ack never lowers the acknowledged epoch
    s.close()

    s = Store(db)
    assert s.topology == "testbed"
    assert s.current_plan() == (pid, '{"a": 1}')
    rec = s.agent("s1")
    assert rec is not None
    assert (rec.kind, rec.inventory, rec.acked_epoch) == ("switch", b"\x08\x01", 5)
    # Re-registering keeps the acknowledged epoch and updates the inventory.
    s.upsert_agent("s1", "switch", b"\x08\x02")
    rec = s.agent("s1")
    assert rec is not None and rec.acked_epoch == 5 and rec.inventory == b"\x08\x02"
    assert s.ack("nobody", 7) == 0


def test_group_ids_stable_and_lowest_free(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = Store(db)
    assert s.group_id("prefill/0/0") == 1
    assert s.group_id("decode/0/0") == 2
    assert s.group_id("prefill/0/0") == 1
    s.close()
    s = Store(db)
    assert s.group_id("decode/0/0") == 2
    assert s.group_id("decode/1/0") == 3


def test_table_version_bumps_only_on_change(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    assert s.table_version("decode/0/0", "aaa") == 1
    assert s.table_version("decode/0/0", "aaa") == 1
    assert s.table_version("decode/0/0", "bbb") == 2
    assert s.table_version("decode/0/0", "aaa") == 3


def test_failed_transaction_rolls_back(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    with pytest.raises(RuntimeError):
        with s.transaction() as db:
            db.execute("UPDATE meta SET value = '99' WHERE key = 'epoch'")
            raise RuntimeError("boom")
    assert s.epoch() == 0
