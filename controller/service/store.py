"""The controller's persistent state in SQLite (docs/design.md §9): a restart loses nothing.

Tables: ``meta`` (topology name, current epoch, current plan id), ``plans`` (the plans
applied, by content hash: the newest ``PLAN_BODIES_KEPT`` whole, older ones by id and
epoch), ``agents`` (registry: identity, inventory, acknowledged epoch), ``slot_pools`` /
``slot_allocs`` (aggregator slots per switch, see :mod:`controller.service.slots`),
``group_ids`` (numeric INA group id of each group name), ``table_versions`` (version of
each GPU policy table, bumped when its content changes), ``table_floors`` (versions GPU
agents said they hold, which a new version must exceed) and ``member_seq`` (the collective
sequence number each agent last reported for a group, bounded by time: :meth:`note_seq`).

Everything read back is checked (:meth:`Store.verify`, :mod:`controller.service.storecheck`):
a database is data from disk, so a schema version this controller does not know, or a
garbage epoch, plan, agent row, group id or sequence number, is refused with a
:class:`StoreError` naming it, never served or turned into a traceback.
``meta.generation`` names the database (created with it, never changed): agents that see a
new generation know the controller lost its state (docs/control-plane.md).

The database runs in WAL mode; every public method is one transaction, so a crash between
calls leaves a consistent state. One connection is shared by the gRPC worker threads under
a lock (SQLite serialises writers anyway).
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.ina.packet import MAX_GROUP_ID
from controller.service.storecheck import (
    MAX_EPOCH,
    MAX_SEQ,
    StoreError,
    bounded_int,
    check_plan_text,
    verify_rows,
)
from controller.service.storedb import StoreInUse as StoreInUse
from controller.service.storedb import connect, create_schema

# The fastest a group's collective sequence number can advance: the rate MAX_SEQ's bound
# assumes (controller/service/storecheck.py), above any all-reduce rate NCCL reaches (a
# few microseconds per collective at the least: a few hundred thousand a second). A report
# further ahead of the same agent's previous one is not plausible and is cut to this bound.
MAX_SEQ_RATE = 1_000_000
# What an agent's report may run ahead of that bound: the apply margin of one table
# (controller.service.core.DEFAULT_APPLY_MARGIN), so reports a moment apart are never cut.
SEQ_SLACK = 1024
# The longest gap between two reports of one agent that earns MAX_SEQ_RATE credit: twice
# the controller's telemetry interval (core.Options.telemetry_interval_s, 1 s). Credit for
# the whole gap let a report 5 s after the last jump 5,000,000 ahead and a
# patient agent any distance; an honest agent back from a longer gap is cut at most to
# 2,000,000 + SEQ_SLACK ahead per report (at 20,000 all-reduces a second, a gap of 100 s),
# which makes a table apply on arrival, as a low report does, and catches up a report later.
SEQ_GAP_S = 2.0
# Plans kept: a plan body can be 64 MiB (the body limit), and every distinct plan applied
# was kept whole. The newest PLAN_BODIES_KEPT keep their JSON (the current one always is
# among them: it is the newest); older ones keep their id and epoch, which is what a restart
# asks of them (``plan_epoch``: was this --plan applied before?), up to PLAN_IDS_KEPT rows.
PLAN_BODIES_KEPT = 8
PLAN_IDS_KEPT = 4096


class GroupIdsExhausted(StoreError):
    """Every INA group id (1..MAX_GROUP_ID) is taken by a live group."""


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
    """SQLite-backed controller state. ``path=":memory:"`` gives a throw-away store. One
    process at a time holds a database file (``storedb.hold``): a second Store on it, in any
    process, raises :class:`StoreInUse` until the first is closed or its process ends.
    ``readonly``: a reader beside the controller (an inspection, a test), which takes no lock
    and cannot write (SQLite refuses it)."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self._lock = threading.RLock()
        self._depth = 0
        self._db, self._lock_fd = connect(self.path, readonly)
        if not readonly:
            try:
                with self.transaction() as db:
                    create_schema(db)
            except BaseException:
                self.close()  # a database refused frees its lock at once
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._release()

    def _release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # frees the database for the next controller
            self._lock_fd = -1

    def __del__(self) -> None:  # a Store dropped without close() frees its database too
        if getattr(self, "_lock_fd", -1) >= 0:
            self._release()

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
            self._db.execute("BEGIN" if self.readonly else "BEGIN IMMEDIATE")
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

    @property
    def generation(self) -> str:
        """The database's identity, created with it (docs/control-plane.md)."""
        return self.get_meta("generation", "") or ""

    # --- epochs -----------------------------------------------------------------------

    def epoch(self) -> int:
        """The last epoch issued (0: none yet). Raises :class:`StoreError` on garbage."""
        return bounded_int(self.get_meta("epoch", "0"), MAX_EPOCH, "meta.epoch")

    def next_epoch(self) -> int:
        """Issue and persist a new epoch, one above the last; never reused after restart."""
        with self.transaction() as db:
            e = self.epoch() + 1
            if e > MAX_EPOCH:
                raise StoreError(f"meta.epoch: no epoch above {MAX_EPOCH}")
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
            newest = "SELECT plan_id FROM plans ORDER BY epoch DESC, applied DESC LIMIT ?"
            db.execute(
                f"UPDATE plans SET json = '' WHERE json != '' AND plan_id NOT IN ({newest})",
                (PLAN_BODIES_KEPT,),
            )
            db.execute(f"DELETE FROM plans WHERE plan_id NOT IN ({newest})", (PLAN_IDS_KEPT,))
        return pid

    def current_plan(self) -> tuple[str, str] | None:
        """``(plan_id, plan_json)`` of the current plan, or None before the first. Raises
        :class:`StoreError` when ``meta.plan_id`` names a plan the database does not hold."""
        pid = self.get_meta("plan_id")
        if not pid:
            return None
        with self._lock:
            row = self._db.execute("SELECT json FROM plans WHERE plan_id = ?", (pid,)).fetchone()
        if row is None:
            raise StoreError(f"meta.plan_id {pid[:40]!r} names no stored plan")
        if not isinstance(row[0], str):
            raise StoreError(f"plan {pid[:40]!r}: stored JSON is not text")
        return pid, row[0]

    def plan_epoch(self, plan_id: str) -> int | None:
        """The epoch at which ``plan_id`` was last made current, None if it never was."""
        with self._lock:
            row = self._db.execute(
                "SELECT epoch FROM plans WHERE plan_id = ?", (plan_id,)
            ).fetchone()
        return None if row is None else bounded_int(row[0], MAX_EPOCH, f"plans[{plan_id}].epoch")

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

    def agent_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM agents").fetchone()[0])

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

    def ack_many(self, acks: dict[str, int]) -> None:
        """:meth:`ack` for several agents in one transaction (the controller batches acks)."""
        now = time.time()
        with self.transaction() as db:
            db.executemany(
                "UPDATE agents SET acked_epoch = MAX(acked_epoch, ?), last_seen = ? "
                "WHERE node_id = ?",
                [(epoch, now, node) for node, epoch in acks.items()],
            )

    # --- INA group ids ----------------------------------------------------------------

    def group_id(self, name: str, live: frozenset[str] | set[str] = frozenset()) -> int:
        """The numeric INA group id of group ``name``: assigned once (lowest unused id from
        1), then stable across plans and restarts. Ids are 16 bits (:data:`MAX_GROUP_ID`);
        when all are taken, the ids of groups not in ``live`` (the plan being applied) are
        reclaimed, never earlier: a dropped group's packets may still be in flight, so its
        id is not handed to another group while others are free. Raises
        :class:`GroupIdsExhausted` when every id belongs to a live group."""
        with self.transaction() as db:
            row = db.execute("SELECT id FROM group_ids WHERE name = ?", (name,)).fetchone()
            if row:
                return int(row[0])
            gid = _lowest_free(db)
            if gid > MAX_GROUP_ID:
                stale = [n for (n,) in db.execute("SELECT name FROM group_ids") if n not in live]
                db.executemany("DELETE FROM group_ids WHERE name = ?", [(n,) for n in stale])
                gid = _lowest_free(db)
            if gid > MAX_GROUP_ID:
                raise GroupIdsExhausted(
                    f"no free INA group id for {name}: all {MAX_GROUP_ID} are in use"
                )
            db.execute("INSERT INTO group_ids(name, id) VALUES (?, ?)", (name, gid))
        return gid

    # --- policy table versions --------------------------------------------------------

    def table_version(self, group_id: str, digest: str, apply_from_seq: int = 0) -> int:
        """Version of the policy table of ``group_id`` whose content hashes to ``digest``:
        unchanged content keeps its version (and apply_from_seq), changed content gets
        version + 1, applying from collective sequence number ``apply_from_seq``. A version
        at or below the group's floor (:meth:`raise_table_floor`: what its members hold
        from a controller that lost its database) is replaced by floor + 1."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT version, digest FROM table_versions WHERE group_id = ?", (group_id,)
            ).fetchone()
            floor = self.table_floor(group_id)
            if row and row[1] == digest and int(row[0]) > floor:
                return int(row[0])
            version = max(int(row[0]) if row else 0, floor) + 1
            if version > MAX_SEQ:
                raise StoreError(f"table {group_id}: no version above {MAX_SEQ}")
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

    def table_floor(self, group_id: str) -> int:
        """The highest version the members of ``group_id`` said they hold (0: none)."""
        with self._lock:
            row = self._db.execute(
                "SELECT version FROM table_floors WHERE group_id = ?", (group_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    def raise_table_floor(self, group_id: str, version: int) -> bool:
        """Record that a member holds ``version`` of ``group_id``'s table (bounded by the
        caller); True when that raised the floor."""
        if not 0 <= version <= MAX_SEQ:
            raise ValueError(f"table version {version} out of [0, {MAX_SEQ}]")
        with self.transaction() as db:
            if version <= self.table_floor(group_id):
                return False
            db.execute(
                "INSERT OR REPLACE INTO table_floors(group_id, version) VALUES (?, ?)",
                (group_id, version),
            )
        return True

    def current_table_version(self, group_id: str) -> int:
        """Version of ``group_id``'s current table (0: none yet)."""
        with self._lock:
            row = self._db.execute(
                "SELECT version FROM table_versions WHERE group_id = ?", (group_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    # --- collective sequence numbers reported by GPU agents ---------------------------

    def note_seq(self, group_id: str, node_id: str, seq: int, now: float | None = None) -> int:
        """Record the collective sequence number agent ``node_id`` reported for ``group_id``
        (the caller checked that it speaks for a member; ``seq`` <= :data:`MAX_SEQ`) and
        return what was kept. The agent's latest report replaces its previous one (a
        restarted engine counts from 0 again), but may run ahead of it by at most
        MAX_SEQ_RATE per second since then, up to SEQ_GAP_S seconds, plus SEQ_SLACK: one
        report, however long after the last, cannot jump a group to a number its
        collectives will not reach."""
        if not 0 <= seq <= MAX_SEQ:
            raise ValueError(f"sequence number {seq} out of [0, {MAX_SEQ}]")
        now = time.time() if now is None else now
        with self.transaction() as db:
            prev = db.execute(
                "SELECT last_seq, reported FROM member_seq WHERE group_id = ? AND node_id = ?",
                (group_id, node_id),
            ).fetchone()
            if prev is not None:
                elapsed = min(max(0.0, now - prev[1]), SEQ_GAP_S)
                seq = min(seq, prev[0] + SEQ_SLACK + math.ceil(MAX_SEQ_RATE * elapsed), MAX_SEQ)
            db.execute(
                "INSERT INTO member_seq(group_id, node_id, last_seq, reported) VALUES (?,?,?,?) "
                "ON CONFLICT(group_id, node_id) DO UPDATE SET last_seq = excluded.last_seq, "
                "reported = excluded.reported",
                (group_id, node_id, seq, now),
            )
        return seq

    def last_seq(self, group_id: str, quorum: int = 1) -> int | None:
        """The highest collective sequence number ``quorum`` agents of ``group_id`` reached
        (the quorum-th highest of their reports; None with fewer reports): with a quorum
        of two, no single agent moves it above what another one reported. The index
        member_seq_by_seq keeps this a lookup (a sort per group took 2.5 times as long)."""
        with self._lock:
            row = self._db.execute(
                "SELECT last_seq FROM member_seq WHERE group_id = ? "
                "ORDER BY last_seq DESC LIMIT 1 OFFSET ?",
                (group_id, max(0, quorum - 1)),
            ).fetchone()
        return int(row[0]) if row else None

    # --- integrity --------------------------------------------------------------------

    def verify(self) -> None:
        """Check what a restart reads back (epoch, current plan, every agent, plan, group id,
        sequence number and table version row); raise :class:`StoreError` naming the
        first problem. The slot pool has its own check
        (:meth:`controller.service.slots.SlotPool.check_all`)."""
        with self._lock:
            epoch = self.epoch()
            cur = self.current_plan()
            if cur is not None:
                pid, text = cur
                check_plan_text(pid, text)
                if plan_id_of(text) != pid:
                    raise StoreError(f"plan {pid}: stored JSON does not hash to its id")
                applied = self.plan_epoch(pid)
                if applied is not None and applied > epoch:
                    raise StoreError(
                        f"plan {pid} was applied at epoch {applied}, above meta.epoch {epoch}"
                    )
            verify_rows(self._db, epoch)


def _lowest_free(db: sqlite3.Connection) -> int:
    gid = 1
    for (used,) in db.execute("SELECT id FROM group_ids ORDER BY id"):
        if used != gid:
            break
        gid += 1
    return gid
