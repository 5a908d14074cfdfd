"""The controller's SQLite store: state survives a re-open (a controller restart)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from controller.service.store import (
    MAX_GROUP_ID,
    MAX_SEQ,
    GroupIdsExhausted,
    Store,
    StoreError,
    plan_id_of,
)


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


def test_generation_names_the_database(tmp_path: Path) -> None:
    a = Store(tmp_path / "a.db")
    gen = a.generation
    assert len(gen) == 16 and gen != Store(tmp_path / "b.db").generation
    a.close()
    assert Store(tmp_path / "a.db").generation == gen  # stable across restarts


def _poke(db: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(db) as c:
        c.execute(sql, args)


@pytest.mark.parametrize(
    ("sql", "args", "message"),
    [
        ("UPDATE meta SET value = 'abc' WHERE key = 'epoch'", (), "meta.epoch = 'abc' is not an"),
        ("UPDATE meta SET value = '-3' WHERE key = 'epoch'", (), "meta.epoch = '-3' is not in"),
        ("INSERT INTO meta VALUES ('plan_id', 'deadbeef')", (), "names no stored plan"),
        ("INSERT INTO group_ids VALUES ('x', 70000)", (), "group_ids['x'] = 70000 is not in"),
        # a poisoned sequence number used to survive restarts
        (
            "INSERT INTO member_seq VALUES ('g', 'n', ?, 0)",
            (2**63 - 1,),
            "member_seq['g n'].last_seq",
        ),
        ("INSERT INTO member_seq VALUES ('g', 'n', 5, 'x')", (), "member_seq['g n'].reported"),
        ("INSERT INTO table_versions VALUES ('g', 'x', 'd', 0)", (), "table_versions['g'].version"),
    ],
)
def test_verify_names_what_is_wrong(tmp_path: Path, sql: str, args: tuple, message: str) -> None:
    db = tmp_path / "c.db"
    Store(db).close()
    _poke(db, sql, *args)
    with pytest.raises(StoreError, match=re.escape(message)):
        Store(db).verify()


def test_verify_refuses_a_garbage_plan(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = Store(db)
    pid = s.save_plan('{"a": 1}', epoch=s.next_epoch())
    s.verify()
    s.close()
    _poke(db, "UPDATE plans SET json = '{not json' WHERE plan_id = ?", pid)
    with pytest.raises(StoreError, match=f"plan {pid}: stored JSON does not parse"):
        Store(db).verify()


def test_group_ids_are_16_bits_and_reclaimed_only_when_full(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    with s.transaction() as db:  # 65,534 groups already hold ids 1..65534
        db.executemany(
            "INSERT INTO group_ids(name, id) VALUES (?, ?)",
            ((f"g{i}", i) for i in range(1, MAX_GROUP_ID)),
        )
    assert s.group_id("new", live={"new"}) == MAX_GROUP_ID  # the last free one
    # Full: ids of groups not in the plan being applied are reclaimed, lowest first...
    live = {f"g{i}" for i in range(3, MAX_GROUP_ID)} | {"new", "newer"}
    assert s.group_id("newer", live) == 1
    assert s.group_id("g2") == 2 and s.group_id("g5") == 5  # g2 lost its id, got it back
    # ...and when every id is live, the plan is refused.
    with pytest.raises(GroupIdsExhausted, match="all 65535 are in use"):
        s.group_id("one-too-many", live={f"g{i}" for i in range(MAX_GROUP_ID)} | {"new", "newer"})


def test_sequence_numbers_are_bounded(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    s.note_seq("g", "a", MAX_SEQ)
    with pytest.raises(ValueError, match="out of"):
        s.note_seq("g", "a", MAX_SEQ + 1)
    assert s.last_seq("g") == MAX_SEQ


def test_table_floor_lifts_new_versions(tmp_path: Path) -> None:
    s = Store(tmp_path / "c.db")
    assert s.table_version("g", "aaa") == 1
    assert s.raise_table_floor("g", 7) and not s.raise_table_floor("g", 5)
    assert s.table_version("g", "aaa") == 8  # same content, but agents hold 7: above it
    assert s.table_version("g", "aaa") == 8
    assert s.table_version("g", "bbb") == 9


# -- rows a restart reads: every one checked, the bad one named ------------------------------
_AGENT = "INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?)"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (("n1", "alien", b"", 1.0, 1.0, 0), "agents['n1'].kind = 'alien' is not switch or gpu"),
        (("n1", "gpu", b"", 1.0, "yesterday", 0), "agents['n1'].last_seen = 'yesterday' is not"),
        (("n1", "gpu", b"", -5.0, 1.0, 0), "agents['n1'].registered = -5.0 is before 1970"),
        (("n1", "gpu", b"", 1.0, 1.0, "three"), "agents['n1'].acked_epoch = 'three' is not in"),
        (("n1", "gpu", b"", 1.0, 1.0, 9), "agents['n1'].acked_epoch = '9' is not in 0..0"),
        (("n1", "gpu", "text", 1.0, 1.0, 0), "agents['n1'].inventory is not a serialised"),
    ],
)
def test_verify_names_a_bad_agent_row(tmp_path: Path, row: tuple, message: str) -> None:
    db = tmp_path / "c.db"
    Store(db).close()
    _poke(db, _AGENT, *row)
    with pytest.raises(StoreError, match=re.escape(message)):
        Store(db).verify()


def test_a_bad_row_ends_start_up_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """kind 'alien' crashed start-up with a traceback (and text acked_epoch a TypeError)."""
    from controller.service.core import Controller
    from controller.service.sample import sample_plan, sample_topology, save_sample_topology
    from controller.service.server import main

    db = tmp_path / "c.db"
    store = Store(db)
    Controller(store, topology=sample_topology()).apply_plan(sample_plan().to_json())
    store.close()
    _poke(db, _AGENT, "n1", "alien", b"", 1.0, 1.0, 0)
    topology = save_sample_topology(tmp_path / "sample.yaml")
    assert main(["--db", str(db), "--topology", str(topology)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "agents['n1'].kind = 'alien'" in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("3", "meta.schema_version = '3': this controller reads version 2"),
        ("two", "meta.schema_version = 'two': this controller reads version 2"),
        (None, "meta.schema_version is missing"),
    ],
)
def test_an_unknown_schema_version_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture, value: str | None, message: str
) -> None:
    from controller.service.server import main

    db = tmp_path / "c.db"
    Store(db).close()
    if value is None:
        _poke(db, "DELETE FROM meta WHERE key = 'schema_version'")
    else:
        _poke(db, "UPDATE meta SET value = ? WHERE key = 'schema_version'", value)
    _poke(db, "DROP TABLE member_seq")  # what a newer schema might have done
    with pytest.raises(StoreError, match=re.escape(message)):
        Store(db)
    assert main(["--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    with sqlite3.connect(db) as c:  # nothing written: no table re-created, no version set
        tables = {n for (n,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert "member_seq" not in tables and version == (None if value is None else (value,))


def test_a_version_1_database_is_upgraded(tmp_path: Path) -> None:
    """Version 1 kept one maximum sequence number per group (group_seq), which one member
    could push to 2^53: the upgrade drops it; epochs, plans and agents stay."""
    db = tmp_path / "c.db"
    s = Store(db)
    e = s.next_epoch()
    pid = s.save_plan('{"a": 1}', epoch=e)
    s.close()
    with sqlite3.connect(db) as c:
        c.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        c.execute("DROP TABLE member_seq")
        c.execute("CREATE TABLE group_seq (group_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)")
        c.execute("INSERT INTO group_seq VALUES ('g', ?)", (MAX_SEQ,))
    s = Store(db)
    s.verify()
    assert s.get_meta("schema_version") == "2" and s.last_seq("g") is None
    assert s.epoch() == e and s.current_plan() == (pid, '{"a": 1}')
    with s.transaction() as c:
        tables = {n for (n,) in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "group_seq" not in tables and "member_seq" in tables


def test_old_plans_keep_their_id_and_epoch_not_their_body(tmp_path: Path) -> None:
    """Every distinct plan used to be kept whole (a body can be 64 MiB): the newest
    PLAN_BODIES_KEPT keep their JSON, older ones their id and epoch, which is what a restart
    asks (was this --plan applied before?); the current plan is always whole."""
    from controller.service.store import PLAN_BODIES_KEPT

    s = Store(tmp_path / "c.db")
    bodies = [f'{{"plan": {i}}}' for i in range(PLAN_BODIES_KEPT + 3)]
    pids = [s.save_plan(b, epoch=s.next_epoch()) for b in bodies]
    assert s.current_plan() == (pids[-1], bodies[-1])
    rows = dict(s._db.execute("SELECT plan_id, json FROM plans").fetchall())
    assert [rows[p] for p in pids[:3]] == ["", "", ""]
    assert [rows[p] for p in pids[3:]] == bodies[3:]
    assert [s.plan_epoch(p) for p in pids] == list(range(1, len(pids) + 1))
    s.verify()
    # a plan applied again gets its body back
    s.save_plan(bodies[0], epoch=s.next_epoch())
    assert s.current_plan() == (pids[0], bodies[0])
    s.verify()
