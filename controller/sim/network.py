"""Link contention in the simulator: a fluid model over directed links (docs/design.md §7).

Holds :class:`Links` (the cluster's directed links and their counters), :class:`Activity`
(work whose duration depends on the stretch of its links) and :class:`FluidNetwork` (the
active activities, their rates and the finish events they put on the engine's heap). What an
activity moves and its time formula are in ``flows.py``.

An *activity* is one pipeline stage's iteration or one request's KV-cache transfer; its
duration ``t(x)`` is the cost model's formula with each link's *stretch factor*
``x_e >= 1`` (``flows.py``); alone, ``x = 1`` and the simulator reproduces the cost model.

Sharing rule (a fluid approximation, documented in docs/simulator.md): a link is shared equally
among the transfers crossing it at any instant. A KV transfer transfers for its whole life and
counts as one transfer (weight 1); an iteration only communicates for the fraction
``w = comm / (compute + comm)`` of its duration, so it counts as ``w`` of a transfer (the
expected number of its transfers on the link at a random instant). A link's load is
``n_e = sum of the weights of the activities crossing it`` and its stretch
``x_e = max(1, n_e)``. Whenever an activity starts or ends, the stretch of its links is
recomputed and the activities on links whose stretch changed get new rates (progress is kept
as the remaining fraction of the activity, so a rate change mid-flight is exact for the fluid
model). Cost per start or end: O(links of the activity + activities re-rated).

Re-rating tolerance: with ``n`` activities on a link, every start or end changes its stretch
by about ``1/n`` and re-rates all ``n``: O(n) per event, O(n^2) per busy period, which is what
made large clusters slow (a link shared by hundreds of KV transfers). With a relative
tolerance ``tol > 0`` the rates in force (``Links.stretch``) move only when the true stretch
``max(1, n_e)`` has drifted from them by more than ``tol`` (relative), or has fallen back to
exactly 1. A link with ``n`` activities is then re-rated once per ``~tol * n`` changes, so the
amortised cost per event is O(1 / tol) whatever ``n`` is, and every rate in force is within
``tol`` of the exact fluid rate. ``tol = 0`` is the exact model (each change re-rates).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import networkx as nx

from controller.sim.flows import Stretch, Work

EPS = 1e-9


class Links:
    """Directed links of the cluster graph: index, 1 / B(e), capacity, bytes carried."""

    def __init__(self, g: nx.Graph) -> None:
        self.index: dict[tuple[str, str], int] = {}
        self.inv_bw: list[float] = []
        self.capacity: list[float] = []
        self.ends: list[tuple[str, str]] = []
        for a, b, d in g.edges(data=True):
            for u, v in ((a, b), (b, a)):
                self.index[(u, v)] = len(self.inv_bw)
                self.inv_bw.append(1.0 / d["available"])
                self.capacity.append(float(d["available"]))
                self.ends.append((u, v))
        n = len(self.inv_bw)
        self.load = [0.0] * n  # n_e: sum of weights of active activities
        self.stretch = [1.0] * n  # x_e in force (within the tolerance of max(1, n_e))
        self.hot: set[int] = set()  # the links with x_e > 1 in force
        self.on: list[set] = [set() for _ in range(n)]  # channels that use each link
        self.bytes = [0.0] * n  # bytes carried so far (finished activities)
        self.window_bytes = [0.0] * n  # bytes carried in the current utilisation window
        # links whose load can exceed 1 (see FluidNetwork): only these are accounted; a run
        # adds the KV routes it uses (``make_risky``), and ``reset`` goes back to ``risky_at_start``
        self.risky = [True] * n
        self.risky_at_start = [True] * n

    def reset(self) -> None:
        """Idle links and zero counters: the state before a run."""
        for i in range(len(self.inv_bw)):
            self.load[i] = 0.0
            self.stretch[i] = 1.0
            self.on[i].clear()
            self.bytes[i] = 0.0
            self.window_bytes[i] = 0.0
        self.risky[:] = self.risky_at_start  # so a run never depends on the runs before it
        self.hot.clear()

    def __len__(self) -> int:
        return len(self.inv_bw)

    def path_links(self, path: Sequence[str]) -> list[int]:
        return [self.index[(u, v)] for u, v in zip(path, path[1:], strict=False)]


class Activity:
    """A unit of work whose duration depends on the stretch of the links it crosses.

    ``work`` holds its flows and, per part, the envelope of the flows that can be the slowest
    when no link is stretched (the others are dominated), so the common uncontended case costs
    O(1-2) instead of a pass over every hop. ``acct`` is (bytes per unit on each link, units):
    the bytes it carries, booked when it finishes.

    ``weight`` is its load on its links: ``None`` derives it per link from ``acct`` as the share
    of its time alone that link ``e`` is busy with its bytes, ``bytes_e / B(e) / t(1)`` (the
    expected number of its transfers on ``e`` at a random instant); a number puts that weight
    on every link (a transfer that occupies its whole path for its whole life)."""

    __slots__ = (
        "fixed_s", "scale", "work", "weight", "acct", "on_done", "links", "id", "remaining",
        "duration", "last_t", "version", "started", "base_s", "chan", "loads",
    )  # fmt: skip

    def __init__(
        self,
        fixed_s: float,
        scale: float,
        work: Work,
        weight: float | None,
        acct: tuple[dict[int, float], float] | None,
        on_done: Callable[[float], None],
        links: Sequence[int] = (),
        chan: object = None,
    ) -> None:
        self.chan = chan  # activities of one channel (a stage's policy, a KV route) share links
        self.fixed_s = fixed_s
        self.scale = scale
        self.work = work
        self.weight = weight
        self.acct = acct
        self.on_done = on_done
        self.links = links  # every link it loads (flows' links and, for INA, the way back)
        self.id = -1
        self.remaining = 1.0  # fraction of the work left
        self.duration = 0.0  # t(x) under the current stretch
        self.last_t = 0.0
        self.version = 0
        self.started = 0.0
        self.base_s = 0.0  # t(1): what the cost model predicts alone
        self.loads: list[tuple[int, float]] = []  # (link, weight) it adds while active

    def time(self, stretch: Stretch) -> float:
        return self.time_from(self.work.sums(stretch))

    def time_from(self, sums: Sequence[tuple[float, float]]) -> float:
        """t(x) from the flows' ``(K_f(x), lat_f)`` (shared by a channel's activities)."""
        return self.work.time(self.fixed_s, self.scale, sums)

    def time_alone(self) -> float:
        return self.work.time_alone(self.fixed_s, self.scale)


class FluidNetwork:
    """Active activities and the event heap they finish on.

    ``start`` registers an activity at time ``now``; the engine pops finish events and calls
    ``finish`` (stale entries, superseded by a rate change, are recognised by version)."""

    def __init__(
        self, links: Links, events: list, counter: Callable[[], int], tolerance: float = 0.0
    ) -> None:
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"re-rating tolerance must be in [0, 1), got {tolerance}")
        self.tol = tolerance
        self.links = links
        self.events = events  # the engine's heap of (time, seq, kind, payload)
        self.seq = counter
        self.active: dict[int, Activity] = {}
        self._next_id = 0
        self.stretched = 0  # links with x_e > 1 right now
        self.rerates = 0  # activities whose rate changed mid-flight (a contention counter)
        self.usage: dict[int, list] = {}  # id(bytes-per-unit dict) -> [dict, units]
        self.by_chan: dict[object, dict[int, Activity]] = {}  # channel -> its activities
        self._busy: dict[int, tuple[tuple[int, float], ...]] = {}  # id(per-unit bytes) ->
        self._keep: list = []
        self._safe: dict[object, bool] = {}  # policy key -> crosses no risky link
        self.risk_version = 0  # make_risky calls that added links
        # channel -> its flows' (K_f(x), lat) under the stretch in force, kept current by
        # _retouch (every stretch change passes there) so a start reuses it
        self._sums: dict[object, list[tuple[float, float]]] = {}

    def _push(self, a: Activity, now: float) -> None:
        a.version += 1
        heapq.heappush(
            self.events, (now + a.remaining * a.duration, self.seq(), "act", (a.id, a.version))
        )

    def _retouch(self, changed: list[int], now: float, skip: Activity) -> None:
        lk = self.links
        chans: set = set()
        for e in changed:
            chans |= lk.on[e]
        stretch, hot = lk.stretch, lk.hot
        for c in chans:
            members = self.by_chan.get(c)
            if not members:
                self._sums.pop(c, None)
                continue
            work = next(iter(members.values())).work
            sums = work.sums(stretch, hot)  # once per channel: its activities share their work
            self._sums[c] = sums
            for a in members.values():
                if a is skip:
                    continue
                if a.duration > 0:
                    a.remaining -= (now - a.last_t) / a.duration
                    if a.remaining < 0.0:
                        a.remaining = 0.0
                a.last_t = now
                a.duration = a.time_from(sums) if a.work is work else a.time(stretch)
                self.rerates += 1
                self._push(a, now)

    def _loads(self, a: Activity) -> list[tuple[int, float]]:
        """(link, weight) of ``a`` on each risky link it loads (see :class:`Activity`)."""
        if a.weight is not None:
            return [(e, a.weight) for e in a.links] if a.weight > 0 else []
        if a.acct is None or a.base_s <= 0:
            return []
        per_unit, units = a.acct
        busy = self._busy.get(id(per_unit))
        if busy is None:  # seconds risky link e is busy per unit: bytes per unit / B(e)
            inv, risky = self.links.inv_bw, self.links.risky
            busy = tuple((e, b * inv[e]) for e, b in per_unit.items() if b > 0 and risky[e])
            self._busy[id(per_unit)] = busy
            self._keep.append(per_unit)  # keeps the id valid while it is a key
        if not busy:
            return []
        f = units / a.base_s
        return [(e, f * k) for e, k in busy]

    def make_risky(self, links: Sequence[int], now: float) -> None:
        """Account from now on for ``links`` (a KV route seen for the first time): the
        activities already on them add their weight there, as if it had always counted."""
        lk = self.links
        new = {e for e in links if not lk.risky[e]}
        if not new:
            return
        for e in new:
            lk.risky[e] = True
        self._busy.clear()
        self._safe.clear()
        self.risk_version += 1
        touched = {
            id(a): a for e in new for c in lk.on[e] for a in self.by_chan.get(c, {}).values()
        }
        changed = []
        for a in touched.values():
            if a.weight is not None:
                continue  # an explicit weight already counts on every link
            for e, w in self._loads(a):
                if e in new:
                    a.loads.append((e, w))
                    if self._set_load(e, lk.load[e] + w):
                        changed.append(e)
        if changed:
            self._retouch(changed, now, None)

    def is_safe(self, key: object, links: Sequence[int]) -> bool:
        """Whether ``links`` (those of the policy ``key``) cross no risky link: work on them
        can never be slowed, so it needs no activity (``delay``). Cached until
        ``make_risky`` adds links (``risk_version`` counts those changes)."""
        safe = self._safe.get(key)
        if safe is None:
            risky = self.links.risky
            safe = self._safe[key] = not any(risky[e] for e in links)
        return safe

    def _set_load(self, e: int, x: float) -> bool:
        """Set link ``e``'s load to ``x``; True when its stretch in force changed."""
        lk = self.links
        lk.load[e] = x
        if x <= 1.0 + EPS:
            x = 1.0
        old = lk.stretch[e]
        if x == old or (x != 1.0 and abs(x - old) <= self.tol * old):
            return False
        if old == 1.0:
            self.stretched += 1
            lk.hot.add(e)
        elif x == 1.0:
            self.stretched -= 1
            lk.hot.discard(e)
        lk.stretch[e] = x
        return True

    def _apply(self, a: Activity, sign: float) -> list[int]:
        """Add (``sign`` 1) or remove (-1) ``a``'s loads; the links whose stretch changed
        (``_set_load`` inlined: this runs twice per activity)."""
        lk = self.links
        load, stretch, tol, hot = lk.load, lk.stretch, self.tol, lk.hot
        changed = []
        for e, w in a.loads:
            x = load[e] = load[e] + sign * w
            if x <= 1.0 + EPS:
                x = 1.0
            old = stretch[e]
            if x == old or (x != 1.0 and abs(x - old) <= tol * old):
                continue
            if old == 1.0:
                self.stretched += 1
                hot.add(e)
            elif x == 1.0:
                self.stretched -= 1
                hot.discard(e)
            stretch[e] = x
            changed.append(e)
        return changed

    def start(self, a: Activity, now: float) -> None:
        a.id = self._next_id
        self._next_id += 1
        a.started = a.last_t = now
        self.active[a.id] = a
        chan = a.chan if a.chan is not None else ("activity", a.id)
        a.chan = chan
        members = self.by_chan.get(chan)
        if members is None:  # first use of the channel: register its links once
            members = self.by_chan[chan] = {}
            on = self.links.on
            for e in a.links:
                on[e].add(chan)
        members[a.id] = a
        if not a.base_s:
            a.base_s = a.time_alone()
        a.loads = self._loads(a)
        changed = self._apply(a, 1.0) if a.loads else ()
        if changed:  # re-rates the others, and refreshes the channel's sums for a
            self._retouch(changed, now, a)
        if self.stretched:
            shared = next(iter(members.values())).work is a.work  # the channel's work
            sums = self._sums.get(chan) if shared else None
            if sums is None:
                sums = a.work.sums(self.links.stretch, self.links.hot)
                if shared:
                    self._sums[chan] = sums
            a.duration = a.time_from(sums)
        else:
            a.duration = a.base_s
        self._push(a, now)

    def finish(self, aid: int, version: int, now: float) -> Activity | None:
        """The activity ``aid`` if this finish event is current, after removing it."""
        a = self.active.get(aid)
        if a is None or a.version != version:
            return None
        del self.active[aid]
        members = self.by_chan[a.chan]
        del members[aid]
        if not members and a.chan[0] == "activity":  # one-off channel: unregister
            del self.by_chan[a.chan]
            self._sums.pop(a.chan, None)
            on = self.links.on
            for e in a.links:
                on[e].discard(a.chan)
        if a.loads:
            changed = self._apply(a, -1.0)
            if changed:
                self._retouch(changed, now, a)
        if a.acct is not None:
            self.note_usage(a.acct)
        return a

    def delay(
        self,
        seconds: float,
        acct: tuple[dict[int, float], float] | None,
        on_done: Callable[[float], None],
        now: float,
    ) -> None:
        """Work that no contention can slow (it crosses no risky link): one event and no link
        accounting; its bytes are booked when it ends, as an activity's are."""
        heapq.heappush(self.events, (now + seconds, self.seq(), "fix", (acct, on_done)))

    def end_delay(self, payload: tuple, now: float) -> None:
        acct, on_done = payload
        if acct is not None:
            self.note_usage(acct)
        on_done(now)

    def note_usage(self, acct: tuple[dict[int, float], float]) -> None:
        per_unit, units = acct
        slot = self.usage.get(id(per_unit))
        if slot is None:
            self.usage[id(per_unit)] = [per_unit, units]
        else:
            slot[1] += units

    def run_until_idle(self) -> None:
        """Process finish events until none is left: a network on its own, with no engine
        (the aggregation-throughput experiment, the unit tests)."""
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if kind == "act":
                a = self.finish(payload[0], payload[1], t)
                if a is not None:
                    a.on_done(t)
            elif kind == "fix":
                self.end_delay(payload, t)

    def book(self) -> None:
        """Add the bytes of the activities finished since the last call to every link's
        ``bytes`` and ``window_bytes``."""
        total, window = self.links.bytes, self.links.window_bytes
        for per_unit, units in self.usage.values():
            for e, b in per_unit.items():
                total[e] += b * units
                window[e] += b * units
        self.usage.clear()
