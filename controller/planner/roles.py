"""Which GPUs serve prefill and which serve decode: the role split (docs/design.md §5).

The planner decides the split; a topology's ``role`` fields are constraints only where given
(a GPU marked ``prefill`` or ``decode`` stays in that role, ``any`` is free).

Free GPUs are split by **server**: a server's free GPUs go to one role together, because a
tensor group inside a server talks over NVLink and splitting a server between roles would
only push its groups onto Ethernet. Servers are put in **classes** of equal hardware (GPU
type, memory, number of free GPUs); servers of one class are interchangeable for the split,
so a split is a vector ``k`` with ``k[c]`` the number of class-``c`` servers that prefill
(the first ``k[c]`` in name order, which keeps a phase's servers together on rail clusters,
where consecutive servers share access switches) and the others decode.

``exhaustive_splits`` lists every such vector, ``prod(n_c + 1)`` of them: the search prices
each one when there are at most ``max_splits``. On larger clusters ``balanced_splits`` picks
the vectors around the balance point of a linear model: each class's prefill and decode rate
per server, measured by pricing the whole cluster in each role, and the split maximising
``min(sum_c k_c p_c, sum_c (n_c - k_c) d_c)`` (a fractional knapsack: classes sorted by
``p_c / d_c``, at most one class split), then its integer neighbours and the counts near it
at which a role's pool holds a whole number of its instances.

Holds ``ROLES``, ``role_space`` (``RoleSpace``, ``ServerClass``), ``Split``,
``exhaustive_splits``, ``balanced_splits``, ``whole_instance_counts`` and
``balanced_counts``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from controller.topology.graph import gpu_sort_key, gpus

ROLES = ("prefill", "decode")  # the two roles a split gives servers (a topology adds "any")


@dataclass(frozen=True)
class ServerClass:
    """Servers with the same hardware among their free GPUs."""

    key: tuple  # (gpu type, memory, number of free GPUs)
    servers: tuple[str, ...]  # in name order

    @property
    def label(self) -> str:
        gpu_type, _, n = self.key
        return f"{gpu_type}x{n}"


@dataclass(frozen=True)
class Split:
    """A role split: ``counts[c]`` servers of class ``c`` prefill, the rest decode."""

    counts: tuple[int, ...]
    prefill: tuple[str, ...]  # GPUs that serve prefill (fixed ones included)
    decode: tuple[str, ...]
    label: str


@dataclass
class RoleSpace:
    """The GPUs whose role is fixed, and the classes of servers whose role is free."""

    fixed_prefill: list[str]
    fixed_decode: list[str]
    classes: list[ServerClass]
    free: dict[str, list[str]]  # server -> its free GPUs, index order

    @property
    def n_splits(self) -> int:
        return math.prod(len(c.servers) + 1 for c in self.classes)

    def split(self, counts: Sequence[int]) -> Split:
        pre, dec = list(self.fixed_prefill), list(self.fixed_decode)
        parts = []
        for c, k in zip(self.classes, counts, strict=True):
            for i, s in enumerate(c.servers):
                (pre if i < k else dec).extend(self.free[s])
            if c.servers:
                parts.append(f"{k}/{len(c.servers)} {c.label}")
        label = "prefill " + ", ".join(parts) if parts else "roles fixed by the topology"
        return Split(tuple(counts), tuple(pre), tuple(dec), label)


def role_space(g: nx.Graph) -> RoleSpace:
    """Fixed-role GPUs and the classes of servers holding free (``any``) GPUs."""
    fixed_p, fixed_d = [], []
    free: dict[str, list[str]] = {}
    for x in gpus(g):
        role = g.nodes[x].get("role", "any")
        if role == "prefill":
            fixed_p.append(x)
        elif role == "decode":
            fixed_d.append(x)
        else:
            free.setdefault(g.nodes[x].get("server") or x, []).append(x)
    by_key: dict[tuple, list[str]] = {}
    for server, members in free.items():
        types = sorted({(g.nodes[m]["gpu_type"], g.nodes[m]["memory_gb"]) for m in members})
        key = (
            "+".join(t for t, _ in types),
            min(m for _, m in types),
            len(members),
        )
        by_key.setdefault(key, []).append(server)
    classes = [
        ServerClass(k, tuple(sorted(v, key=lambda s: gpu_sort_key(g)(free[s][0]))))
        for k, v in sorted(by_key.items(), key=lambda kv: kv[0])
    ]
    return RoleSpace(fixed_p, fixed_d, classes, free)


def exhaustive_splits(space: RoleSpace) -> list[Split]:
    """Every split vector, in a fixed order (prefill counts ascending, lexicographic)."""
    ranges = [range(len(c.servers) + 1) for c in space.classes]
    return [space.split(k) for k in itertools.product(*ranges)]


def balanced_counts(
    sizes: Sequence[int], prefill_rate: Sequence[float], decode_rate: Sequence[float]
) -> tuple[float, ...]:
    """The fractional split maximising ``min(sum k_c p_c, sum (n_c - k_c) d_c)``, with
    ``p_c``, ``d_c`` the per-server rates of class ``c`` in each role and ``n_c`` its size.

    Exchange argument: moving a server of class c from decode to prefill trades ``d_c`` of
    decode rate for ``p_c`` of prefill rate, so the classes with the highest ``p_c / d_c``
    prefill first; fill them in that order until prefill reaches decode. O(C log C)."""
    n = len(sizes)
    k = [0.0] * n
    pre = 0.0
    dec = sum(s * d for s, d in zip(sizes, decode_rate, strict=True))
    order = sorted(
        range(n),
        key=lambda c: -(prefill_rate[c] / decode_rate[c] if decode_rate[c] > 0 else math.inf),
    )
    for c in order:
        if pre >= dec:
            break
        per = prefill_rate[c] + decode_rate[c]
        if per <= 0:
            continue
        # servers of c to move so that prefill meets decode: pre + x p = dec - x d
        x = min(float(sizes[c]), (dec - pre) / per)
        k[c] = x
        pre += x * prefill_rate[c]
        dec -= x * decode_rate[c]
    return tuple(k)


def balanced_splits(
    space: RoleSpace,
    prefill_rate: Sequence[float],
    decode_rate: Sequence[float],
    spread: int = 1,
    instance_gpus: tuple[int, int] = (1, 1),
) -> list[Split]:
    """The integer splits around ``balanced_counts``: every class rounded down and up, the
    class that is split moved by up to ``spread`` servers either way, and that class's
    counts at which a pool holds a whole number of instances (``whole_instance_counts``,
    ``instance_gpus`` the GPUs of one prefill and one decode instance)."""
    sizes = [len(c.servers) for c in space.classes]
    frac = balanced_counts(sizes, prefill_rate, decode_rate)
    options = []
    for c, x in enumerate(frac):
        lo, hi = math.floor(x), math.ceil(x)
        near = {lo, hi}
        if lo != hi or 0 < x < sizes[c]:
            near |= {lo - d for d in range(1, spread + 1)} | {hi + d for d in range(1, spread + 1)}
            near |= whole_instance_counts(space, frac, c, instance_gpus)
        options.append(sorted(v for v in near if 0 <= v <= sizes[c]))
    return [space.split(k) for k in itertools.product(*options)]


def whole_instance_counts(
    space: RoleSpace, frac: Sequence[float], c: int, instance_gpus: tuple[int, int]
) -> set[int]:
    """Counts of class ``c``'s prefill servers, the other classes at ``frac`` (whole), at
    which the prefill pool holds a whole number of prefill instances (the multiples of
    ``instance_gpus[0]`` GPUs just below and above its GPUs at ``frac``), or the decode pool
    of decode instances. Why: an instance is a block of TP x PP GPUs, often several servers,
    so near the balance point one role's rate moves in steps; a count one server off the
    balance point can leave the coarser role a whole instance short (2tracks-96: decode
    instances of 6 servers, 22 decode servers serve three of them, 24 serve four)."""
    per = space.classes[c].key[2]  # free GPUs per server of class c
    n = len(space.classes[c].servers)
    other_p = len(space.fixed_prefill)
    other_d = len(space.fixed_decode)
    for i, (k, x) in enumerate(zip(space.classes, frac, strict=True)):
        if i != c:
            other_p += round(x) * k.key[2]
            other_d += (len(k.servers) - round(x)) * k.key[2]
    out = set()
    u_p, u_d = instance_gpus
    pre = other_p + frac[c] * per  # prefill GPUs at the balance point
    for want in {math.floor(pre / u_p) * u_p, math.ceil(pre / u_p) * u_p} - {0}:
        out.add(-(-max(0, want - other_p) // per))  # fewest servers that hold ``want``
    dec = other_d + (n - frac[c]) * per
    for want in {math.floor(dec / u_d) * u_d, math.ceil(dec / u_d) * u_d} - {0}:
        out.add(n + (max(0, want - other_d) // -per))
    return {k for k in out if 0 <= k <= n}
