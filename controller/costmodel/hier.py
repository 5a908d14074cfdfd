"""Hierarchical INA (docs/design.md §5): the scheme NCCL's CollNet Direct runs with SHARP switches.

For a group spanning N >= 2 servers with the same number m >= 2 of members on each:

1. **Reduce-scatter** inside each server over NVLink among its m members: each ends with a
   D/m shard summed over its server.
2. **INA per rail**: rail k is the k-th member (index order) of every server; it aggregates
   shard k (D/m bytes, in the INA lane format) at one switch that all its members reach, and
   the switch returns the sum (Eqs. 8-10 on the shard, overlapped when pipelined). All rails
   run at once and share links; each rail is its own aggregation group on its switch.
3. **All-gather** inside each server over NVLink: every member gets the whole sum.

NVLink's reduce-scatter and all-gather are priced as NCCL runs them inside a node: a ring of
m - 1 steps, each GPU sending D/m to its successor (on a mesh board spread over every link,
``ring.server_ring``) (NCCL's ``nsteps = nRanks - 1`` for both
collectives in ``src/graph/tuning.cc``), with NCCL's per-hop NVLink latency; pipelined, as
NCCL's tuning model does, m - 1 times the step's bytes over bandwidth plus the latency of
m - 1 hops. (NCCL's CollNet Direct latency model is the same sum: ``2 (nRanks/nNodes - 1)``
intra-node hops plus one network all-reduce.)

The paper has no hierarchical scheme; its mode prices this one with its own equations: the
NVLink rings as Eq. 11 (m - 1 steps of D/m at the slowest link, ``ring.written_ring``) and
each rail as Eqs. 8-10 on its shard (each member's route alone, FP16 bytes, no latency).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from controller.costmodel.ina import ina_fixed_s, proposal_phase
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import (
    CommPattern,
    Phase,
    RailPattern,
    choose_routes,
    compile_phase,
    written_route,
)
from controller.costmodel.ring import server_blocks, server_ring, written_ring
from controller.topology.fabric import Fabric, Path
from controller.topology.graph import SWITCH


def hier_blocks(fabric: Fabric, members: Sequence[str]) -> list[list[str]] | None:
    """Members by server in NCCL's ring order (``ring.server_blocks``) when the group spans
    at least two servers with the same number m >= 2 of members on each; else None."""
    if any(fabric.g.nodes[x].get("server") is None for x in members):
        return None
    blocks = server_blocks(fabric, members)
    if len(blocks) < 2 or len({len(b) for b in blocks}) != 1 or len(blocks[0]) < 2:
        return None
    return blocks


def _intra_ring(fabric: Fabric, blocks: list[list[str]], params: NetParams) -> Phase | None:
    """Reduce-scatter (or all-gather) in every server at once: NCCL's ring of m - 1 steps of
    D/m over NVLink (module docstring). None when two members have no NVLink/PCIe path."""
    m = len(blocks[0])
    flows: list[tuple[Path, float]] = []
    for b in blocks:
        if any(fabric.nvlink_path(u, b[(i + 1) % m]) is None for i, u in enumerate(b)):
            return None
        if params.as_written:
            flows += written_ring(fabric, b, m - 1, 1.0 / m).flows
        else:
            flows += server_ring(fabric, b, 1.0 / m)  # spread over a mesh board's links
    if params.as_written:
        return Phase(flows, m - 1, 0.0, bottleneck=True, alone=True)
    step = params.ring_step_nvlink_s
    chain = ((float(m - 1), tuple(range(len(flows))), step),)
    return Phase(flows, m - 1, step, chain=chain, bottleneck=True)


def _ina_phase(
    rails: Sequence[tuple[Sequence[str], Mapping[str, Path]]], shards: int, params: NetParams
) -> Phase:
    """All rails' INA at once: each member's shard (D/m in the lane format) up its route and
    the sum back down it; each rail finishes as one aggregation (``Phase.groups``)."""
    share = params.ina_bytes_ratio / shards
    flows: list[tuple[Path, float]] = []
    groups = []
    for members, paths in rails:
        groups.append(tuple(range(len(flows), len(flows) + len(members))))
        flows += [(list(paths[x]), share) for x in members]
    return Phase(
        flows,
        1.0,
        0.0,
        ina_fixed_s(params),
        duplex=True,
        groups=tuple(groups),
        packet_bytes=params.ina_frame_bytes,
        alone=params.as_written,
    )


def _pattern(
    fabric: Fabric, blocks: list[list[str]], rails: list[RailPattern], params: NetParams
) -> CommPattern | None:
    ring = _intra_ring(fabric, blocks, params)
    if ring is None:
        return None
    m = len(blocks[0])
    ina = _ina_phase([(r.members, r.paths) for r in rails], m, params)
    proposals = proposal_phase(ina.flows, ina.groups, params)  # the rails' bfp16 round
    paths = {x: list(p) for r in rails for x, p in r.paths.items()}
    phases = [ring, ina, ring] if proposals is None else [ring, proposals, ina, ring]
    return CommPattern("hier", phases, None, paths, rails)


def rail_switches(fabric: Fabric, rail: Sequence[str]) -> list[str]:
    """INA-capable switches a rail may aggregate at: the first-hop switches its members'
    routes reach (their exits: own NICs, or NVLink peers' with relay) and, when no first-hop
    switch is every member's, the switches one hop above them (the planner's rule for flat
    INA, ``AllReducePricer.ina_candidates``). Whether every member can reach one is for the caller
    to check."""
    g = fabric.g
    reach = [{e[-1] for e in fabric.exits(x)} for x in rail]
    first = set().union(*reach)
    near = set(first)
    if not set.intersection(*reach):
        for a in first:
            near.update(v for v in g.neighbors(a) if g.nodes[v]["kind"] == SWITCH)
    return sorted(s for s in near if g.nodes[s].get("ina"))


def hier_pattern(
    fabric: Fabric,
    members: Sequence[str],
    nbytes: float,
    params: NetParams,
    allowed: Callable[[str], bool] | None = None,
) -> CommPattern | None:
    """Hierarchical INA of ``members`` (module docstring), routes chosen for a message of
    ``nbytes``: rail by rail, each rail at the candidate switch (``rail_switches``, filtered by
    ``allowed``) where the INA phase with the rails already placed is cheapest, its members'
    routes chosen given those rails' flows (they share links; as written, each alone). None
    when the group sits in one server, servers hold different numbers of members, one member
    each (flat INA), or a rail has no switch all its members reach."""
    blocks = hier_blocks(fabric, members)
    if blocks is None:
        return None
    m = len(blocks[0])
    share = nbytes * params.ina_bytes_ratio / m
    frame = params.ina_frame_bytes
    placed: list[RailPattern] = []
    for k in range(m):
        rail = [b[k] for b in blocks]
        best: tuple[float, str, RailPattern] | None = None
        background = [(p, share) for r in placed for p in r.paths.values()]
        for sw in rail_switches(fabric, rail):
            if allowed is not None and not allowed(sw):
                continue
            options = [fabric.routes_to_switch(x, sw) for x in rail]
            if any(not o for o in options):
                continue
            if params.as_written:  # each member's route alone (Eq. 10)
                routes = [written_route(fabric, o) for o in options]
            else:
                routes, _ = choose_routes(
                    fabric, options, [share] * len(rail), 1, background, packet_bytes=frame
                )
            paths = {x: list(r) for x, r in zip(rail, routes, strict=True)}
            cand = RailPattern(sw, k, m, rail, paths)
            phase = _ina_phase([(r.members, r.paths) for r in [*placed, cand]], m, params)
            t = compile_phase(fabric, phase).time(nbytes)
            if best is None or (t, sw) < best[:2]:
                best = (t, sw, cand)
        if best is None:
            return None
        placed.append(best[2])
    return _pattern(fabric, blocks, placed, params)


def hier_on_rails(
    fabric: Fabric,
    members: Sequence[str],
    rails: Sequence[tuple[str, int, Sequence[str], Mapping[str, Path]]],
    params: NetParams,
) -> CommPattern | None:
    """The hierarchical pattern of a plan's group (``Plan.Group.rails``: switch, shard,
    members, each member's route to the switch), priced as ``hier_pattern`` prices its own.
    None when the rails do not fit the group (a member in no rail or two, a shard out of
    range, a rail that is not one member per server)."""
    blocks = hier_blocks(fabric, members)
    if blocks is None or len(rails) != len(blocks[0]):
        return None
    m = len(blocks[0])
    pos = {x: (s, k) for s, b in enumerate(blocks) for k, x in enumerate(b)}
    seen: set[str] = set()
    placed = []
    for switch, shard, rail, paths in rails:
        if not 0 <= shard < m or len(rail) != len(blocks):
            return None
        if {pos.get(x, (None, None))[0] for x in rail} != set(range(len(blocks))):
            return None
        if seen & set(rail) or any(x not in paths for x in rail):
            return None
        seen.update(rail)
        placed.append(RailPattern(switch, shard, m, list(rail), {x: list(paths[x]) for x in rail}))
    return _pattern(fabric, blocks, placed, params)
