"""Topology files (YAML or JSON): their schema, reader and whole-graph validator. The
schema and its limits are in docs/topology.md.

Files speak the units people use (Gb/s, GB/s, GB, microseconds); the graph holds bytes,
bytes/s and seconds. Reading goes schema first (types, finite numbers within range, unknown
keys and duplicate ids refused, every count bounded before anything is built), then the
graph, then the whole-graph checks. Every error names the offending item by its place in
the file (``links[3].gbps``) or its id and raises :class:`controller.errors.InputError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import networkx as nx

from controller.errors import InputError
from controller.inputs.documents import read_document
from controller.inputs.limits import (
    ID_PATTERN,
    MAX_AGGREGATOR_SLOTS,
    MAX_GPUS,
    MAX_GPUS_PER_SERVER,
    MAX_ID_CHARS,
    MAX_LATENCY_US,
    MAX_LINK_GBPS,
    MAX_LINKS,
    MAX_MEMORY_GB,
    MAX_NODES,
    MAX_SERVERS,
    MAX_SLOT_BYTES,
    MAX_TOPOLOGY_JSON_BYTES,
    MAX_YAML_BYTES,
)
from controller.inputs.schema import (
    Bool,
    Key,
    ListOf,
    Number,
    Record,
    Str,
    Tagged,
    Unique,
    at,
    fail,
    item,
)
from controller.models.gpus import GPU_SPECS
from controller.topology.generators import add_server, server_nodes
from controller.topology.graph import (
    DEFAULT_AGGREGATOR_SLOTS,
    DEFAULT_SLOT_BYTES,
    GPU,
    HOST,
    LINK_KINDS,
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

# -- the schema ------------------------------------------------------------------------------
NODE_ID = Str(pattern=ID_PATTERN, max_len=MAX_ID_CHARS, what=f"an id ({ID_PATTERN})")
GPU_TYPE = Str(choices=tuple(GPU_SPECS))
ROLE = Str(choices=ROLES)
MEMORY_GB = Number(low=0, low_open=True, high=MAX_MEMORY_GB)
GBPS = Number(low=0, low_open=True, high=MAX_LINK_GBPS)
SWITCH_KEYS = {
    "tier": Key(Str(choices=TIERS)),
    "ina": Key(Bool()),
    "aggregator_slots": Key(Number(low=1, high=MAX_AGGREGATOR_SLOTS, integer=True)),
    "slot_bytes": Key(Number(low=1, high=MAX_SLOT_BYTES, integer=True)),
}
SERVER = Record(
    {
        "id": Key(NODE_ID, required=True),
        "gpu_type": Key(GPU_TYPE, required=True),
        "gpus": Key(Number(low=1, high=MAX_GPUS_PER_SERVER, integer=True), required=True),
        "role": Key(ROLE),
        "memory_gb": Key(MEMORY_GB),
    }
)
SWITCH_ITEM = Record({"id": Key(NODE_ID, required=True), **SWITCH_KEYS})
_KIND = {"kind": Key(Str(choices=(GPU, NVSWITCH, SWITCH, HOST)), required=True)}
NODE = Tagged(
    "kind",
    {
        GPU: Record(
            {
                "id": Key(NODE_ID, required=True),
                **_KIND,
                "gpu_type": Key(GPU_TYPE, required=True),
                "server": Key(NODE_ID, required=True),
                "index": Key(Number(low=0, high=MAX_GPUS_PER_SERVER - 1, integer=True)),
                "memory_gb": Key(MEMORY_GB),
                "role": Key(ROLE),
            }
        ),
        NVSWITCH: Record({"id": Key(NODE_ID, required=True), **_KIND, "server": Key(NODE_ID)}),
        SWITCH: Record({"id": Key(NODE_ID, required=True), **_KIND, **SWITCH_KEYS}),
        HOST: Record({"id": Key(NODE_ID, required=True), **_KIND}),
    },
)
LINK = Record(
    {
        "a": Key(NODE_ID, required=True),
        "b": Key(NODE_ID, required=True),
        "link": Key(Str(choices=LINK_KINDS)),
        "gbps": Key(GBPS),
        "GBps": Key(Number(low=0, low_open=True, high=MAX_LINK_GBPS / 8)),
        "used_gbps": Key(Number(low=0, high=MAX_LINK_GBPS)),
        "latency_us": Key(Number(low=0, high=MAX_LATENCY_US)),
    }
)
TOPOLOGY = Record(
    {
        "name": Key(Str(max_len=256)),
        "servers": Key(ListOf(SERVER, MAX_SERVERS)),
        "switches": Key(ListOf(SWITCH_ITEM, MAX_NODES)),
        "nodes": Key(ListOf(NODE, MAX_NODES)),
        "links": Key(ListOf(LINK, MAX_LINKS, min_len=1), required=True),
    },
    what="a mapping with 'links' and 'servers', 'switches' or 'nodes'",
)


def load_topology(path: str | Path) -> nx.Graph:
    """Read and validate a topology file (``.yaml``, ``.yml`` or ``.json``)."""
    p = Path(path)
    doc = read_document(p, "topology", MAX_TOPOLOGY_JSON_BYTES, MAX_YAML_BYTES)
    return topology_from_dict(doc, source=str(p))


def topology_from_dict(doc: Any, source: str = "topology") -> nx.Graph:
    """The cluster graph of a parsed topology document; InputError names what is wrong,
    prefixed with ``source`` (the file)."""
    try:
        d = TOPOLOGY.check(doc)
        _check_ids_and_counts(d)
        g = nx.Graph(name=d.get("name", Path(source).stem))
        _build(g, d)
        validate(g)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return g


def _check_ids_and_counts(d: dict[str, Any]) -> None:
    """Duplicate ids and the totals, before any node is made: ``gpus: 10^7`` on each of
    a thousand servers is refused here, not after allocating them."""
    servers = d.get("servers", [])
    ids = Unique("server id")
    for i, s in enumerate(servers):
        ids.add(s["id"], item("servers", i) + ".id")
    explicit_gpus = sum(1 for n in d.get("nodes", []) if n["kind"] == GPU)
    n_gpus = sum(s["gpus"] for s in servers) + explicit_gpus
    if n_gpus > MAX_GPUS:
        raise InputError(f"{n_gpus} GPUs in all, at most {MAX_GPUS} allowed")
    n_nodes = n_gpus + len(servers) + len(d.get("switches", [])) + len(d.get("nodes", []))
    if n_nodes > MAX_NODES:
        raise InputError(f"{n_nodes} nodes in all, at most {MAX_NODES} allowed")


def _build(g: nx.Graph, d: dict[str, Any]) -> None:
    def fresh(nid: str, where: str) -> None:
        if nid in g:
            raise fail(where, f"duplicate node id {nid!r}")

    slots: dict[tuple[str, int], str] = {}  # (server, GPU index) -> GPU id

    def take_index(server: str, index: int, gid: str, where: str) -> None:
        other = slots.setdefault((server, index), gid)
        if other != gid:
            raise fail(where, f"GPU index {index} of server {server!r} is already {other!r}")

    for i, s in enumerate(d.get("servers", [])):
        where, sid = item("servers", i), s["id"]
        n = s["gpus"]
        for nid in server_nodes(sid, s["gpu_type"], n):
            fresh(nid, at(where, "id"))
        made = add_server(g, sid, gpu_type=s["gpu_type"], n_gpus=n, role=s.get("role", "any"))
        for k, gid in enumerate(made):
            take_index(sid, k, gid, where)
            if "memory_gb" in s:
                g.nodes[gid]["memory_gb"] = s["memory_gb"]
    for i, n in enumerate(d.get("switches", [])):
        fresh(n["id"], at(item("switches", i), "id"))
        _add_switch(g, n)
    for i, n in enumerate(d.get("nodes", [])):
        where, nid, k = item("nodes", i), n["id"], n["kind"]
        fresh(nid, at(where, "id"))
        if k == GPU:
            index = n.get("index", 0)
            take_index(n["server"], index, nid, at(where, "index"))
            add_gpu(
                g,
                nid,
                gpu_type=n["gpu_type"],
                memory_gb=n.get("memory_gb", GPU_SPECS[n["gpu_type"]].memory_bytes / GB),
                server=n["server"],
                index=index,
                role=n.get("role", "any"),
            )
        elif k == SWITCH:
            _add_switch(g, n)
        elif k == NVSWITCH:
            add_nvswitch(g, nid, server=n.get("server", nid))
        else:
            g.add_node(nid, kind=HOST)
    for i, e in enumerate(d["links"]):
        _add_file_link(g, e, item("links", i))


def _add_switch(g: nx.Graph, n: dict[str, Any]) -> None:
    add_switch(
        g,
        n["id"],
        tier=n.get("tier", "access"),
        ina=n.get("ina", True),
        aggregator_slots=n.get("aggregator_slots", DEFAULT_AGGREGATOR_SLOTS),
        slot_bytes=n.get("slot_bytes", DEFAULT_SLOT_BYTES),
    )


def _add_file_link(g: nx.Graph, e: dict[str, Any], where: str) -> None:
    a, b = e["a"], e["b"]
    for end in ("a", "b"):
        if e[end] not in g:
            raise fail(at(where, end), f"unknown node {e[end]!r}")
    if a == b:
        raise fail(where, f"a link needs two different nodes, got {a!r} twice")
    if g.has_edge(a, b):
        raise fail(where, f"duplicate link {a} - {b}")
    if ("gbps" in e) == ("GBps" in e):
        raise fail(where, "give the bandwidth once: 'gbps' (Gb/s) or 'GBps' (GB/s)")
    cap = gbps(e["gbps"]) if "gbps" in e else e["GBps"] * GB
    used = gbps(e.get("used_gbps", 0.0))
    if used >= cap:
        raise fail(at(where, "used_gbps"), f"must be below the capacity ({cap * 8 / 1e9:g} Gb/s)")
    lat = e.get("latency_us")
    add_link(
        g,
        a,
        b,
        link=e.get("link", "ethernet"),
        capacity=cap,
        available=cap - used,
        latency_s=None if lat is None else lat * US,
    )


def validate(g: nx.Graph) -> None:
    """Whole-graph checks: GPUs exist, every GPU reaches a switch, positive bandwidths, and
    all GPUs are connected to each other."""
    all_gpus = gpus(g)
    if not all_gpus:
        raise InputError(f"topology {g.name!r} has no GPU")
    for a, b, d in g.edges(data=True):
        if not (d["capacity"] > 0 and d["available"] > 0):  # NaN fails too
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
        nodes.append({"id": n, **d})
    links = []
    for a, b, d in sorted(g.edges(data=True)):
        entry: dict[str, Any] = {
            "a": a,
            "b": b,
            "link": d["link"],
            "gbps": d["capacity"] * 8 / 1e9,
            "latency_us": d["latency_s"] / US,
        }
        used = d["capacity"] - d["available"]
        if used > 0:
            entry["used_gbps"] = used * 8 / 1e9
        links.append(entry)
    return {"name": g.name, "nodes": nodes, "links": links}
