"""Flat in-network aggregation (paper Eqs. 7-10, docs/costmodel.md "Flat INA"): every member
streams its vector up its route to one switch, the switch adds and streams the sum back down.

Holds ``T_AGG_S`` (the switch's aggregation time, Eq. 8), :func:`ina_pattern` (routes chosen
for the members) and :func:`ina_on_routes` (routes given, as a plan or the simulator has
them). Hierarchical INA builds on these in ``hier.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.costmodel.netparams import NetParams
from controller.costmodel.network import CommPattern, Phase, choose_routes
from controller.topology.fabric import Fabric, Path

T_AGG_S = 1e-6  # aggregation inside the switch, Eq. 8 (paper: about 1 us, its refs [42, 43])


def ina_on_routes(
    routes: Mapping[str, Path], switch: str, params: NetParams, members: Sequence[str] = ()
) -> CommPattern:
    """Flat INA over given routes (member -> its route up to ``switch``): every member streams
    its vector, as ``params``' lanes on the wire, up its route, and the switch streams the sum
    back down it (Eqs. 8-10; overlapped when pipelined)."""
    order = list(members) or list(routes)
    flows = [(list(routes[m]), params.ina_wire_ratio) for m in order]
    phase = Phase(
        flows,
        1.0,
        0.0,
        T_AGG_S + params.ina_host_s,
        duplex=True,
        packet_bytes=params.ina_frame_bytes,
    )
    return CommPattern("ina", [phase], switch, {m: list(routes[m]) for m in order})


def ina_pattern(
    fabric: Fabric, members: Sequence[str], switch: str, nbytes: float, params: NetParams
) -> CommPattern | None:
    """INA all-reduce at ``switch`` (Eqs. 8-10): every member sends its vector to the switch
    over its cheapest route given the other members' flows (routes may relay over NVLink when
    ``fabric.relay``); the result returns the same way (full duplex). Paper mode: T_ina = T_col
    + T_agg + T_dis (+ one host synchronisation); pipelined: collection and distribution
    overlap (``Phase``). None if a member cannot reach the switch."""
    wire = params.ina_wire_ratio
    options = [fabric.routes_to_switch(m, switch) for m in members]
    if any(not o for o in options):
        return None
    routes, _ = choose_routes(
        fabric,
        options,
        [nbytes * wire] * len(members),
        sweeps=1,
        packet_bytes=params.ina_frame_bytes,
    )
    return ina_on_routes(dict(zip(members, routes, strict=True)), switch, params, members)
