"""The cost model's prediction for the emulated links (docs/emulation.md, "Calibration").

The emulated network is the cluster graph with every capacity divided by the slowdown and
every hop's latency what the emulation actually has: its kernel adds none (no ``netem``
here), so a hop costs what a frame takes through a veth and, on Ethernet, the software
switch. That latency is measured once per run with ``ping`` (:func:`measure_hop_latency`)
and put on every Ethernet and NVLink hop of the graph the cost model prices.

Both schemes move 4 bytes per element (int32 lanes; in a bfp16 plan, INA's float32 data
and NVLink rings, and 2-byte lanes on the switch's wire), so the prediction prices the
message as it travels (``dtype_bytes = 4``, the plan's INA lanes), and the frames as the
emulated links count them: a token bucket charges a frame's bytes from its Ethernet header
on (no FCS, preamble or gap), 178 per INA packet and 1,514 per full TCP segment. Everything
else is the cost model's default (its cost mode included).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import networkx as nx

from agents.ina.packet import HEADER_LEN, VECTOR_BYTES
from controller.costmodel.hier import hier_pattern
from controller.costmodel.ina import ina_pattern
from controller.costmodel.netparams import InaLanes, NetParams
from controller.costmodel.ring import ring_pattern
from controller.emulate.spec import NetworkSpec

LANE_BYTES = 4
FRAME_HEADER_BYTES = 14 + 20 + 8 + HEADER_LEN  # Ethernet, IPv4, UDP, INA header: what tbf counts
TCP_FRAME_BYTES = 1514  # a full TCP segment's frame at MTU 1500


def measure_hop_latency(net: Any, spec: NetworkSpec, g: nx.Graph) -> dict[str, float]:
    """One-way latency per hop (seconds) by link kind: a quarter of the median of 10 ping
    round trips between two hosts (over a switch the path has 4 hops, 2 each way; over a
    server's NVLink bridge 4 as well). Both kinds are pinged at once."""
    by_switch: dict[str, list[str]] = {}
    by_fabric: dict[str, list[str]] = {}
    for n, h in spec.hosts.items():
        if h.switch:
            by_switch.setdefault(h.switch, []).append(n)
        if h.fabric:
            by_fabric.setdefault(h.fabric, []).append(n)
    pings = {}
    for kind, groups, ip_of in (
        ("ethernet", by_switch, lambda h: h.nic_ip),
        ("nvlink", by_fabric, lambda h: h.nvlink_ip),
    ):
        pair = next((sorted(v)[:2] for v in groups.values() if len(v) >= 2), None)
        if pair is not None:
            a, b = pair
            argv = ["ping", "-c", "10", "-i", "0.05", "-W", "2", ip_of(spec.hosts[b])]
            pings[kind] = net.popen(a, argv, stdout=-1, stderr=-1, text=True)
    out: dict[str, float] = {}
    for kind, p in pings.items():
        text, _ = p.communicate(timeout=60)
        rtts = sorted(float(x) for x in re.findall(r"time=([\d.]+) ms", text))
        if rtts:
            out[kind] = rtts[len(rtts) // 2] * 1e-3 / 4
    return out


def emulated_graph(g: nx.Graph, slowdown: float, hop_latency: dict[str, float]) -> nx.Graph:
    """``g`` with capacities divided by ``slowdown`` and the measured per-hop latencies."""
    h = g.copy()
    for a, b, d in h.edges(data=True):
        d["capacity"] /= slowdown
        d["available"] /= slowdown
        kind = "nvlink" if d["link"] in ("nvlink", "pcie") else "ethernet"
        if kind in hop_latency:
            # a mesh board's direct GPU-GPU link runs as two hops through the server's bridge
            # (spec._mesh_ports)
            direct = h.nodes[a]["kind"] == h.nodes[b]["kind"] == "gpu"
            d["latency_s"] = hop_latency[kind] * (2 if direct and kind == "nvlink" else 1)
    return h


def lane_params(lanes: InaLanes = "int32") -> NetParams:
    """The cost model's NetParams for the emulated wire (module docstring), INA in
    ``lanes``: an element is ``LANE_BYTES`` of message whatever the format (bfp16 carries
    it in half the wire's bytes, with its proposal round)."""
    return dataclasses.replace(
        NetParams(),
        dtype_bytes=LANE_BYTES,
        ina_lanes=lanes,
        ina_overhead_bytes=FRAME_HEADER_BYTES,
        packet_bytes=TCP_FRAME_BYTES,
    )


def predict(
    h: nx.Graph,
    scheme: str,
    members: list[str],
    switch: str | None,
    nbytes: int,
    rails=(),
    lanes: InaLanes = "int32",
) -> float | None:
    """Predicted seconds of one all-reduce of ``nbytes`` on the emulated graph ``h``; None
    when the cost model has no pattern for it. INA routes are the members' own NICs, as the
    emulation sends them (no NVLink relay); the ring is the cost model's own (int32); INA,
    flat and hierarchical (its rails, with their proposal round), in ``lanes``."""
    params = lane_params("int32" if scheme == "ring" else lanes)
    if scheme == "ina":
        fab = params.fabric(h, relay=False)
        pat = ina_pattern(fab, members, str(switch), nbytes, params)
    elif scheme == "ring":
        fab = params.fabric(h, relay=True)
        pat = ring_pattern(fab, members, nbytes, params)
    else:
        fab = params.fabric(h, relay=False)
        pat = hier_pattern(fab, members, nbytes, params)
    return None if pat is None else pat.time(fab, nbytes)


RATIO_EXPLAINED = 2.0  # measured and predicted INA/ring further apart than this get a why
SWITCH_NAMES = {
    "model": "the executable P4 model, a Python interpreter",
    "bmv2": "BMv2, a software interpreter of the P4 program",
}


def switch_contributions(group: Any, scheme: str, nbytes: int) -> dict[str, int]:
    """INA packets each switch takes in for one all-reduce of ``nbytes``: every member sends
    one packet per 128-byte vector of what it aggregates (the whole message flat, its shard
    on a hierarchical rail)."""
    per: dict[str, int] = {}
    if scheme == "ina":
        per[str(group.switch)] = len(group.gpus) * -(-nbytes // VECTOR_BYTES)
    elif scheme == "hier":
        for rail in group.rails:
            vectors = -(-nbytes // (rail.shards * VECTOR_BYTES))
            per[rail.switch] = per.get(rail.switch, 0) + len(rail.members) * vectors
    return per


def ratio_note(
    group: Any,
    scheme: str,
    nbytes: int,
    measured: tuple[float, float],
    predicted: tuple[float, float],
    g: nx.Graph,
    slowdown: float,
    switch_kind: str,
) -> str | None:
    """One line saying why the measured INA/ring (``measured``: INA and ring seconds) is more
    than ``RATIO_EXPLAINED`` times off the predicted one, else None. The switch's packet rate
    is what it took in over the measured INA time (a lower bound for hierarchical INA, whose
    time includes the NVLink steps); the links' is what the emulated Ethernet links of the
    members on that switch (``g``'s capacities over ``slowdown``) carry in INA frames."""
    rm, rp = measured[0] / measured[1], predicted[0] / predicted[1]
    off = max(rm / rp, rp / rm)
    if off <= RATIO_EXPLAINED:
        return None
    head = f"INA/ring measured {rm:.2f} against {rp:.2f} predicted ({off:.1f}x apart): "
    per = switch_contributions(group, scheme, nbytes)
    if not per or measured[0] <= 0:
        return head + "see docs/emulation.md, Calibration"
    sw, packets = max(per.items(), key=lambda kv: kv[1])
    took = packets / measured[0]
    members = list(group.gpus)
    if scheme == "hier":
        members = [m for r in group.rails if r.switch == sw for m in r.members]
    link_bytes = sum(g.edges[m, sw]["capacity"] for m in members) / slowdown
    carry = link_bytes / (FRAME_HEADER_BYTES + VECTOR_BYTES)
    if took < carry / RATIO_EXPLAINED:
        what = SWITCH_NAMES.get(switch_kind, "software")
        return head + (
            f"the switch here is {what}, not a line-rate ASIC: {sw} took in {took:,.0f} INA "
            f"packets/s where its {len(members)} member links carry {carry:,.0f} frames/s, and the "
            "prediction assumes the links bind (docs/emulation.md, Calibration; a larger "
            "--slowdown lets the links bind)"
        )
    return head + (
        f"not the switch ({sw} took in {took:,.0f} INA packets/s, its member links carry "
        f"{carry:,.0f} frames/s): see docs/emulation.md, Calibration (TCP queueing in the ring)"
    )
