"""Topology files (YAML or JSON) and their validator. The schema is in docs/topology.md.

Files speak the units people use (Gb/s, GB/s, GB, microseconds); the graph holds bytes,
bytes/s and seconds. Every error names the offending node or link and raises
:class:`controller.errors.InputError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from controller.errors import InputError
from controller.models.gpus import GPU_SPECS
from controller.topology.generators import add_server
from controller.topology.graph import (
    GPU,
    HOST,
    LINK_KINDS,
    NODE_KINDS,
    NVSWITCH,
    ROLES,
    SWITCH,
    TIERS,
    add_gpu,
    add_link,
    add_nvswitch,
    add_switch,
    gpus,
    switches,
)
from controller.units import GB, US, gbps


def load_topology(path: str | Path) -> nx.Graph:
    """Read and validate a topology file (``.yaml``, ``.yml`` or ``.json``)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"topology file {str(p)!r} does not exist")
    try:
        text = p.read_text()
        doc = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"topology file {str(p)!r} is not valid YAML/JSON: {first}") from None
    return topology_from_dict(doc, source=str(p))


def _num(
    d: dict[str, Any], key: str, where: str, *, positive: bool = True, default: float | None = None
) -> float:
    if key not in d:
        if default is None:
            raise InputError(f"{where}: missing {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InputError(f"{where}: {key} must be a number, got {v!r}")
    if positive and v <= 0:
        raise InputError(f"{where}: {key} must be positive, got {v}")
    if v < 0:
        raise InputError(f"{where}: {key} must not be negative, got {v}")
    return float(v)


def _bandwidth(d: dict[str, Any], where: str, keys: tuple[str, str] = ("gbps", "GBps")) -> float:
    """Bandwidth in bytes/s from ``gbps`` (gigabits/s) or ``GBps`` (gigabytes/s)."""
    bits, bytes_ = keys
    if bits in d:
        return gbps(_num(d, bits, where))
    if bytes_ in d:
        return _num(d, bytes_, where) * GB
    raise InputError(f"{where}: missing bandwidth ({bits!r} in Gb/s or {bytes_!r} in GB/s)")


def topology_from_dict(doc: Any, source: str = "<dict>") -> nx.Graph:
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a topology is a mapping with 'nodes'/'servers' and 'links'")
    g = nx.Graph(name=str(doc.get("name", Path(source).stem)))

    def new_id(item: dict[str, Any], where: str) -> str:
        nid = item.get("id")
        if not isinstance(nid, str) or not nid:
            raise InputError(f"{where}: missing 'id'")
        if nid in g:
            raise InputError(f"{where}: duplicate node id {nid!r}")
        return nid

    def role_of(item: dict[str, Any], where: str) -> str:
        role = item.get("role", "any")
        if role not in ROLES:
            raise InputError(f"{where}: role must be one of {ROLES}, got {role!r}")
        return role

    def gpu_type_of(item: dict[str, Any], where: str) -> str:
        t = item.get("gpu_type")
        if t not in GPU_SPECS:
            raise InputError(f"{where}: unknown gpu_type {t!r}; known: {', '.join(GPU_SPECS)}")
        return t

    for i, s in enumerate(doc.get("servers") or []):
        where = f"server #{i}"
        if not isinstance(s, dict):
            raise InputError(f"{where}: must be a mapping")
        sid = new_id(s, where)
        where = f"server {sid!r}"
        n = int(_num(s, "gpus", where))
        add_server(g, sid, gpu_type=gpu_type_of(s, where), n_gpus=n, role=role_of(s, where))
        if "memory_gb" in s:
            for k in range(n):
                g.nodes[f"{sid}-gpu{k}"]["memory_gb"] = _num(s, "memory_gb", where)
    for i, n in enumerate(doc.get("switches") or []):
        where = f"switch #{i}"
        if not isinstance(n, dict):
            raise InputError(f"{where}: must be a mapping")
        nid = new_id(n, where)
        _add_switch(g, nid, n, f"switch {nid!r}")
    for i, n in enumerate(doc.get("nodes") or []):
        where = f"node #{i}"
        if not isinstance(n, dict):
            raise InputError(f"{where}: must be a mapping")
        nid = new_id(n, where)
        where = f"node {nid!r}"
        k = n.get("kind")
        if k not in NODE_KINDS:
            raise InputError(f"{where}: kind must be one of {NODE_KINDS}, got {k!r}")
        if k == GPU:
            t = gpu_type_of(n, where)
            mem = _num(n, "memory_gb", where, default=GPU_SPECS[t].memory_bytes / GB)
            server = n.get("server")
            if not isinstance(server, str) or not server:
                raise InputError(f"{where}: a GPU needs its 'server'")
            add_gpu(
                g,
                nid,
                gpu_type=t,
                memory_gb=mem,
                server=server,
                index=int(n.get("index", 0)),
                role=role_of(n, where),
            )
        elif k == SWITCH:
            _add_switch(g, nid, n, where)
        elif k == NVSWITCH:
            add_nvswitch(g, nid, server=str(n.get("server", nid)))
        else:
            g.add_node(nid, kind=HOST)
    links = doc.get("links")
    if not isinstance(links, list) or not links:
        raise InputError(f"{source}: 'links' must be a non-empty list")
    for i, e in enumerate(links):
        if not isinstance(e, dict):
            raise InputError(f"link #{i}: must be a mapping with 'a', 'b', 'link' and a bandwidth")
        a, b = e.get("a"), e.get("b")
        where = f"link #{i} ({a} - {b})"
        for end in (a, b):
            if end not in g:
                raise InputError(f"{where}: unknown node {end!r}")
        if a == b:
            raise InputError(f"{where}: a link needs two different nodes")
        if g.has_edge(a, b):
            raise InputError(f"{where}: duplicate link")
        lk = e.get("link", "ethernet")
        if lk not in LINK_KINDS:
            raise InputError(f"{where}: link must be one of {LINK_KINDS}, got {lk!r}")
        cap = _bandwidth(e, where)
        used = 0.0
        if "used_gbps" in e:
            used = gbps(_num(e, "used_gbps", where, positive=False))
        if used >= cap:
            raise InputError(f"{where}: used bandwidth must be below the capacity")
        lat = e.get("latency_us")
        add_link(
            g,
            a,
            b,
            link=lk,
            capacity=cap,
            available=cap - used,
            latency_s=None if lat is None else _num(e, "latency_us", where, positive=False) * US,
        )
    validate(g)
    return g


def _add_switch(g: nx.Graph, nid: str, n: dict[str, Any], where: str) -> None:
    tier = n.get("tier", "access")
    if tier not in TIERS:
        raise InputError(f"{where}: tier must be one of {TIERS}, got {tier!r}")
    kw: dict[str, Any] = {"tier": tier, "ina": bool(n.get("ina", True))}
    for key in ("aggregator_slots", "slot_bytes"):
        if key in n:
            kw[key] = int(_num(n, key, where))
    add_switch(g, nid, **kw)


def validate(g: nx.Graph) -> None:
    """Whole-graph checks: GPUs exist, every GPU reaches a switch, positive bandwidths, and
    all GPUs are connected to each other."""
    all_gpus = gpus(g)
    if not all_gpus:
        raise InputError(f"topology {g.name!r} has no GPU")
    for a, b, d in g.edges(data=True):
        if d["capacity"] <= 0 or d["available"] <= 0:
            raise InputError(f"link {a} - {b}: bandwidth must be positive")
    sw = set(switches(g))
    for n in all_gpus:
        if g.degree(n) == 0:
            raise InputError(f"GPU {n!r} is disconnected: it has no link")
    comp = nx.node_connected_component(g, all_gpus[0])
    for n in all_gpus:
        if n not in comp:
            raise InputError(f"GPU {n!r} is disconnected from GPU {all_gpus[0]!r}")
    if len(all_gpus) > 1 and not sw & comp:
        raise InputError("no switch connects the GPUs")


def topology_to_dict(g: nx.Graph) -> dict[str, Any]:
    """The explicit form of the file schema (one entry per node), for exporting built-ins."""
    nodes = []
    for n, d in sorted(g.nodes(data=True)):
        item: dict[str, Any] = {"id": n, **{k: v for k, v in d.items()}}
        nodes.append(item)
    links = []
    for a, b, d in sorted(g.edges(data=True)):
        item = {
            "a": a,
            "b": b,
            "link": d["link"],
            "gbps": d["capacity"] * 8 / 1e9,
            "latency_us": d["latency_s"] / US,
        }
        used = d["capacity"] - d["available"]
        if used > 0:
            item["used_gbps"] = used * 8 / 1e9
        links.append(item)
    return {"name": g.name, "nodes": nodes, "links": links}
