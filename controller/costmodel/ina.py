"""Flat in-network aggregation (paper Eqs. 7-10, docs/costmodel.md "Flat INA"): every member
streams its vector up its route to one switch, the switch adds and streams the sum back down.

Holds ``T_AGG_S`` (the switch's aggregation time, Eq. 8), :func:`ina_fixed_s` (what an
aggregation pays once), :func:`ina_from_one_way` (T_ina from the slowest member's one-way
time, the planner's lower bound), :func:`proposal_phase` (bfp16's round of exponent
proposals before the data), :func:`collection_time` (T_col alone, Eqs. 9-10),
:func:`ina_pattern` (routes chosen for the members) and :func:`ina_on_routes` (routes given,
as a plan or the simulator has them). Hierarchical INA builds on these in ``hier.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.costmodel.netparams import NetParams
from controller.costmodel.network import (
    CommPattern,
    Phase,
    choose_routes,
    flow_times,
    written_route,
    written_time,
)
from controller.topology.fabric import Fabric, Path

T_AGG_S = 1e-6  # aggregation inside the switch, Eq. 8 (paper: about 1 us, its refs [42, 43])


def ina_fixed_s(params: NetParams) -> float:
    """What one aggregation pays once: T_agg (Eq. 8) and, in the project's mode, the host's
    synchronisation (``ina_host_s``), which the paper's Eq. 8 does not have."""
    return T_AGG_S if params.as_written else T_AGG_S + params.ina_host_s


def ina_from_one_way(one_way_s: float, params: NetParams) -> float:
    """T_ina from the slowest member's one-way time alone. As written (Eq. 8 with T_dis =
    T_col over the same routes) it is exact: 2 x one way + T_agg; pipelined, where the two
    ways overlap and members share links, a lower bound: one way + the fixed terms."""
    if params.as_written:
        return 2.0 * one_way_s + T_AGG_S
    return one_way_s + T_AGG_S + params.ina_host_s  # (in this order: the floats of old plans)


def proposal_phase(
    flows: Sequence[tuple[Path, float]], groups: tuple[tuple[int, ...], ...], params: NetParams
) -> Phase | None:
    """The lane format's round of exponent proposals (``LaneFormat.proposal_round``: bfp16),
    or None. As agents/ina/transport.py ``allreduce_bfp16`` and the C++ client run it, an
    all-reduce of B packets per member opens with F = min(window, B) packets of zero lanes,
    one per aggregator slot, each carrying the exponent of the slot's first block; slot k's
    first data packet leaves when proposal k's result is back. With the window sized to the
    bandwidth-delay product (docs/costmodel.md "Flat INA"), the F proposals fill at most one
    round trip of the link, so the data stream starts one round trip later: the longest
    round trip's latency and one packet of the data's routes, plus the switch's T_agg, with
    no bytes per byte of message and no second host synchronisation (one loop sends both).
    The paper's Eq. 8 has no such round: none as written."""
    if params.as_written or not params.lane.proposal_round:
        return None
    return Phase(
        [(list(path), 0.0) for path, _ in flows],
        1.0,
        0.0,
        T_AGG_S,
        duplex=True,
        groups=groups,
        packet_bytes=params.ina_frame_bytes,
    )


def ina_on_routes(
    routes: Mapping[str, Path], switch: str, params: NetParams, members: Sequence[str] = ()
) -> CommPattern:
    """Flat INA over given routes (member -> its route up to ``switch``): every member streams
    its vector, as ``params``' lanes on the wire (the FP16 message as written), up its route,
    and the switch streams the sum back down it (Eqs. 8-10; overlapped when pipelined; as
    written, each member's round trip alone), after the lane format's proposal round
    (:func:`proposal_phase`) where it has one."""
    order = list(members) or list(routes)
    flows: list[tuple[Path, float]] = [(list(routes[m]), params.ina_bytes_ratio) for m in order]
    phase = Phase(
        flows,
        1.0,
        0.0,
        ina_fixed_s(params),
        duplex=True,
        packet_bytes=params.ina_frame_bytes,
        alone=params.as_written,
    )
    proposals = proposal_phase(flows, (), params)
    phases = [phase] if proposals is None else [proposals, phase]
    return CommPattern("ina", phases, switch, {m: list(routes[m]) for m in order})


def ina_pattern(
    fabric: Fabric, members: Sequence[str], switch: str, nbytes: float, params: NetParams
) -> CommPattern | None:
    """INA all-reduce at ``switch`` (Eqs. 8-10): every member sends its vector to the switch
    over its cheapest route given the other members' flows (routes may relay over NVLink when
    ``fabric.relay``); the result returns the same way (full duplex). Paper mode: Eqs. 8-10
    as written, T_ina = T_col + T_agg + T_dis, each member's route its cheapest alone;
    pipelined: collection and distribution overlap (``Phase``). None if a member cannot reach
    the switch."""
    options = [fabric.routes_to_switch(m, switch) for m in members]
    if any(not o for o in options):
        return None
    if params.as_written:
        routes = [written_route(fabric, o) for o in options]
    else:
        routes, _ = choose_routes(
            fabric,
            options,
            [nbytes * params.ina_bytes_ratio] * len(members),
            sweeps=1,
            packet_bytes=params.ina_frame_bytes,
        )
    return ina_on_routes(dict(zip(members, routes, strict=True)), switch, params, members)


def collection_time(
    fabric: Fabric, pattern: CommPattern, nbytes: float, params: NetParams
) -> float:
    """T_col of a flat-INA pattern (Eq. 9): the slowest member's way up with ``nbytes`` of
    message. As written, each member's path alone (Eq. 10, no latency); pipelined, the
    members' flows at once on shared links, each with its latencies."""
    wire = nbytes * params.ina_bytes_ratio
    if params.as_written:
        return max((written_time(fabric, p, wire) for p in pattern.paths.values()), default=0.0)
    flows = [(p, wire) for p in pattern.paths.values()]
    return max(flow_times(fabric, flows, params.ina_frame_bytes), default=0.0)
