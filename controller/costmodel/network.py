"""Communication costs (docs/design.md §5, paper Eqs. 6-11): the machinery every scheme's
pattern is built from. Units: bytes, seconds.

A collective is a :class:`CommPattern`: one or more sequential :class:`Phase` s, each a set of
flows (a route and the share of the message it carries) that run at once and share links, in
``rounds`` rounds. Flows of one phase that cross a link in the same direction are priced at
the sum of their bytes (the shared-link rule). How a loaded path is priced is the fabric's
cost mode (``controller.topology.fabric``): pipelined (the default) or the paper's store and
forward. Routes are chosen once for a reference message size; ``CommPattern.time`` then
prices the same routes for any size, which is what the planner's batch search and the
simulator need: with every load proportional to the message, each flow's time is affine in
it, so a phase is compiled once per fabric (:func:`compile_phase`) into per-flow slopes and
intercepts that both the cost model and the simulator evaluate.

Holds: flow prices (:func:`flow_times`, :func:`path_time`), route choice under shared links
(:func:`choose_routes`), phases and their compiled form (:class:`Phase`,
:class:`CompiledPhase`, :func:`compile_phase`) and patterns (:class:`CommPattern`,
:class:`RailPattern`). The schemes build patterns elsewhere: ``ring`` in ``ring.py`` (Eq. 11,
NCCL's ring), ``ina`` in ``ina.py`` (Eqs. 8-10, flat in-network aggregation), ``hier`` in
``hier.py`` (hierarchical INA: NVLink reduce-scatter, INA per rail, NVLink all-gather); their
parameters (:class:`NetParams`, INA lane formats) are in ``netparams.py``. docs/costmodel.md
gives every formula and parameter source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.topology.fabric import Edge, Fabric, Path


# -- flows and their prices --------------------------------------------------------------
def _edges(path: Sequence[str]) -> list[Edge]:
    return list(zip(path, path[1:], strict=False))


def flow_times(
    fabric: Fabric, flows: Sequence[tuple[Path, float]], packet_bytes: float | None = None
) -> list[float]:
    """Time of each flow (path, bytes) when all run at once and share links (Eq. 10 with the
    shared-link rule), in the fabric's cost mode. O(total hops)."""
    table = fabric.link_table
    load: dict[Edge, float] = defaultdict(float)
    edges = [_edges(p) for p, _ in flows]
    for es, (_, nbytes) in zip(edges, flows, strict=True):
        for e in es:
            load[e] += nbytes
    return [
        fabric.combine([load[e] * table[e][0] for e in es]) + fabric.fixed_s(es, packet_bytes)
        for es in edges
    ]


def path_time(fabric: Fabric, path: Path, nbytes: float) -> float:
    """One flow alone (``flow_times`` of one flow): ``Fabric.path_time``."""
    return fabric.path_time(path, nbytes)


def written_time(fabric: Fabric, path: Path, nbytes: float, bottleneck: bool = False) -> float:
    """One flow alone as the paper writes it, no latency: ``sum_e D / B(e)`` over its route
    (Eq. 10), or ``D / min_e B(e)`` with ``bottleneck`` (Eq. 11)."""
    inv = [fabric.link_table[e][0] for e in _edges(path)]
    return nbytes * ((max(inv) if bottleneck else sum(inv)) if inv else 0.0)


def written_route(fabric: Fabric, options: Sequence[Path], bottleneck: bool = False) -> Path:
    """The route among ``options`` that is cheapest alone as the paper writes it
    (``written_time``); ties to the sum over hops, then to the first listed."""
    if not options:
        raise ValueError("a flow has no route")
    return min(options, key=lambda p: (written_time(fabric, p, 1.0, bottleneck),
                                       written_time(fabric, p, 1.0)))  # fmt: skip


class _Loads:
    """Link loads of a set of flows with each flow's time kept current, so that trying one
    more route costs O(its hops + the flows sharing them) instead of re-pricing every flow.
    Store and forward, a sharer's time moves by the bytes times 1/B; pipelined, adding load
    can only raise a sharer's slowest hop, and removing it re-prices only the sharers whose
    slowest hop it was."""

    def __init__(self, fabric: Fabric, packet_bytes: float | None = None) -> None:
        self.fabric = fabric
        self.pipe = fabric.pipelined
        self.pkt = packet_bytes
        self.table = fabric.link_table
        self.load: dict[Edge, float] = defaultdict(float)
        self.on_edge: dict[Edge, list[int]] = defaultdict(list)
        self.hops: list[list[tuple[Edge, float]]] = []  # per flow: (link, 1 / B)
        self.nbytes: list[float] = []
        self.fixed: list[float] = []
        self.times: list[float] = []
        self._shapes = fabric.memo.setdefault(("shape", packet_bytes), {})

    def _shape(self, path: Path) -> tuple[list[tuple[Edge, float]], float]:
        """A route's (link, 1 / B) hops and fixed part, kept per route object on the fabric
        (candidate routes are built once and tried again and again)."""
        hit = self._shapes.get(id(path))
        if hit is None or hit[0] is not path:
            edges = _edges(path)
            hops = [(e, self.table[e][0]) for e in edges]
            hit = self._shapes[id(path)] = (path, hops, self.fabric.fixed_s(edges, self.pkt))
        return hit[1], hit[2]

    def _time(self, k: int) -> float:
        load = self.load
        if self.pipe:
            worst = 0.0
            for e, inv in self.hops[k]:
                x = load[e] * inv
                if x > worst:
                    worst = x
            return worst + self.fixed[k]
        return sum(load[e] * inv for e, inv in self.hops[k]) + self.fixed[k]

    def trial(self, path: Path, nbytes: float) -> float:
        """Slowest flow if a flow of ``nbytes`` on ``path`` joined."""
        hops, fixed = self._shape(path)
        load, times, on_edge = self.load, self.times, self.on_edge
        worst = max(times, default=0.0)
        if self.pipe:  # a sharer's slowest hop may become this one
            own = 0.0
            for e, inv in hops:
                x = (load[e] + nbytes) * inv
                if x > own:
                    own = x
                for i in on_edge[e]:
                    t = x + self.fixed[i]
                    if t > worst:
                        worst = t
            own += fixed
        else:  # a sharer's sum grows by this flow's bytes on each shared hop
            own = fixed
            delta: dict[int, float] = defaultdict(float)
            for e, inv in hops:
                own += (load[e] + nbytes) * inv
                for i in on_edge[e]:
                    delta[i] += nbytes * inv
            for i, d in delta.items():
                if times[i] + d > worst:
                    worst = times[i] + d
        return own if own > worst else worst

    def _put(self, k: int) -> None:
        nb, fixed, times = self.nbytes[k], self.fixed, self.times
        load, on_edge = self.load, self.on_edge
        own = 0.0
        if self.pipe:
            for e, inv in self.hops[k]:
                le = load[e] = load[e] + nb
                x = le * inv
                if x > own:
                    own = x
                sharers = on_edge[e]
                for i in sharers:
                    if x + fixed[i] > times[i]:
                        times[i] = x + fixed[i]
                sharers.append(k)
        else:
            for e, inv in self.hops[k]:
                le = load[e] = load[e] + nb
                own += le * inv
                sharers = on_edge[e]
                for i in sharers:
                    times[i] += nb * inv
                sharers.append(k)
        times[k] = own + fixed[k]

    def _take(self, k: int) -> None:
        nb, fixed, times = self.nbytes[k], self.fixed, self.times
        load, on_edge = self.load, self.on_edge
        if not self.pipe:
            for e, inv in self.hops[k]:
                sharers = on_edge[e]
                sharers.remove(k)
                for i in sharers:
                    times[i] -= nb * inv
                load[e] -= nb
            return
        stale: list[int] = []
        for e, inv in self.hops[k]:
            sharers = on_edge[e]
            sharers.remove(k)
            x = load[e] * inv
            for i in sharers:  # sharers whose slowest hop this was
                if times[i] <= (x + fixed[i]) * (1 + 1e-12):
                    stale.append(i)
            load[e] -= nb
        for i in stale:
            times[i] = self._time(i)

    def add(self, path: Path, nbytes: float) -> int:
        k = len(self.hops)
        hops, fixed = self._shape(path)
        self.hops.append(hops)
        self.nbytes.append(nbytes)
        self.fixed.append(fixed)
        self.times.append(0.0)
        self._put(k)
        return k

    def move(self, k: int, path: Path) -> None:
        """Re-route flow ``k``."""
        self._take(k)
        self.hops[k], self.fixed[k] = self._shape(path)
        self._put(k)

    def worst(self) -> float:
        return max(self.times, default=0.0)


def choose_routes(
    fabric: Fabric,
    options: Sequence[Sequence[Path]],
    nbytes: Sequence[float],
    sweeps: int = 2,
    background: Sequence[tuple[Path, float]] = (),
    packet_bytes: float | None = None,
) -> tuple[list[Path], float]:
    """Pick one route per flow so that the slowest flow finishes first.

    Greedy in flow order, then up to ``sweeps`` rounds in which each flow re-picks its route
    given the others. ``background`` flows share the links but are not re-routed. Returns the
    routes and the time of the slowest flow. Each try is priced incrementally (``_Loads``):
    O(sweeps * F * R * (hops + sharing flows)) for F flows with R candidate routes."""
    if any(len(o) == 0 for o in options):
        raise ValueError("a flow has no route")
    state = _Loads(fabric, packet_bytes)
    for p, b in background:
        state.add(p, b)
    base = len(background)
    chosen: list[Path] = []
    for opts, nb in zip(options, nbytes, strict=True):
        best = min(opts, key=lambda p: state.trial(p, nb)) if len(opts) > 1 else opts[0]
        chosen.append(best)
        state.add(best, nb)
    for _ in range(sweeps):
        improved = False
        for i, opts in enumerate(options):
            if len(opts) < 2:
                continue
            current = state.worst()
            for p in opts:
                if p is chosen[i]:
                    continue
                old = chosen[i]
                state.move(base + i, p)
                if state.worst() < current - 1e-15:
                    chosen[i], current, improved = p, state.worst(), True
                else:
                    state.move(base + i, old)
        if not improved:
            break
    return chosen, state.worst()


# -- collectives -------------------------------------------------------------------------
# A chain term: (hops, flow indices, per-hop overhead): a pipelined phase's latency is what one
# chunk accumulates along ``hops`` hops of the kind those flows are (module docs of Phase).
Chain = tuple[tuple[float, tuple[int, ...], float], ...]


@dataclass
class Phase:
    """Flows that run at once, ``rounds`` times in a row.

    ``flows``: (route, bytes on it per byte of message). Not ``duplex``: a round lasts as
    long as its slowest flow plus ``per_round_s``; pipelined, a phase with a ``chain`` is
    instead NCCL's pipelined ring, ``rounds`` times the slowest flow's bytes-over-bandwidth
    plus the latency a chunk accumulates along the chain (each term: hops x (the slowest
    latency among those flows + the per-hop overhead)), as NCCL's tuning model prices it.
    ``duplex`` (INA): each flow goes up to a switch and its result comes back down the same
    route (full duplex, so both ways carry the share); the flows of a ``group`` (one
    aggregation: all of them when ``groups`` is empty) finish together. Paper mode prices
    each flow's round trip store and forward (T_col + T_dis, Eq. 8); pipelined, a group is
    one stream: its most loaded link, up or down, plus its longest round trip's latency.
    ``fixed_s`` is paid once (T_agg and the host overhead for INA); ``packet_bytes`` is the
    packet a pipelined hop serialises (None: the fabric's). ``bottleneck``: a flow moves its
    bytes at its most loaded hop's rate in either mode (a ring step, Eq. 11's ``D / min B``);
    otherwise the fabric's mode combines the hops (paper: their sum, Eq. 10). ``alone``
    (the paper's mode as written, Eqs. 9-11): each flow is priced over its own route with its
    own bytes, as if the collective's other flows were absent, and without latency, packet or
    per-hop terms (the phase's ``per_round_s`` and ``fixed_s`` still count)."""

    flows: list[tuple[Path, float]]
    rounds: float = 1.0
    per_round_s: float = 0.0
    fixed_s: float = 0.0
    duplex: bool = False
    groups: tuple[tuple[int, ...], ...] = ()
    packet_bytes: float | None = None
    chain: Chain = ()
    bottleneck: bool = False
    alone: bool = False


@dataclass(frozen=True)
class CompiledPhase:
    """A phase priced on one fabric: ``time(D) = rounds * max_f (D * combine(k_f) + lat_f) +
    const_s``, with ``terms`` the (link, seconds per byte of message) of each flow, combined by
    the fabric's mode (max pipelined, sum store and forward) or, for a ``bottleneck`` phase,
    by max in both."""

    rounds: float
    flows: tuple[tuple[tuple[tuple[Edge, float], ...], float], ...]
    const_s: float
    slopes: tuple[float, ...]  # combine(k_f) per flow
    loads: tuple[tuple[Edge, float], ...]  # bytes on each link per byte of message, per round
    bottleneck: bool = False  # its flows combine their links by max in either mode (Phase)
    by_max: bool = True  # its flows' terms combine by max (pipelined or bottleneck), else sum
    alone: bool = False  # each flow's terms are its own bytes, not the link's load (Phase)

    def time(self, nbytes: float) -> float:
        worst = 0.0
        for (_, lat), k in zip(self.flows, self.slopes, strict=True):
            t = nbytes * k + lat
            if t > worst:
                worst = t
        return self.rounds * worst + self.const_s if self.flows else self.const_s

    def stretched_time(self, nbytes: float, stretch: Mapping[Edge, float]) -> float:
        """``time`` with each link's seconds per byte multiplied by its stretch factor
        (``stretch``, 1 where absent), the flows' terms combined as ``time`` combines them:
        the phase run on links that other traffic shares (``costmodel.sharing``)."""
        worst = 0.0
        for terms, lat in self.flows:
            ks = [k * stretch.get(e, 1.0) for e, k in terms]
            t = nbytes * ((max(ks) if self.by_max else sum(ks)) if ks else 0.0) + lat
            if t > worst:
                worst = t
        return self.rounds * worst + self.const_s if self.flows else self.const_s


def compile_phase(fabric: Fabric, phase: Phase) -> CompiledPhase:
    """Price ``phase`` on ``fabric`` (loads per byte of message, the mode's combination)."""
    table = fabric.link_table
    load: dict[Edge, float] = defaultdict(float)
    edges = []
    for path, share in phase.flows:
        es = _edges(path)
        if phase.duplex:
            es = es + [(v, u) for u, v in reversed(es)]  # the result's way back
        edges.append(es)
        for e in es:
            load[e] += share
    pkt = phase.packet_bytes
    out: list[tuple[tuple[tuple[Edge, float], ...], float]] = []
    const = phase.fixed_s + phase.rounds * phase.per_round_s

    def terms(es: list[Edge]) -> tuple[tuple[Edge, float], ...]:
        return tuple((e, load[e] * table[e][0]) for e in es)

    if phase.alone:  # each flow's own share on each of its links, no latency (Phase)
        out = [
            (tuple((e, share * table[e][0]) for e in es), 0.0)
            for es, (_, share) in zip(edges, phase.flows, strict=True)
        ]
    elif phase.duplex and fabric.pipelined:
        groups = phase.groups or (tuple(range(len(edges))),)
        for grp in groups:
            links: dict[Edge, None] = {}
            for i in grp:
                links.update(dict.fromkeys(edges[i]))
            lat = max(fabric.fixed_s(edges[i], pkt) for i in grp)
            out.append((terms(list(links)), lat))
    elif phase.chain and fabric.pipelined:
        lats = [fabric.fixed_s(es, pkt) for es in edges]
        out = [(terms(es), 0.0) for es in edges]
        const = phase.fixed_s + sum(
            hops * (max((lats[i] for i in idx), default=0.0) + step)
            for hops, idx, step in phase.chain
        )
    else:
        out = [(terms(es), fabric.fixed_s(es, pkt)) for es in edges]
    if phase.bottleneck:
        slopes = tuple(max((k for _, k in t), default=0.0) for t, _ in out)
    else:
        slopes = tuple(fabric.combine([k for _, k in t]) for t, _ in out)
    return CompiledPhase(
        float(phase.rounds), tuple(out), const, slopes, tuple(load.items()), phase.bottleneck,
        phase.bottleneck or fabric.pipelined, phase.alone,
    )  # fmt: skip


@dataclass
class RailPattern:
    """One rail of a hierarchical-INA group (``Plan.Group.rails`` without the slots): the
    members (one per server) that hold shard ``shard`` of ``shards`` after the intra-server
    reduce-scatter, the switch that aggregates it, and each member's route to the switch."""

    switch: str
    shard: int
    shards: int
    members: list[str]
    paths: dict[str, Path]


@dataclass
class CommPattern:
    """A collective as sequential phases of flows over fixed routes.

    ``time(D) = sum over phases`` (see :class:`Phase`). ``paths`` maps each member to the
    route the plan records (INA and hier: to its switch; ring: to its successor); ``rails``
    are a hier pattern's per-rail aggregations."""

    scheme: str  # "ring", "ina" or "hier"
    phases: list[Phase]
    switch: str | None = None
    paths: dict[str, Path] = field(default_factory=dict)
    rails: list[RailPattern] = field(default_factory=list)
    _compiled: tuple[Fabric, list[CompiledPhase]] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def one_phase(
        cls,
        scheme: str,
        flows: list[tuple[Path, float]],
        rounds: float,
        per_round_s: float,
        fixed_s: float = 0.0,
        switch: str | None = None,
        paths: dict[str, Path] | None = None,
    ) -> CommPattern:
        """Rounds of concurrent flows (a round: the slowest flow plus ``per_round_s``)."""
        return cls(scheme, [Phase(flows, rounds, per_round_s, fixed_s)], switch, paths or {})

    @property
    def flows(self) -> list[tuple[Path, float]]:
        """Every flow of every phase."""
        return [f for ph in self.phases for f in ph.flows]

    def compiled(self, fabric: Fabric) -> list[CompiledPhase]:
        """The phases priced on ``fabric`` (kept for the last fabric asked)."""
        hit = self._compiled
        if hit is None or hit[0] is not fabric:
            hit = self._compiled = (fabric, [compile_phase(fabric, ph) for ph in self.phases])
        return hit[1]

    def time(self, fabric: Fabric, nbytes: float) -> float:
        return sum(c.time(nbytes) for c in self.compiled(fabric))

    def max_path_latency(self, fabric: Fabric) -> float:
        table = fabric.link_table
        return max(
            (sum(table[e][1] for e in _edges(p)) for p, _ in self.flows),
            default=0.0,
        )
