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

Every number and list from the wire is bounded here too (:data:`LIMITS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import networkx as nx


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
        links = frozenset("|".join(sorted((str(a), str(b)))) for a, b in g.edges)
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
