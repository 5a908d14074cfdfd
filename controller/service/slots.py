"""Aggregator slot pool per switch (docs/design.md §9, §10): allocate and free contiguous ranges.

A switch has ``capacity`` aggregator slots ``[0, capacity)`` (its register arrays). Each
INA group (the *owner*, e.g. ``"decode/0/1"``) holds at most one contiguous range on a
switch. Invariant, checked by :meth:`SlotPool.check`: the ranges of one switch lie inside
``[0, capacity)`` and never overlap; a range is freed exactly when its owner releases it,
so nothing is allocated twice and nothing leaks. Allocations live in the controller's
SQLite store, so they survive restarts; every call is one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

# A switch cannot address more slots than the 16-bit slot index, whatever its inventory says.
from agents.ina.packet import MAX_AGGREGATOR_SLOTS as MAX_SLOTS
from controller.service.store import Store


class SlotError(Exception):
    """A request the pool cannot satisfy (no room, bad count, unknown switch)."""


@dataclass(frozen=True, order=True)
class Allocation:
    start: int
    count: int
    owner: str

    @property
    def end(self) -> int:
        return self.start + self.count


class SlotPool:
    """Slot pools of every switch, persisted in ``store``."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def set_capacity(self, switch: str, capacity: int) -> None:
        """Declare (or change) the number of slots of ``switch``.

        Shrinking below an existing allocation is refused: the owner must free it first.
        """
        if not 0 <= capacity <= MAX_SLOTS:
            raise SlotError(
                f"switch {switch!r}: capacity {capacity} is not in 0..{MAX_SLOTS} "
                "(the slot index is 16 bits)"
            )
        with self._store.transaction() as db:
            top = db.execute(
                "SELECT MAX(start + count) FROM slot_allocs WHERE switch = ?", (switch,)
            ).fetchone()[0]
            if top is not None and top > capacity:
                raise SlotError(
                    f"switch {switch!r}: capacity {capacity} is below allocated slot {top - 1}"
                )
            db.execute(
                "INSERT OR REPLACE INTO slot_pools(switch, capacity) VALUES (?, ?)",
                (switch, capacity),
            )

    def capacity(self, switch: str) -> int | None:
        with self._store.transaction() as db:
            row = db.execute(
                "SELECT capacity FROM slot_pools WHERE switch = ?", (switch,)
            ).fetchone()
        return int(row[0]) if row else None

    def allocations(self, switch: str) -> list[Allocation]:
        with self._store.transaction() as db:
            rows = db.execute(
                "SELECT start, count, owner FROM slot_allocs WHERE switch = ? ORDER BY start",
                (switch,),
            ).fetchall()
        return [Allocation(*r) for r in rows]

    def switches(self) -> list[str]:
        with self._store.transaction() as db:
            return [r[0] for r in db.execute("SELECT switch FROM slot_pools ORDER BY switch")]

    def get(self, switch: str, owner: str) -> Allocation | None:
        with self._store.transaction() as db:
            row = db.execute(
                "SELECT start, count, owner FROM slot_allocs WHERE switch = ? AND owner = ?",
                (switch, owner),
            ).fetchone()
        return Allocation(*row) if row else None

    def allocate(
        self, switch: str, owner: str, count: int, prefer_start: int | None = None
    ) -> Allocation:
        """Give ``owner`` ``count`` contiguous slots on ``switch``.

        Idempotent: an owner that already holds ``count`` slots keeps its range, whatever
        ``prefer_start`` says (a different count is re-allocated). ``prefer_start`` (e.g.
        the planner's slot range) is honoured when that range is free; otherwise the
        lowest free range that fits (first fit) is taken. Raises :class:`SlotError` when
        no range fits.
        """
        if not 0 < count <= MAX_SLOTS:
            raise SlotError(
                f"switch {switch!r}, owner {owner!r}: slot count {count} is not in 1..{MAX_SLOTS}"
            )
        with self._store.transaction() as db:
            row = db.execute(
                "SELECT capacity FROM slot_pools WHERE switch = ?", (switch,)
            ).fetchone()
            if row is None:
                raise SlotError(f"switch {switch!r} has no slot pool")
            capacity = int(row[0])
            mine = db.execute(
                "SELECT start, count FROM slot_allocs WHERE switch = ? AND owner = ?",
                (switch, owner),
            ).fetchone()
            if mine is not None:
                # Kept even when prefer_start differs: moving a live group's slots would
                # break its in-flight aggregation (and a restart must not move anything).
                if mine[1] == count:
                    return Allocation(mine[0], mine[1], owner)
                db.execute(
                    "DELETE FROM slot_allocs WHERE switch = ? AND owner = ?", (switch, owner)
                )
            taken = db.execute(
                "SELECT start, count FROM slot_allocs WHERE switch = ? ORDER BY start",
                (switch,),
            ).fetchall()
            start = _fit(taken, capacity, count, prefer_start)
            if start is None:
                free = capacity - sum(c for _, c in taken)
                raise SlotError(
                    f"switch {switch!r}: no {count} contiguous free slots "
                    f"(capacity {capacity}, {free} free in total)"
                )
            db.execute(
                "INSERT INTO slot_allocs(switch, owner, start, count) VALUES (?,?,?,?)",
                (switch, owner, start, count),
            )
        return Allocation(start, count, owner)

    def free(self, switch: str, owner: str) -> bool:
        """Release ``owner``'s range on ``switch``; False when it held none."""
        with self._store.transaction() as db:
            cur = db.execute(
                "DELETE FROM slot_allocs WHERE switch = ? AND owner = ?", (switch, owner)
            )
        return cur.rowcount > 0

    def check(self, switch: str) -> None:
        """Raise :class:`SlotError` naming the problem when the pool of ``switch`` breaks its
        invariant: capacity within MAX_SLOTS, every range inside it, no two ranges overlap."""
        capacity = self.capacity(switch) or 0
        if not 0 <= capacity <= MAX_SLOTS:
            raise SlotError(f"switch {switch!r}: capacity {capacity} is not in 0..{MAX_SLOTS}")
        prev: Allocation | None = None
        for a in self.allocations(switch):
            if not (isinstance(a.start, int) and isinstance(a.count, int)):
                raise SlotError(f"switch {switch!r}: allocation of {a.owner!r} is not integers")
            if a.count <= 0 or a.start < 0 or a.end > capacity:
                raise SlotError(
                    f"switch {switch!r}: {a.owner!r} holds slots [{a.start}, {a.end}) outside "
                    f"the pool [0, {capacity})"
                )
            if prev is not None and a.start < prev.end:
                raise SlotError(
                    f"switch {switch!r}: {a.owner!r} [{a.start}, {a.end}) overlaps "
                    f"{prev.owner!r} [{prev.start}, {prev.end})"
                )
            prev = a if prev is None or a.end > prev.end else prev

    def check_all(self) -> None:
        """:meth:`check` every switch, and refuse allocations on a switch with no pool."""
        with self._store.transaction() as db:
            orphans = db.execute(
                "SELECT DISTINCT switch FROM slot_allocs WHERE switch NOT IN "
                "(SELECT switch FROM slot_pools)"
            ).fetchall()
        if orphans:
            raise SlotError(f"switch {orphans[0][0]!r}: allocations without a slot pool")
        for sw in self.switches():
            self.check(sw)


def _fit(taken: list[tuple[int, int]], capacity: int, count: int, prefer: int | None) -> int | None:
    """Start of a free range of ``count`` slots in ``[0, capacity)``, or None."""
    if prefer is not None and prefer >= 0 and prefer + count <= capacity:
        if all(prefer + count <= s or s + c <= prefer for s, c in taken):
            return prefer
    cursor = 0
    for s, c in taken:
        if s - cursor >= count:
            return cursor
        cursor = max(cursor, s + c)
    return cursor if capacity - cursor >= count else None
