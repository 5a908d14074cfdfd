"""Online scheduler: pick INA, hierarchical INA, ring or NVLS and the route for every
all-reduce (docs/design.md §8).

This is the reference implementation of paper section III-D (Eqs. 16-18). The C++ policy core
(``csrc/src/policy.cc``) mirrors it operation for operation, in IEEE double, so both give the
same choices and costs on ``tests/vectors/online_scheduler.json``. Keep the two in step: when
an expression changes here, change it there in the same order.

Units: bytes for transfer sizes, bytes/s for link capacities and policy bandwidths, seconds
for the window T_u and policy latencies. A cost b_c is dimensionless: the fraction of one
window T_u the policy is busy, so a transfer's increment delta_c and a measured utilisation
(also a fraction of the window) are on the same scale.

Rules (one group, one table at a time):

* Eq. 16: delta_c = (latency_s_c + D / bandwidth_c) / T_u, the policy's uncontended time for
  D bytes (the cost model's t_c(D), made affine by the table's two optional fields) as a
  fraction of the window. The paper divides by b_c; docs/design.md §8 reads it as the policy's
  bandwidth. latency_s defaults to 0 and bandwidth to the bottleneck capacity (min over c's
  links), which gives the original delta_c = D / (T_u * bottleneck).
  It is computed as ``latency_s / T_u + D / (T_u * bandwidth)``, in that order: with the
  defaults the first term is exactly +0.0 and the second is the original expression, so a
  table without the two fields gives bit for bit the costs it gave before they existed.
  J(c, D) = b_c + delta_c; c* = argmin J, ties broken to the lowest policy id.
* Eq. 17 (as docs/design.md §8 reads it): b_{c*} += delta_{c*}; for c != c*,
  b_c += delta_{c*} * f(c*, c).
* Eq. 18: at each window boundary (:meth:`OnlineScheduler.observe_utilisation`),
  f(c*, c) <- (1 - gamma) f(c*, c) + gamma W(c*, c), with
  W(c*, c) = (sum of utilisation over links shared by c* and c) / (sum over c's links),
  0/0 read as 0. f starts at W computed from the table's utilisation.
* Window decay (our choice, the paper leaves it open): at the same boundary
  b_c <- (1 - gamma) b_c + gamma U_c, where U_c is the measured maximum utilisation over c's
  links (the bottleneck's busy fraction). Costs therefore forget old selections at the rate
  gamma per window and track what the network actually measured.
* Versions: :meth:`OnlineScheduler.install` queues a table; it takes effect at the first
  :meth:`OnlineScheduler.select` whose sequence number is >= ``apply_from_seq`` (every member
  of the group counts collectives from 0, so all members switch at the same collective).
  A table taking effect drops queued older versions (the controller superseded them).
  Activating a table resets b to the table's ``cost`` fields and f to W of its utilisation.
  A table whose version is not above every version already seen is stale and ignored.

Sums run over a policy's links in the order the table lists them, with a plain loop (not
``sum()``, whose float algorithm differs between Python versions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEMES = ("ina", "ring", "nvls", "hier")
# Bounds on one table (docs/policy-table.md), the same in the C++ core: a table comes from the
# wire or shared memory, so its size is bounded before anything loops over it.
MAX_POLICIES = 256  # the plugin's per-policy counters (csrc shm kMaxPolicies)
MAX_LINKS = 4096
MAX_PATH_MEMBERS = 4096
MAX_PATH_HOPS = 64
MAX_RAILS = 64


class TableError(ValueError):
    """A policy table that breaks docs/policy-table.md; the message names the field."""


@dataclass(frozen=True)
class Policy:
    """One candidate policy c: its links (indices into the table's links), bottleneck and
    the affine time model of Eq. 16 (latency_s + D / bandwidth)."""

    id: int
    scheme: str
    switch: str
    links: tuple[int, ...]
    bottleneck: float  # bytes/s, min capacity over the policy's links
    cost: float  # b_c when the table takes effect
    latency_s: float = 0.0  # s, the policy's time for 0 bytes
    bandwidth: float = 0.0  # bytes/s, effective; parse_table sets the bottleneck when absent
    rails: tuple[tuple[int, str], ...] = ()  # hier: (shard, switch) per rail, in shard order


@dataclass(frozen=True)
class PolicyTable:
    """A validated table (docs/policy-table.md)."""

    group_id: str
    version: int
    apply_from_seq: int
    window_s: float
    gamma: float
    link_ids: tuple[str, ...]
    capacities: tuple[float, ...]
    policies: tuple[Policy, ...]
    utilisation: tuple[float, ...]  # per link, index-aligned with link_ids

    def link_index(self) -> dict[str, int]:
        return {lid: i for i, lid in enumerate(self.link_ids)}


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TableError(f"{what} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise TableError(f"{what} must be finite, got {value!r}")
    return out


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**64:
        raise TableError(f"{what} must be an unsigned 64-bit integer, got {value!r}")
    return value


def _utilisation_vector(
    utilisation: Any, index: Mapping[str, int], what: str, strict: bool
) -> list[float]:
    if not isinstance(utilisation, Mapping):
        raise TableError(f"{what} must be a map link id -> utilisation")
    out = [0.0] * len(index)
    for lid, value in utilisation.items():
        u = _number(value, f"{what}[{lid!r}]")
        if not 0.0 <= u <= 1.0:
            raise TableError(f"{what}[{lid!r}] = {u} is outside [0, 1]")
        if lid not in index:
            if strict:
                raise TableError(f"{what} names unknown link {lid!r}")
            continue  # telemetry may cover links outside this group
        out[index[lid]] = u
    return out


def _rails(raw: Any, scheme: str, switch: str, pid: int) -> tuple[tuple[int, str], ...]:
    """A hier policy's rails: a non-empty list of {shard, switch}, shards 0..n-1 in order,
    and no switch of its own; any other scheme has none."""
    if not isinstance(raw, list):
        raise TableError(f"policy {pid}: rails must be a list")
    if scheme != "hier":
        if raw:
            raise TableError(f"policy {pid}: rails are for hier policies only")
        return ()
    if switch:
        raise TableError(
            f"policy {pid}: a hier policy's switch must be empty (its rails name them)"
        )
    if not raw:
        raise TableError(f"policy {pid}: a hier policy needs a non-empty rails list")
    if len(raw) > MAX_RAILS:
        raise TableError(f"policy {pid}: more than {MAX_RAILS} rails")
    out: list[tuple[int, str]] = []
    for k, r in enumerate(raw):
        shard = r.get("shard") if isinstance(r, Mapping) else None
        sw = r.get("switch") if isinstance(r, Mapping) else None
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < 2**32:
            raise TableError(f"policy {pid}: rails[{k}].shard must be a uint32")
        if shard != k:
            raise TableError(
                f"policy {pid}: rails[{k}].shard is {shard}: rails must list shards 0, 1, ... "
                "in order"
            )
        if not isinstance(sw, str) or not sw:
            raise TableError(f"policy {pid}: rails[{k}].switch must be a non-empty string")
        out.append((shard, sw))
    return tuple(out)


def _check_paths(paths: Any, pid: int) -> None:
    """Routes are informational to the scheduler, but bounded: a map GPU id -> node list."""
    if not isinstance(paths, Mapping):
        raise TableError(f"policy {pid}: paths must be a map")
    if len(paths) > MAX_PATH_MEMBERS:
        raise TableError(f"policy {pid}: paths names more than {MAX_PATH_MEMBERS} members")
    for gpu, route in paths.items():
        if not isinstance(route, list):
            raise TableError(f"policy {pid}: paths values must be lists")
        if len(route) > MAX_PATH_HOPS:
            raise TableError(f"policy {pid}: the path of {gpu} has more than {MAX_PATH_HOPS} nodes")
        if not all(isinstance(n, str) for n in route):
            raise TableError(f"policy {pid}: path nodes must be strings")


def parse_table(data: Mapping[str, Any]) -> PolicyTable:
    """Validate a table in the JSON form of docs/policy-table.md; raise :class:`TableError`."""
    if not isinstance(data, Mapping):
        raise TableError("a policy table must be a JSON object")
    for key in ("group_id", "version", "apply_from_seq", "window_s", "gamma", "links", "policies"):
        if key not in data:
            raise TableError(f"policy table lacks {key!r}")
    group_id = data["group_id"]
    if not isinstance(group_id, str) or not group_id:
        raise TableError("group_id must be a non-empty string")
    version = _uint(data["version"], "version")
    apply_from_seq = _uint(data["apply_from_seq"], "apply_from_seq")
    window_s = _number(data["window_s"], "window_s")
    if window_s <= 0.0:
        raise TableError(f"window_s must be > 0, got {window_s}")
    gamma = _number(data["gamma"], "gamma")
    if not 0.0 <= gamma <= 1.0:
        raise TableError(f"gamma must be in [0, 1], got {gamma}")
    links = data["links"]
    if not isinstance(links, list) or not links:
        raise TableError("links must be a non-empty list")
    if len(links) > MAX_LINKS:
        raise TableError(f"links lists {len(links)} links, more than {MAX_LINKS}")
    link_ids: list[str] = []
    caps: list[float] = []
    for i, link in enumerate(links):
        if not isinstance(link, Mapping) or "id" not in link or "capacity" not in link:
            raise TableError(f"links[{i}] must be an object with id and capacity")
        lid = link["id"]
        if not isinstance(lid, str) or not lid:
            raise TableError(f"links[{i}].id must be a non-empty string")
        if lid in link_ids:
            raise TableError(f"link {lid!r} is listed twice")
        cap = _number(link["capacity"], f"links[{i}].capacity")
        if cap <= 0.0:
            raise TableError(f"link {lid!r} capacity must be > 0, got {cap}")
        link_ids.append(lid)
        caps.append(cap)
    index = {lid: i for i, lid in enumerate(link_ids)}
    raw_policies = data["policies"]
    if not isinstance(raw_policies, list) or not raw_policies:
        raise TableError("policies must be a non-empty list")
    if len(raw_policies) > MAX_POLICIES:
        raise TableError(f"policies lists {len(raw_policies)} policies, more than {MAX_POLICIES}")
    policies: list[Policy] = []
    for i, p in enumerate(raw_policies):
        if not isinstance(p, Mapping):
            raise TableError(f"policies[{i}] must be an object")
        for key in ("id", "scheme", "links", "cost"):
            if key not in p:
                raise TableError(f"policies[{i}] lacks {key!r}")
        pid = p["id"]
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 2**32:
            raise TableError(f"policies[{i}].id must be a uint32, got {pid!r}")
        if policies and pid <= policies[-1].id:
            raise TableError(f"policies must be in increasing id order (id {pid} at {i})")
        scheme = p["scheme"]
        if scheme not in SCHEMES:
            raise TableError(f"policy {pid}: scheme must be one of {SCHEMES}, got {scheme!r}")
        switch = p.get("switch", "")
        if not isinstance(switch, str):
            raise TableError(f"policy {pid}: switch must be a string")
        rails = _rails(p.get("rails", []), scheme, switch, pid)
        _check_paths(p.get("paths", {}), pid)
        plinks = p["links"]
        if not isinstance(plinks, list) or not plinks:
            raise TableError(f"policy {pid}: links must be a non-empty list")
        idx: list[int] = []
        for lid in plinks:
            if lid not in index:
                raise TableError(f"policy {pid}: unknown link {lid!r}")
            if index[lid] in idx:
                raise TableError(f"policy {pid}: link {lid!r} listed twice")
            idx.append(index[lid])
        bottleneck = caps[idx[0]]
        for k in idx[1:]:
            if caps[k] < bottleneck:
                bottleneck = caps[k]
        cost = _number(p["cost"], f"policy {pid}: cost")
        if cost < 0.0:
            raise TableError(f"policy {pid}: cost must be >= 0, got {cost}")
        latency = 0.0
        if "latency_s" in p:
            latency = _number(p["latency_s"], f"policy {pid}: latency_s")
            if latency < 0.0:
                raise TableError(f"policy {pid}: latency_s must be >= 0, got {latency}")
        bandwidth = bottleneck
        if "bandwidth" in p:
            bandwidth = _number(p["bandwidth"], f"policy {pid}: bandwidth")
            if bandwidth <= 0.0:
                raise TableError(f"policy {pid}: bandwidth must be > 0, got {bandwidth}")
        policies.append(
            Policy(pid, scheme, switch, tuple(idx), bottleneck, cost, latency, bandwidth, rails)
        )
    util = _utilisation_vector(data.get("utilisation", {}), index, "utilisation", strict=True)
    return PolicyTable(
        group_id=group_id,
        version=version,
        apply_from_seq=apply_from_seq,
        window_s=window_s,
        gamma=gamma,
        link_ids=tuple(link_ids),
        capacities=tuple(caps),
        policies=tuple(policies),
        utilisation=tuple(util),
    )


def sharing_ratio(table: PolicyTable, util: list[float] | tuple[float, ...], i: int, j: int):
    """W(c_i, c_j) of Eq. 18: utilisation on links c_i and c_j share over c_j's total; 0/0 = 0."""
    shared = 0.0
    total = 0.0
    mine = table.policies[i].links
    for k in table.policies[j].links:
        total += util[k]
        if k in mine:
            shared += util[k]
    if total == 0.0:
        return 0.0
    return shared / total


class OnlineScheduler:
    """Per-group online scheduler state: costs b, penalties f, sequence number, tables.

    ``select(nbytes)`` returns the chosen policy id and advances the collective sequence;
    ``observe_utilisation`` closes a window (Eq. 18 and the cost decay); ``install`` queues a
    new table version. Single-threaded: one object per group member.
    """

    def __init__(self, table: Mapping[str, Any] | PolicyTable | None = None) -> None:
        self.seq = 0  # sequence number of the next collective
        self.table: PolicyTable | None = None
        self.costs: list[float] = []  # b_c, index-aligned with table.policies
        self.penalty: list[list[float]] = []  # f[i][j] = f(c_i, c_j)
        self.util: list[float] = []
        self.last_cost = 0.0  # J(c*, D) of the last selection
        self.late_tables = 0  # tables that arrived after their apply_from_seq
        self._pending: list[PolicyTable] = []
        self._max_version = -1
        if table is not None:
            self.install(table)

    @property
    def version(self) -> int | None:
        """Version of the table in force, None before the first one takes effect."""
        return None if self.table is None else self.table.version

    def install(self, table: Mapping[str, Any] | PolicyTable) -> bool:
        """Queue a table; False (ignored) when its version is not above all seen so far."""
        t = table if isinstance(table, PolicyTable) else parse_table(table)
        if t.version <= self._max_version:
            return False
        self._max_version = t.version
        if t.apply_from_seq < self.seq:
            self.late_tables += 1  # members may have switched earlier: the controller was late
        self._pending.append(t)
        self._pending.sort(key=lambda x: (x.apply_from_seq, x.version))
        return True

    def _activate_due(self) -> None:
        due = None
        while self._pending and self._pending[0].apply_from_seq <= self.seq:
            cand = self._pending.pop(0)
            if due is None or cand.version > due.version:
                due = cand
        if due is None:
            return
        # A newer version that took effect supersedes older ones still waiting.
        self._pending = [p for p in self._pending if p.version > due.version]
        self.table = due
        self.costs = [p.cost for p in due.policies]
        self.util = list(due.utilisation)
        n = len(due.policies)
        self.penalty = [
            [0.0 if i == j else sharing_ratio(due, self.util, i, j) for j in range(n)]
            for i in range(n)
        ]

    def select(self, nbytes: int | float) -> int:
        """Eqs. 16-17 for a transfer of ``nbytes`` bytes; return the chosen policy id."""
        self._activate_due()
        t = self.table
        if t is None:
            raise RuntimeError(f"no policy table in force at collective {self.seq}")
        d = float(nbytes)
        if not d >= 0.0:
            raise ValueError(f"transfer size must be >= 0 bytes, got {nbytes!r}")
        best = -1
        best_j = 0.0
        deltas = []
        for i, p in enumerate(t.policies):
            # Eq. 16; the C++ core computes the same two terms in the same order.
            delta = p.latency_s / t.window_s + d / (t.window_s * p.bandwidth)
            deltas.append(delta)
            j = self.costs[i] + delta
            if best < 0 or j < best_j:
                best, best_j = i, j
        dstar = deltas[best]
        row = self.penalty[best]
        for i in range(len(self.costs)):
            if i == best:
                self.costs[i] = self.costs[i] + dstar
            else:
                self.costs[i] = self.costs[i] + dstar * row[i]
        self.seq += 1
        self.last_cost = best_j
        return t.policies[best].id

    def observe_utilisation(self, utilisation: Mapping[str, float]) -> None:
        """Close a window T_u with measured link utilisation (absent links: 0, unknown: ignored).

        Eq. 18 on every ordered pair, then b_c <- (1 - gamma) b_c + gamma * max_l u_l over c's
        links.
        """
        t = self.table
        if t is None:
            raise RuntimeError("no policy table in force")
        self.util = _utilisation_vector(utilisation, t.link_index(), "utilisation", strict=False)
        g = t.gamma
        n = len(t.policies)
        for i in range(n):
            row = self.penalty[i]
            for j in range(n):
                if i != j:
                    row[j] = (1.0 - g) * row[j] + g * sharing_ratio(t, self.util, i, j)
        for i, p in enumerate(t.policies):
            peak = 0.0
            for k in p.links:
                if self.util[k] > peak:
                    peak = self.util[k]
            self.costs[i] = (1.0 - g) * self.costs[i] + g * peak

    def cost_map(self) -> dict[int, float]:
        """Current b_c by policy id."""
        if self.table is None:
            return {}
        return {p.id: self.costs[i] for i, p in enumerate(self.table.policies)}
