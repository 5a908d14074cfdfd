"""Opening the controller's state database (``controller.service.store``): the lock that lets
one controller at a time hold it (:func:`hold`, :class:`StoreInUse`), the connection
(:func:`connect`, also read-only beside a running controller) and the schema
(:data:`SCHEMA`, :func:`create_schema`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import sqlite3
from pathlib import Path
from urllib.parse import quote

from controller.service.storecheck import SCHEMA_VERSION, UPGRADES, StoreError, check_version

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS plans (
    plan_id TEXT PRIMARY KEY, json TEXT NOT NULL, epoch INTEGER NOT NULL, applied REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    node_id TEXT PRIMARY KEY, kind TEXT NOT NULL, inventory BLOB NOT NULL,
    registered REAL NOT NULL, last_seen REAL NOT NULL, acked_epoch INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS slot_pools (switch TEXT PRIMARY KEY, capacity INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS slot_allocs (
    switch TEXT NOT NULL, owner TEXT NOT NULL, start INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (switch, owner)
);
CREATE TABLE IF NOT EXISTS group_ids (name TEXT PRIMARY KEY, id INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS table_versions (
    group_id TEXT PRIMARY KEY, version INTEGER NOT NULL, digest TEXT NOT NULL,
    apply_from_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS member_seq (
    group_id TEXT NOT NULL, node_id TEXT NOT NULL, last_seq INTEGER NOT NULL,
    reported REAL NOT NULL, PRIMARY KEY (group_id, node_id)
);
CREATE INDEX IF NOT EXISTS member_seq_by_seq ON member_seq (group_id, last_seq);
CREATE TABLE IF NOT EXISTS table_floors (group_id TEXT PRIMARY KEY, version INTEGER NOT NULL);
"""


class StoreInUse(StoreError):
    """Another process (a second controller) holds the database."""


def hold(path: str) -> int:
    """A descriptor of ``path``'s lock file (``PATH.lock``, beside it) that holds an exclusive
    ``flock`` on it, the holder's pid written inside; :class:`StoreInUse` when another
    holder has it (another process, or another Store here). Two controllers on one database
    would each keep their own epoch and plan in memory, and agents would be served whichever
    they reached (split brain). The lock goes with the descriptor: on close, on exit, on a
    crash (the kernel drops it), so a controller stopped any way frees its database at once."""
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StoreError(f"cannot open the lock file {lock} ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 16, 0).decode("ascii", "replace").strip()
        os.close(fd)
        pid = f" (pid {holder})" if holder.isdigit() else ""  # only digits are shown
        raise StoreInUse(
            f"in use by another controller{pid}: one controller per database (lock {lock})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def connect(path: str, readonly: bool) -> tuple[sqlite3.Connection, int]:
    """(connection, lock descriptor, -1 for none) of the database at ``path``. A writer holds
    the lock (:func:`hold`) first; a reader takes none, opens the file read-only (SQLite
    refuses its writes) and needs a database of this controller's schema."""
    fd = -1
    if path != ":memory:" and not readonly:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = hold(path)
    try:
        # isolation_level=None: the store issues BEGIN IMMEDIATE itself (one writer at a
        # time, no upgrade deadlocks).
        db = sqlite3.connect(
            f"file:{quote(path)}?mode=ro" if readonly else path,
            isolation_level=None,
            check_same_thread=False,
            uri=readonly,
        )
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    try:
        if readonly:
            if check_version(db) != SCHEMA_VERSION:
                raise StoreError(f"{path}: not a database of schema {SCHEMA_VERSION} to read")
        else:
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash (only an OS crash may
            # lose the last transactions), which is what a controller restart needs.
            db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        db.close()
        if fd >= 0:
            os.close(fd)
        raise
    return db, fd


def create_schema(db: sqlite3.Connection) -> None:
    """In the caller's transaction: refuse a database of another schema version before
    anything is written, upgrade one of a version this controller knows, create what is
    missing."""
    old = check_version(db)
    for stmt in UPGRADES.get(old or SCHEMA_VERSION, ()):
        db.execute(stmt)
    # One statement at a time: executescript() would commit the transaction.
    for stmt in filter(str.strip, SCHEMA.split(";")):
        db.execute(stmt)
    db.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
        (str(SCHEMA_VERSION),),
    )
    db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('epoch', '0')")
    db.execute(
        "INSERT OR IGNORE INTO meta(key, value) VALUES ('generation', ?)", (secrets.token_hex(8),)
    )
