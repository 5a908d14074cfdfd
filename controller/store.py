"""The controller's persistent state in SQLite (DESIGN.md §9): a restart loses nothing.

Tables: ``meta`` (topology name, current epoch, current plan id), ``plans`` (every plan
applied, by content hash), ``agents`` (registry: identity, inventory, acknowledged epoch),
``slot_pools`` / ``slot_allocs`` (aggregator slots per switch, see :mod:`controller.slots`),
``group_ids`` (numeric INA group id of each group name) and ``table_versions`` (version of
each GPU policy table, bumped when its content changes).

The database runs in WAL mode; every public method is one transaction, so a crash between
calls leaves a consistent state. One connection is shared by the gRPC worker threads under
a lock (SQLite serialises writers anyway).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS group_seq (group_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class AgentRecord:
    node_id: str
    kind: str  # "switch" | "gpu"
    inventory: bytes  # serialised GpuInventory / SwitchInventory message
    registered: float  # Unix seconds
    last_seen: float  # Unix seconds
    acked_epoch: int


def plan_id_of(plan_json: str) -> str:
    """Content hash naming a plan: the first 16 hex digits of SHA-256 of its JSON."""
    return hashlib.sha256(plan_json.encode()).hexdigest()[:16]


class Store:
    """SQLite-backed controller state. ``path=":memory:"`` gives a throw-away store."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves (one writer at a time,
        # no upgrade deadlocks).
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._depth = 0
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives a process crash (only an OS crash may lose
        # the last transactions), which is what a controller restart needs.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self.transaction() as db:
            # One statement at a time: executescript() would commit our transaction.
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                db.execute(stmt)
            db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('epoch', '0')")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic transaction; nested uses join the outer one."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._db
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0

    # --- meta -------------------------------------------------------------------------

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    @property
    def topology(self) -> str:
        return self.get_meta("topology", "") or ""

    @topology.setter
    def topology(self, name: str) -> None:
        self.set_meta("topology", name)

    # --- epochs -----------------------------------------------------------------------

    def epoch(self) -> int:
        """The last epoch issued (0: none yet)."""
        return int(self.get_meta("epoch", "0") or 0)

    def next_epoch(self) -> int:
        """Issue and persist a new epoch, one above the last; never reused after restart."""
        with self.transaction() as db:
            e = int(db.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()[0]) + 1
            db.execute("UPDATE meta SET value = ? WHERE key = 'epoch'", (str(e),))
        return e

    # --- plans ------------------------------------------------------------------------

    def save_plan(self, plan_json: str, epoch: int) -> str:
        """Record ``plan_json`` as the current plan at ``epoch``; returns its plan id."""
        pid = plan_id_of(plan_json)
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO plans(plan_id, json, epoch, applied) VALUES (?,?,?,?)",
                (pid, plan_json, epoch, time.time()),
            )
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('plan_id', ?)", (pid,))
        return pid

    def current_plan(self) -> tuple[str, str] | None:
        """``(plan_id, plan_json)`` of the current plan, or None before the first."""
        pid = self.get_meta("plan_id")
        if not pid:
            return None
        with self._lock:
            row = self._db.execute("SELECT json FROM plans WHERE plan_id = ?", (pid,)).fetchone()
        return (pid, row[0]) if row else None

    # --- agents -----------------------------------------------------------------------

    def upsert_agent(self, node_id: str, kind: str, inventory: bytes) -> AgentRecord:
        now = time.time()
        with self.transaction() as db:
            db.execute(
                "INSERT INTO agents(node_id, kind, inventory, registered, last_seen) "
                "VALUES (?,?,?,?,?) ON CONFLICT(node_id) DO UPDATE SET kind=excluded.kind, "
                "inventory=excluded.inventory, last_seen=excluded.last_seen",
                (node_id, kind, inventory, now, now),
            )
            rec = self.agent(node_id)
        assert rec is not None
        return rec

    def agent(self, node_id: str) -> AgentRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT node_id, kind, inventory, registered, last_seen, acked_epoch "
                "FROM agents WHERE node_id = ?",
                (node_id,),
            ).fetchone()
        return AgentRecord(*row) if row else None

    def agents(self) -> list[AgentRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT node_id, kind, inventory, registered, last_seen, acked_epoch "
                "FROM agents ORDER BY node_id"
            ).fetchall()
        return [AgentRecord(*r) for r in rows]

    def touch_agent(self, node_id: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE agents SET last_seen = ? WHERE node_id = ?", (time.time(), node_id))

    def ack(self, node_id: str, epoch: int) -> int:
        """Record that ``node_id`` applied ``epoch``; a stale (lower) ack changes nothing.

        Returns the agent's acknowledged epoch after the call.
        """
        with self.transaction() as db:
            db.execute(
                "UPDATE agents SET acked_epoch = MAX(acked_epoch, ?), last_seen = ? "
                "WHERE node_id = ?",
                (epoch, time.time(), node_id),
            )
            row = db.execute(
                "SELECT acked_epoch FROM agents WHERE node_id = ?", (node_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    # --- INA group ids ----------------------------------------------------------------

    def group_id(self, name: str) -> int:
        """The numeric INA group id of group ``name``: assigned once (lowest unused id from
        1), then stable across plans and restarts."""
        with self.transaction() as db:
            row = db.execute("SELECT id FROM group_ids WHERE name = ?", (name,)).fetchone()
            if row:
                return int(row[0])
            used = [r[0] for r in db.execute("SELECT id FROM group_ids ORDER BY id")]
            gid = 1
            for u in used:
                if u != gid:
                    break
                gid += 1
            db.execute("INSERT INTO group_ids(name, id) VALUES (?, ?)", (name, gid))
        return gid

    # --- policy table versions --------------------------------------------------------

    def table_version(self, group_id: str, digest: str, apply_from_seq: int = 0) -> int:
        """Version of the policy table of ``group_id`` whose content hashes to ``digest``:
        unchanged content keeps its version (and apply_from_seq), changed content gets
        version + 1, applying from collective sequence number ``apply_from_seq``."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT version, digest FROM table_versions WHERE group_id = ?", (group_id,)
            ).fetchone()
            if row and row[1] == digest:
                return int(row[0])
            version = int(row[0]) + 1 if row else 1
            db.execute(
                "INSERT OR REPLACE INTO table_versions(group_id, version, digest, apply_from_seq)"
                " VALUES (?,?,?,?)",
                (group_id, version, digest, apply_from_seq),
            )
        return version

    def table_apply_from(self, group_id: str) -> int:
        """apply_from_seq of the current version of ``group_id``'s table (0 if none)."""
        with self._lock:
            row = self._db.execute(
                "SELECT apply_from_seq FROM table_versions WHERE group_id = ?", (group_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    # --- collective sequence numbers reported by GPU agents ---------------------------

    def note_seq(self, group_id: str, seq: int) -> None:
        """Remember the highest collective sequence number reported for ``group_id``."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO group_seq(group_id, last_seq) VALUES (?, ?) ON CONFLICT(group_id) "
                "DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)",
                (group_id, seq),
            )

    def last_seq(self, group_id: str) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT last_seq FROM group_seq WHERE group_id = ?", (group_id,)
            ).fetchone()
        return int(row[0]) if row else None
