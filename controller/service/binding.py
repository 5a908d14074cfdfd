"""What an agent identity may register, report and receive.

An identity is the node name its certificate vouches for (``servicer.peer_names``); what it
may speak for comes from the cluster graph the plan is served on, never from what it claims:

* a switch agent is a switch node of the cluster; it reports only links it is an end of;
* a GPU agent is a server (every GPU whose ``server`` attribute names it) or a single GPU
  node; it registers only those GPUs, reports only links one of them is an end of and
  selections only for the groups the plan puts them in, and receives only their tables.

Claims outside that are PERMISSION_DENIED (:class:`Denied`), counted in
``heroserve_denied_requests_total``. Without a cluster (no plan and no ``--topology`` yet)
nothing can be checked at registration; the plan's cluster then filters what is sent.

Every number and list from the wire is bounded here too (:data:`LIMITS`), and every name
checked before anything stores or indexes it; a malformed request is
:class:`~controller.errors.InputError` (INVALID_ARGUMENT).

Holds :data:`LIMITS`, :class:`ClusterIndex` (the cluster's names, for the identity checks) and
the checks of each request an agent sends: :func:`check_identity` and :func:`check_session_id`
(every request), :func:`check_registration` and :func:`check_held` (Register),
:func:`check_telemetry` and :func:`check_selections` (ReportTelemetry). They change nothing:
the controller (:class:`controller.service.core.Controller`) applies a request only once they
all passed, so a request is applied whole or refused whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.proto.heroserve.v1 import control_pb2 as pb
from controller.errors import InputError
from controller.service.slots import MAX_SLOTS
from controller.service.storecheck import MAX_SEQ
from controller.topology.graph import link_id

if TYPE_CHECKING:
    import networkx as nx

KIND_NAMES = {pb.NODE_KIND_SWITCH: "switch", pb.NODE_KIND_GPU: "gpu"}
KIND_OF_NAME = {v: k for k, v in KIND_NAMES.items()}
_MAC = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$")


class Denied(PermissionError):
    """An identity claiming what the plan does not give it (PERMISSION_DENIED)."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may carry; each has its reason."""

    name_chars: int = 128  # node, GPU, group and link names: a DNS label is 63, a path 2 of them
    agent_version_chars: int = 128
    error_chars: int = 1000  # an agent's error text, logged
    # A GPU agent speaks for one server: NVL72 racks expose 72 GPUs, so 256 leaves room.
    gpus_per_agent: int = 256
    # v1model's and TNA's port ids are 9 bits (p4/heroserve_ina.p4 NUM_PORTS).
    ports: int = 512
    slot_bytes: int = 1 << 16  # one slot's payload fits one packet, at most a 64 KiB IP packet
    # Telemetry: a switch has at most `ports` links; a GPU agent reports its GPUs' links and
    # groups. 4096 records of each kind cover both with room; more is a flood.
    telemetry_records: int = 4096
    held_tables: int = 4096  # policy tables one GPU agent holds (its GPUs' groups)
    window_s: float = 3600.0  # a telemetry window longer than an hour is not a measurement
    agents: int = 1 << 16  # registry rows: the 8tracks cluster has 9,600 GPUs + 880 switches


LIMITS = Limits()


@dataclass
class ClusterIndex:
    """The cluster graph's names, indexed for the binding checks."""

    name: str
    switches: frozenset[str]
    gpu_server: dict[str, str]  # GPU node -> its server ("" when the graph names none)
    server_gpus: dict[str, frozenset[str]] = field(default_factory=dict)
    links: frozenset[str] = frozenset()  # "<a>|<b>", sorted ends

    @classmethod
    def of(cls, g: nx.Graph) -> ClusterIndex:
        gpu_server: dict[str, str] = {}
        switches: set[str] = set()
        for n, d in g.nodes(data=True):
            if d.get("kind") == "switch":
                switches.add(str(n))
            elif d.get("kind") == "gpu":
                gpu_server[str(n)] = str(d.get("server") or "")
        by_server: dict[str, set[str]] = {}
        for gpu, srv in gpu_server.items():
            if srv:
                by_server.setdefault(srv, set()).add(gpu)
        links = frozenset(link_id(str(a), str(b)) for a, b in g.edges)
        return cls(
            str(g.name),
            frozenset(switches),
            gpu_server,
            {s: frozenset(v) for s, v in by_server.items()},
            links,
        )

    def owned_gpus(self, node_id: str) -> frozenset[str]:
        """GPUs a GPU agent named ``node_id`` speaks for: its server's, or itself."""
        if node_id in self.server_gpus:
            return self.server_gpus[node_id]
        if node_id in self.gpu_server:
            return frozenset((node_id,))
        return frozenset()

    def check_agent(self, is_switch: bool, node_id: str) -> None:
        """Raise :class:`Denied` unless ``node_id`` is an agent this cluster has."""
        if is_switch:
            if node_id not in self.switches:
                raise Denied(f"node {node_id!r} is not a switch of topology {self.name!r}")
        elif not self.owned_gpus(node_id):
            raise Denied(
                f"node {node_id!r} is neither a server nor a GPU of topology {self.name!r}"
            )

    def has_agent(self, is_switch: bool, node_id: str) -> bool:
        """Whether ``node_id`` is an agent this cluster has (:meth:`check_agent` passes)."""
        try:
            self.check_agent(is_switch, node_id)
        except Denied:
            return False
        return True

    def check_gpus(self, node_id: str, gpus: Iterable[str]) -> None:
        """Raise :class:`Denied` for the first GPU ``node_id`` may not speak for."""
        mine = self.owned_gpus(node_id)
        for gpu in gpus:
            if gpu in mine:
                continue
            owner = self.gpu_server.get(gpu)
            if owner is None:
                raise Denied(f"GPU {gpu!r} is not in topology {self.name!r}")
            raise Denied(f"GPU {gpu!r} belongs to {owner or gpu!r}, not to {node_id!r}")

    def link_ends_owned(self, is_switch: bool, node_id: str, link: str) -> bool:
        """Whether ``link`` ends at switch ``node_id``, or at one of GPU agent ``node_id``'s
        GPUs."""
        ends = link.split("|")
        if is_switch:
            return node_id in ends
        mine = self.owned_gpus(node_id)
        return any(e in mine for e in ends)

    def agent_gpus(self, node_id: str, claimed: Iterable[str]) -> frozenset[str]:
        """The GPUs whose tables agent ``node_id`` receives: those it registered that are its
        own, or all its own when it registered none."""
        mine = self.owned_gpus(node_id)
        claimed = frozenset(claimed)
        return mine & claimed if claimed else mine


# --- the requests ---------------------------------------------------------------------------

Dropped = Callable[[str], None]  # counts an item left out, by reason (a metrics label)


def bounded_text(value: str, limit: int, what: str) -> str:
    """``value``, or InputError when it holds more than ``limit`` characters."""
    if len(value) > limit:
        raise InputError(f"{what} is {len(value)} characters, limit {limit}")
    return value


def check_identity(identity: pb.NodeIdentity) -> pb.NodeIdentity:
    """``identity`` when it names a node (usable in link ids) of a kind the controller knows."""
    node = identity.node_id
    if not node:
        raise InputError("identity.node_id is empty")
    if len(node) > LIMITS.name_chars or not node.isprintable() or any(c.isspace() for c in node):
        raise InputError(f"identity.node_id {node[:40]!r} is not a node name")
    if "|" in node:
        raise InputError(f"identity.node_id {node[:40]!r} holds '|' (the link id separator)")
    if identity.kind not in KIND_NAMES:
        raise InputError(f"identity.kind {identity.kind} is not switch or gpu")
    return identity


def check_session_id(session_id: str) -> None:
    """A session id as the controller hands them out at registration: present and short."""
    if not session_id:
        raise InputError("session_id is empty")
    bounded_text(session_id, 64, "session_id")


def check_node_name(value: str, what: str, allow_empty: bool = False) -> None:
    """InputError unless ``value`` can name a node (``|`` joins link ends)."""
    if not value and allow_empty:
        return
    if not value or len(value) > LIMITS.name_chars or not value.isprintable() or "|" in value:
        raise InputError(f"{what} {value[:40]!r} is not a node name")


def check_registration(
    req: pb.RegisterRequest, index: ClusterIndex | None
) -> tuple[pb.NodeIdentity, pb.SwitchInventory | pb.GpuInventory]:
    """The identity and inventory of a registration, bounded and, when the controller has a
    cluster (``index``), checked against what it gives the identity (:class:`Denied`). The
    held tables are :func:`check_held`'s: they need the plan."""
    ident = check_identity(req.identity)
    is_switch = ident.kind == pb.NODE_KIND_SWITCH
    inv: pb.SwitchInventory | pb.GpuInventory
    if is_switch:
        inv = _check_switch_inventory(req)
    else:
        inv = _check_gpu_inventory(req)
    bounded_text(req.agent_version, LIMITS.agent_version_chars, "agent_version")
    if len(req.held_tables) > LIMITS.held_tables:
        raise InputError(f"held_tables lists {len(req.held_tables)}, limit {LIMITS.held_tables}")
    if index is not None:
        index.check_agent(is_switch, ident.node_id)
        if not is_switch:
            index.check_gpus(ident.node_id, (g.gpu_id for g in req.gpu.gpus))
            for g in req.gpu.gpus:
                if g.server and g.server != index.gpu_server.get(g.gpu_id, g.server):
                    raise InputError(
                        f"GPU {g.gpu_id}: server {g.server!r} differs from topology's "
                        f"{index.gpu_server[g.gpu_id]!r}"
                    )
    bounded_text(req.generation, 64, "generation")
    return ident, inv


def _check_switch_inventory(req: pb.RegisterRequest) -> pb.SwitchInventory:
    if req.WhichOneof("inventory") != "switch_inventory":
        raise InputError("a switch must register with switch_inventory")
    inv = req.switch_inventory
    if len(inv.ports) > LIMITS.ports:
        raise InputError(f"switch_inventory lists {len(inv.ports)} ports, limit {LIMITS.ports}")
    ports = [p.port for p in inv.ports]
    if len(ports) != len(set(ports)):
        raise InputError("switch_inventory lists a port twice")
    for p in inv.ports:
        if p.port >= LIMITS.ports:
            raise InputError(f"switch_inventory: port {p.port} is not below {LIMITS.ports}")
        if not math.isfinite(p.capacity) or p.capacity < 0:
            raise InputError("switch_inventory: port capacity must be finite and >= 0")
        check_node_name(p.peer, f"port {p.port} peer", allow_empty=True)
        bounded_text(p.name, LIMITS.name_chars, f"port {p.port} name")
        if p.peer_mac and not _MAC.match(p.peer_mac):
            raise InputError(f"port {p.port}: peer_mac {p.peer_mac[:40]!r} is not a MAC")
        if p.peer_ipv4 and not _IPV4.match(p.peer_ipv4):
            raise InputError(f"port {p.port}: peer_ipv4 {p.peer_ipv4[:40]!r} is not IPv4")
    if inv.aggregator_slots > MAX_SLOTS:
        raise InputError(
            f"switch_inventory: aggregator_slots {inv.aggregator_slots} above {MAX_SLOTS} "
            "(the slot index is 16 bits)"
        )
    if inv.slot_bytes > LIMITS.slot_bytes:
        raise InputError(f"switch_inventory: slot_bytes {inv.slot_bytes} above {LIMITS.slot_bytes}")
    bounded_text(inv.p4_program, LIMITS.name_chars, "p4_program")
    return inv


def _check_gpu_inventory(req: pb.RegisterRequest) -> pb.GpuInventory:
    if req.WhichOneof("inventory") != "gpu":
        raise InputError("a GPU agent must register with gpu inventory")
    inv = req.gpu
    if len(inv.gpus) > LIMITS.gpus_per_agent:
        raise InputError(f"gpu inventory lists {len(inv.gpus)} GPUs, limit {LIMITS.gpus_per_agent}")
    ids = [g.gpu_id for g in inv.gpus]
    if any(not i for i in ids) or len(ids) != len(set(ids)):
        raise InputError("gpu inventory: every GPU needs a distinct gpu_id")
    for g in inv.gpus:
        check_node_name(g.gpu_id, "gpu_id")
        check_node_name(g.server, f"GPU {g.gpu_id} server", allow_empty=True)
        bounded_text(g.gpu_type, LIMITS.name_chars, f"GPU {g.gpu_id} gpu_type")
        if g.local_index >= LIMITS.gpus_per_agent:
            raise InputError(f"GPU {g.gpu_id}: local_index {g.local_index} out of range")
        if g.mac and not _MAC.match(g.mac):
            raise InputError(f"GPU {g.gpu_id}: mac {g.mac[:40]!r} is not a MAC")
        if g.ipv4 and not _IPV4.match(g.ipv4):
            raise InputError(f"GPU {g.gpu_id}: ipv4 {g.ipv4[:40]!r} is not IPv4")
    return inv


def check_held(
    held: Iterable[pb.HeldTable], mine: Collection[str], dropped: Dropped
) -> list[tuple[str, int, int]]:
    """(group, version, last_seq) of the held tables worth acting on: those of ``mine``, the
    agent's own groups in the current plan. The others are ignored, counted: a plan change
    may have moved the agent's GPUs while it was away, and a table it holds for another
    group never touches that group."""
    out = []
    for h in held:
        bounded_text(h.group_id, LIMITS.name_chars, "held_tables.group_id")
        if h.version > MAX_SEQ or h.last_seq > MAX_SEQ:
            raise InputError(f"held table {h.group_id}: version or last_seq above {MAX_SEQ}")
        if h.group_id not in mine:
            dropped("held_table_not_own")
            continue
        out.append((h.group_id, h.version, h.last_seq))
    return out


def check_link_report(lk: pb.LinkUtilisation) -> str:
    """The canonical id of a well-formed link report, else InputError."""
    ends = lk.link_id.split("|")
    if len(ends) != 2 or not all(ends) or len(lk.link_id) > 2 * LIMITS.name_chars + 1:
        raise InputError(f"link id {lk.link_id[:80]!r} is not '<nodeA>|<nodeB>'")
    if not (0.0 <= lk.utilisation <= 1.0):
        raise InputError(f"link {lk.link_id}: utilisation {lk.utilisation} not in [0,1]")
    if not math.isfinite(lk.bytes_per_s) or lk.bytes_per_s < 0:
        raise InputError(f"link {lk.link_id}: bytes_per_s {lk.bytes_per_s} not finite >= 0")
    return link_id(*ends)


def check_telemetry(
    req: pb.TelemetryReport, ident: pb.NodeIdentity, index: ClusterIndex | None, dropped: Dropped
) -> list[tuple[str, float]]:
    """(link id, utilisation) of a report's links, each a link of the cluster (``index``)
    that ends at the sender or its GPUs; its window, record counts, ports and counter names
    bounded. Without a cluster the links are dropped, counted: nothing to check them against,
    and nothing uses them before a plan. Selections are :func:`check_selections`'."""
    is_switch = ident.kind == pb.NODE_KIND_SWITCH
    if not math.isfinite(req.window_s) or not 0 <= req.window_s <= LIMITS.window_s:
        raise InputError(f"window_s {req.window_s} must be in [0, {LIMITS.window_s}]")
    for what, items in (
        ("links", req.links),
        ("ports", req.ports),
        ("counters", req.counters),
        ("selections", req.selections),
    ):
        if len(items) > LIMITS.telemetry_records:
            raise InputError(f"{what}: {len(items)} records, limit {LIMITS.telemetry_records}")
    links: list[tuple[str, float]] = []
    for lk in req.links:
        lid = check_link_report(lk)
        if index is None:
            dropped("no_cluster")
            continue
        if lid not in index.links:
            # an agent's view of its board may name a link the topology does not have (the
            # GPU agent's NVSwitch link on a mesh board): that sample is left out, counted,
            # and the rest of the report stands (one such link used to refuse them all)
            dropped("unknown_link")
            continue
        if not index.link_ends_owned(is_switch, ident.node_id, lid):
            raise Denied(f"link {lid} does not end at {ident.node_id!r} or its GPUs")
        links.append((lid, lk.utilisation))
    for p in req.ports:
        if p.port >= LIMITS.ports:
            raise InputError(f"port {p.port} is not below {LIMITS.ports}")
    for c in req.counters:
        bounded_text(c.name, LIMITS.name_chars, "counter name")
    return links


def check_selections(
    node_id: str,
    selections: Iterable[pb.PolicySelection],
    policy_ids: Mapping[str, frozenset[int]],
    mine: Collection[str],
    dropped: Dropped,
) -> list[pb.PolicySelection]:
    """Selections for the sender's own groups (``mine``) with the table's policy ids
    (``policy_ids``: the current plan's tables) and bounded counters. A group the current
    plan does not have is dropped (a report racing a plan change), counted; another agent's
    group is :class:`Denied`."""
    out = []
    for s in selections:
        bounded_text(s.group_id, LIMITS.name_chars, "selection group_id")
        if s.group_id not in policy_ids:
            dropped("unknown_group")
            continue
        if s.group_id not in mine:
            raise Denied(f"group {s.group_id} has none of {node_id!r}'s GPUs")
        if s.last_seq > MAX_SEQ or s.version > MAX_SEQ:
            raise InputError(
                f"group {s.group_id}: last_seq {s.last_seq} / version {s.version} above {MAX_SEQ}"
            )
        if s.policy_id not in policy_ids[s.group_id]:
            raise InputError(f"group {s.group_id} has no policy {s.policy_id}")
        out.append(s)
    return out
