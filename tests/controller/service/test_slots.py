"""Aggregator slot pool: no slot allocated twice, none leaked, state survives restarts."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from controller.service.slots import MAX_SLOTS, Allocation, SlotError, SlotPool
from controller.service.store import Store


def _pool(path: Path) -> tuple[Store, SlotPool]:
    store = Store(path)
    return store, SlotPool(store)


def test_first_fit_and_preferred_start(tmp_path: Path) -> None:
    _, pool = _pool(tmp_path / "c.db")
    pool.set_capacity("s1", 10)
    assert pool.allocate("s1", "a", 4) == Allocation(0, 4, "a")
    assert pool.allocate("s1", "b", 3) == Allocation(4, 3, "b")
    assert pool.free("s1", "a")
    assert not pool.free("s1", "a")
    # The hole [0, 4) takes a 2-slot range at 0; a 3-slot request asking for 7 gets 7.
    assert pool.allocate("s1", "c", 2) == Allocation(0, 2, "c")
    assert pool.allocate("s1", "d", 3, prefer_start=7) == Allocation(7, 3, "d")
    # Preferred start overlapping "b" falls back to first fit: [2, 4).
    assert pool.allocate("s1", "e", 2, prefer_start=5) == Allocation(2, 2, "e")
    with pytest.raises(SlotError, match="no 1 contiguous free slots"):
        pool.allocate("s1", "f", 1)
    pool.check("s1")


def test_idempotent_and_resize(tmp_path: Path) -> None:
    _, pool = _pool(tmp_path / "c.db")
    pool.set_capacity("s1", 8)
    a = pool.allocate("s1", "g", 4)
    assert pool.allocate("s1", "g", 4) == a
    assert pool.allocate("s1", "g", 6) == Allocation(0, 6, "g")  # its own range is reused
    assert pool.allocations("s1") == [Allocation(0, 6, "g")]


def test_bad_requests(tmp_path: Path) -> None:
    _, pool = _pool(tmp_path / "c.db")
    with pytest.raises(SlotError, match="no slot pool"):
        pool.allocate("nope", "g", 1)
    pool.set_capacity("s1", 4)
    with pytest.raises(SlotError, match="slot count 0 is not in 1..65536"):
        pool.allocate("s1", "g", 0)
    pool.allocate("s1", "g", 4)
    with pytest.raises(SlotError, match="below allocated"):
        pool.set_capacity("s1", 3)
    with pytest.raises(SlotError, match="capacity -1 is not in 0..65536"):
        pool.set_capacity("s1", -1)


def test_ten_thousand_operations_across_restarts(tmp_path: Path) -> None:
    """10,000 random allocate/free operations, re-opening the store every 500 (a
    controller restart), against a model of who holds what: the pool never hands out a
    slot twice, and once everything is freed no slot is still held (no leak)."""
    db = tmp_path / "c.db"
    capacity = {"s1": 64, "s2": 37}
    store, pool = _pool(db)
    for sw, cap in capacity.items():
        pool.set_capacity(sw, cap)
    rng = random.Random(4)
    model: dict[tuple[str, str], Allocation] = {}
    refused = 0
    for step in range(10_000):
        if step % 500 == 499:
            store.close()
            store, pool = _pool(db)
        sw = rng.choice(sorted(capacity))
        owner = f"g{rng.randrange(40)}"
        if rng.random() < 0.55:
            count = rng.randint(1, 12)
            try:
                a = pool.allocate(sw, owner, count)
            except SlotError:
                refused += 1
                # A refused request must really not fit (the owner's own range counted as
                # free), and the refusal is atomic: the owner keeps its old range.
                held = sorted(
                    (x.start, x.end) for k, x in model.items() if k[0] == sw and k[1] != owner
                )
                edges = [(0, 0), *held, (capacity[sw], capacity[sw])]
                assert max(b[0] - a_[1] for a_, b in itertools.pairwise(edges)) < count
                continue
            model[(sw, owner)] = a
        else:
            assert pool.free(sw, owner) == ((sw, owner) in model)
            model.pop((sw, owner), None)
        # Invariant: the pool is exactly the model, and no slot is held twice.
        for s in capacity:
            allocs = pool.allocations(s)
            assert {(s, a.owner): a for a in allocs} == {
                k: v for k, v in model.items() if k[0] == s
            }
            used = [i for a in allocs for i in range(a.start, a.end)]
            assert len(used) == len(set(used)) and all(0 <= i < capacity[s] for i in used)
    assert refused > 0  # the test exercised a full pool
    store.close()
    store, pool = _pool(db)
    for sw, owner in list(model):
        assert pool.free(sw, owner)
    for sw in capacity:
        assert pool.allocations(sw) == []
        # Nothing leaked: the whole switch is one free range again.
        assert pool.allocate(sw, "all", capacity[sw]) == Allocation(0, capacity[sw], "all")


def test_pool_size_fits_the_16_bit_slot_index(tmp_path: Path) -> None:
    """a switch saying it has 2^32 - 1 slots got a group of 10^9."""
    _, pool = _pool(tmp_path / "c.db")
    pool.set_capacity("s1", MAX_SLOTS)
    with pytest.raises(SlotError, match="capacity 4294967295 is not in 0..65536"):
        pool.set_capacity("s1", 2**32 - 1)
    with pytest.raises(SlotError, match="slot count 1000000000 is not in 1..65536"):
        pool.allocate("s1", "g", 10**9)
    assert pool.allocate("s1", "g", MAX_SLOTS) == Allocation(0, MAX_SLOTS, "g")


def test_check_names_overlaps_and_ranges_outside_the_pool(tmp_path: Path) -> None:
    """a database with four groups on slot 0 was served."""
    store, pool = _pool(tmp_path / "c.db")
    pool.set_capacity("s1", 16)
    pool.allocate("s1", "a", 4)
    pool.check_all()
    with store.transaction() as db:  # what a corrupt database holds
        for owner in ("b", "c", "d"):
            db.execute("INSERT INTO slot_allocs VALUES ('s1', ?, 0, 4)", (owner,))
    with pytest.raises(SlotError, match=r"'b' \[0, 4\) overlaps 'a' \[0, 4\)"):
        pool.check_all()
    with store.transaction() as db:
        db.execute("DELETE FROM slot_allocs WHERE owner IN ('b', 'c', 'd')")
        db.execute("INSERT INTO slot_allocs VALUES ('s1', 'e', 14, 4)")
    with pytest.raises(SlotError, match=r"'e' holds slots \[14, 18\) outside the pool \[0, 16\)"):
        pool.check_all()
    with store.transaction() as db:
        db.execute("DELETE FROM slot_allocs WHERE owner = 'e'")
        db.execute("INSERT INTO slot_allocs VALUES ('s9', 'f', 0, 1)")
    with pytest.raises(SlotError, match="'s9': allocations without a slot pool"):
        pool.check_all()
