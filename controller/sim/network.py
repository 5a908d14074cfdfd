"""Link contention in the simulator: a fluid model over directed links (DESIGN.md §7).

An *activity* is anything that moves bytes: one pipeline stage's iteration (its compute plus
the 2 L/P all-reduces of its layers) or one request's KV-cache transfer. Its uncontended
duration is the cost model's own formula (``controller.costmodel.network``: store-and-forward,
``sum_e load_e / B(e) + latency(e)`` per flow, the slowest flow per round), written as

    t(x) = fixed_s + mult * max_f ( scale * sum_{e in f} k_{f,e} * x_e  +  lat_f )

with ``scale * k_{f,e}`` the seconds flow ``f`` spends on link ``e`` when the link is its own
(``bytes on e / B(e)``, counting every flow of the same collective on ``e``, as Eq. 10 with the
shared-link rule does) and ``x_e >= 1`` the link's *stretch factor*. Alone, ``x = 1`` and the
simulator reproduces the cost model exactly.

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
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import networkx as nx

EPS = 1e-9

# A flow of an activity: ((link index, seconds per unit on that link), ...), latency seconds.
Flow = tuple[tuple[tuple[int, float], ...], float]


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
        self.stretch = [1.0] * n  # x_e
        self.on: list[set] = [set() for _ in range(n)]  # channels that use each link
        self.bytes = [0.0] * n  # bytes carried so far (finished activities)
        self.window_bytes = [0.0] * n  # bytes carried in the current utilisation window

    def __len__(self) -> int:
        return len(self.inv_bw)

    def path_links(self, path: Sequence[str]) -> list[int]:
        return [self.index[(u, v)] for u, v in zip(path, path[1:], strict=False)]


class Activity:
    """A unit of work whose duration depends on the stretch of the links it crosses.

    ``envelope`` lists the (sum_e k_fe, lat_f) of the flows that can be the slowest when no
    link is stretched (the others are dominated), so the common uncontended case costs
    O(1-2) instead of a pass over every hop. ``acct`` is (bytes per unit on each link,
    units): the bytes it carries, booked when it finishes."""

    __slots__ = (
        "fixed_s", "mult", "scale", "flows", "envelope", "weight", "acct", "on_done",
        "links", "id", "remaining", "duration", "last_t", "version", "started", "base_s",
        "chan",
    )  # fmt: skip

    def __init__(
        self,
        fixed_s: float,
        mult: float,
        scale: float,
        flows: Sequence[Flow],
        envelope: Sequence[tuple[float, float]],
        weight: float,
        acct: tuple[dict[int, float], float] | None,
        on_done: Callable[[float], None],
        links: Sequence[int] = (),
        chan: object = None,
    ) -> None:
        self.chan = chan  # activities of one channel (a stage's policy, a KV route) share links
        self.fixed_s = fixed_s
        self.mult = mult
        self.scale = scale
        self.flows = flows
        self.envelope = envelope
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

    def time(self, stretch) -> float:
        worst = 0.0
        scale = self.scale
        for terms, lat in self.flows:
            t = 0.0
            for e, k in terms:
                t += k * stretch[e]
            t = t * scale + lat
            if t > worst:
                worst = t
        return self.fixed_s + self.mult * worst

    def time_alone(self) -> float:
        worst = 0.0
        scale = self.scale
        for k, lat in self.envelope:
            t = k * scale + lat
            if t > worst:
                worst = t
        return self.fixed_s + self.mult * worst


def envelope(flows: Sequence[Flow]) -> tuple[tuple[float, float], ...]:
    """The (sum of k, latency) pairs of the flows not dominated by another flow."""
    pts = sorted({(sum(k for _, k in terms), lat) for terms, lat in flows}, reverse=True)
    out: list[tuple[float, float]] = []
    for k, lat in pts:  # by k descending: keep a flow only if its latency beats all kept
        if not out or lat > max(x[1] for x in out):
            out.append((k, lat))
    return tuple(out)


class FluidNetwork:
    """Active activities and the event heap they finish on.

    ``start`` registers an activity at time ``now``; the engine pops finish events and calls
    ``finish`` (stale entries, superseded by a rate change, are recognised by version)."""

    def __init__(self, links: Links, events: list, counter: Callable[[], int]) -> None:
        self.links = links
        self.events = events  # the engine's heap of (time, seq, kind, payload)
        self.seq = counter
        self.active: dict[int, Activity] = {}
        self._next_id = 0
        self.stretched = 0  # links with x_e > 1 right now
        self.rerates = 0  # activities whose rate changed mid-flight (a contention counter)
        self.usage: dict[int, list] = {}  # id(bytes-per-unit dict) -> [dict, units]
        self.by_chan: dict[object, list[Activity]] = {}  # channel -> its active activities

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
        stretch = lk.stretch
        for c in chans:
            for a in self.by_chan.get(c, ()):
                if a is skip:
                    continue
                if a.duration > 0:
                    a.remaining -= (now - a.last_t) / a.duration
                    if a.remaining < 0.0:
                        a.remaining = 0.0
                a.last_t = now
                a.duration = a.time(stretch)
                self.rerates += 1
                self._push(a, now)

    def _apply(self, a: Activity, w: float) -> list[int]:
        lk = self.links
        load, stretch = lk.load, lk.stretch
        changed = []
        for e in a.links:
            x = load[e] + w
            load[e] = x
            if x <= 1.0 + EPS:
                x = 1.0
            old = stretch[e]
            if x != old:
                if old == 1.0:
                    self.stretched += 1
                elif x == 1.0:
                    self.stretched -= 1
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
            members = self.by_chan[chan] = []
            on = self.links.on
            for e in a.links:
                on[e].add(chan)
        members.append(a)
        changed = self._apply(a, a.weight) if a.weight > 0 else ()
        if not a.base_s:
            a.base_s = a.time_alone()
        a.duration = a.time(self.links.stretch) if self.stretched else a.base_s
        self._push(a, now)
        if changed:
            self._retouch(changed, now, a)

    def finish(self, aid: int, version: int, now: float) -> Activity | None:
        """The activity ``aid`` if this finish event is current, after removing it."""
        a = self.active.get(aid)
        if a is None or a.version != version:
            return None
        del self.active[aid]
        members = self.by_chan[a.chan]
        members.remove(a)
        if not members and a.chan[0] == "activity":  # one-off channel: unregister
            del self.by_chan[a.chan]
            on = self.links.on
            for e in a.links:
                on[e].discard(a.chan)
        if a.weight > 0:
            changed = self._apply(a, -a.weight)
            if changed:
                self._retouch(changed, now, a)
        if a.acct is not None:
            per_unit, units = a.acct
            slot = self.usage.get(id(per_unit))
            if slot is None:
                self.usage[id(per_unit)] = [per_unit, units]
            else:
                slot[1] += units
        return a

    def book(self) -> None:
        """Add the bytes of the activities finished since the last call to every link's
        ``bytes`` and ``window_bytes``."""
        total, window = self.links.bytes, self.links.window_bytes
        for per_unit, units in self.usage.values():
            for e, b in per_unit.items():
                total[e] += b * units
                window[e] += b * units
        self.usage.clear()


class _Ones:
    """A read-only all-ones stretch vector: the uncontended case."""

    def __getitem__(self, i: int) -> float:
        return 1.0


ONES = _Ones()
