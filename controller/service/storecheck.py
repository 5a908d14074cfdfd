"""What the controller reads back from its SQLite database, checked (docs/control-plane.md,
"State"): a database is data from disk, so every row a restart reads is refused with a
:class:`StoreError` naming the row before anything is served from it.

Holds the schema's version and its upgrade (:func:`check_version`), the bounds of the
counters the database keeps, and the row checks (:func:`verify_rows`) that
:meth:`controller.service.store.Store.verify` runs.
"""

from __future__ import annotations

import json
import math
import sqlite3

from agents.ina.packet import MAX_GROUP_ID

# Version 2: sequence numbers are kept per reporting agent (member_seq), not as one maximum
# per group (version 1's group_seq, which any one member could push: docs/control-plane.md
# "Apply points"). A version-1 database is upgraded in place by dropping group_seq: the
# members' next telemetry refills member_seq within one interval.
SCHEMA_VERSION = 2
UPGRADES = {1: ("DROP TABLE IF EXISTS group_seq",)}

# Collective sequence numbers and table versions are counters that start at 0 and grow by
# one per collective (per table change): 2^53 is 285 years at a million collectives per
# second, is exact in a JSON double, and leaves room for apply_from_seq = last + 1 + margin
# in SQLite's signed 64-bit integers. Anything above is a lie.
MAX_SEQ = 1 << 53
MAX_EPOCH = 1 << 53
# apply_from_seq = last_seq + 1 + margin, the margin far below MAX_SEQ.
MAX_APPLY_FROM = 2 * MAX_SEQ
AGENT_KINDS = ("switch", "gpu")


class StoreError(Exception):
    """The database holds something the controller cannot serve (names it)."""


def check_version(db: sqlite3.Connection) -> int | None:
    """The schema version of the database behind ``db`` before this controller touches it:
    None for a new database, a version :data:`UPGRADES` knows (to upgrade), or
    :data:`SCHEMA_VERSION`. Anything else (a newer controller's database, garbage) is a
    StoreError naming the version, and nothing is written."""
    has_meta = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if not has_meta:
        return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise StoreError("meta.schema_version is missing: not a controller database")
    text = str(row[0])
    version = int(text) if text.isdigit() and len(text) < 10 else None
    if version != SCHEMA_VERSION and version not in UPGRADES:
        raise StoreError(
            f"meta.schema_version = {text[:20]!r}: this controller reads version "
            f"{SCHEMA_VERSION} (and upgrades {', '.join(map(str, UPGRADES))}); a newer "
            "controller wrote it"
        )
    return version


def bounded_int(value: object, bound: int, what: str) -> int:
    """``value`` (text or integer from SQLite) as an int in [0, bound], else StoreError."""
    try:
        out = int(str(value).strip()) if isinstance(value, str) else value
    except ValueError:
        raise StoreError(f"{what} = {str(value)[:40]!r} is not an integer") from None
    if isinstance(out, bool) or not isinstance(out, int) or not 0 <= out <= bound:
        raise StoreError(f"{what} = {str(value)[:40]!r} is not in 0..{bound}")
    return out


def _key(value: object) -> str:
    """A row's key as a message names it (short, one line)."""
    return repr(value if not isinstance(value, str) else value[:40])


def _time(value: object, what: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise StoreError(f"{what} = {str(value)[:40]!r} is not a time (seconds)")
    if value < 0:
        raise StoreError(f"{what} = {value!r} is before 1970")


def verify_rows(db: sqlite3.Connection, epoch: int) -> None:
    """Every row a restart reads, typed and bounded; the first bad one is a StoreError
    naming its table, key and column. ``epoch``: ``meta.epoch``, already checked."""
    for node, kind, inv, registered, seen, acked in db.execute(
        "SELECT node_id, kind, inventory, registered, last_seen, acked_epoch FROM agents"
    ):
        where = f"agents[{_key(node)}]"
        if not isinstance(node, str) or not node:
            raise StoreError(f"{where}.node_id is not a name")
        if kind not in AGENT_KINDS:
            raise StoreError(f"{where}.kind = {_key(kind)} is not switch or gpu")
        if not isinstance(inv, bytes):
            raise StoreError(f"{where}.inventory is not a serialised inventory (bytes)")
        _time(registered, f"{where}.registered")
        _time(seen, f"{where}.last_seen")
        if not isinstance(acked, int) or isinstance(acked, bool) or not 0 <= acked <= epoch:
            # an ack is of an issued epoch: at most meta.epoch
            raise StoreError(f"{where}.acked_epoch = {str(acked)[:40]!r} is not in 0..{epoch}")
    for pid, text, applied_epoch, applied in db.execute(
        "SELECT plan_id, json, epoch, applied FROM plans"
    ):
        where = f"plans[{_key(pid)}]"
        if not isinstance(text, str):
            raise StoreError(f"{where}.json is not text")
        if not isinstance(applied_epoch, int) or not 0 <= applied_epoch <= epoch:
            raise StoreError(f"{where}.epoch = {str(applied_epoch)[:40]!r} is not in 0..{epoch}")
        _time(applied, f"{where}.applied")
    for name, gid in db.execute("SELECT name, id FROM group_ids"):
        if not isinstance(gid, int) or not 1 <= gid <= MAX_GROUP_ID:
            raise StoreError(f"group_ids[{_key(name)}] = {gid!r} is not in 1..{MAX_GROUP_ID}")
    for table, key, col, bound in (
        ("member_seq", "group_id || ' ' || node_id", "last_seq", MAX_SEQ),
        ("table_versions", "group_id", "version", MAX_SEQ),
        ("table_versions", "group_id", "apply_from_seq", MAX_APPLY_FROM),
        ("table_floors", "group_id", "version", MAX_SEQ),
    ):
        for name, value in db.execute(f"SELECT {key}, {col} FROM {table}"):  # noqa: S608
            if not isinstance(value, int) or not 0 <= value <= bound:
                raise StoreError(f"{table}[{_key(name)}].{col} = {value!r} is not in 0..{bound}")
    for group, node, at in db.execute("SELECT group_id, node_id, reported FROM member_seq"):
        _time(at, f"member_seq[{_key(f'{group} {node}')}].reported")


def check_plan_text(pid: str, text: str) -> None:
    """The current plan's JSON parses (its schema is the controller's to check)."""
    try:
        json.loads(text)
    except ValueError as exc:
        raise StoreError(f"plan {pid}: stored JSON does not parse ({exc})") from None
