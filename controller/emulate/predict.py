"""The cost model's prediction for the emulated links (docs/emulation.md, "Calibration").

The emulated network is the cluster graph with every capacity divided by the slowdown and
every hop's latency what the emulation actually has: its kernel adds none (no ``netem``
here), so a hop costs what a frame takes through a veth and, on Ethernet, the software
switch. That latency is measured once per run with ``ping`` (:func:`measure_hop_latency`)
and put on every Ethernet and NVLink hop of the graph the cost model prices.

Both schemes move the same int32 lanes (4 bytes per element), so the prediction prices the
message as it travels: ``dtype_bytes = ina_element_bytes = 4``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import networkx as nx

from controller.costmodel import network as netmodel
from controller.emulate.spec import NetworkSpec
from controller.topology.fabric import Fabric

LANE_BYTES = 4


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
    for _, _, d in h.edges(data=True):
        d["capacity"] /= slowdown
        d["available"] /= slowdown
        kind = "nvlink" if d["link"] in ("nvlink", "pcie") else "ethernet"
        if kind in hop_latency:
            d["latency_s"] = hop_latency[kind]
    return h


def lane_params() -> netmodel.NetParams:
    """NetParams pricing int32 lanes on both schemes (the defaults for everything else)."""
    p = netmodel.NetParams()
    names = {f.name for f in dataclasses.fields(p)}
    return dataclasses.replace(
        p, **{k: LANE_BYTES for k in ("dtype_bytes", "ina_element_bytes") if k in names}
    )


def predict(
    h: nx.Graph, scheme: str, members: list[str], switch: str | None, nbytes: int, rails=()
) -> float | None:
    """Predicted seconds of one all-reduce of ``nbytes`` on the emulated graph ``h``; None
    when the cost model has no pattern for it. INA routes are the members' own NICs, as the
    emulation sends them (no NVLink relay); the ring is the cost model's own."""
    params = lane_params()
    if scheme == "ina":
        fab = Fabric(h, relay=False)
        pat = netmodel.ina_pattern(fab, members, str(switch), nbytes, params)
    elif scheme == "ring":
        fab = Fabric(h, relay=True)
        pat = netmodel.ring_pattern(fab, members, nbytes, params)
    else:
        hier = getattr(netmodel, "hier_pattern", None)
        if hier is None:
            return None
        fab = Fabric(h, relay=False)
        pat = hier(fab, members, nbytes, params)
    return None if pat is None else pat.time(fab, nbytes)
