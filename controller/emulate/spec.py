"""The emulated network of a cluster graph, as plain data (docs/emulation.md).

:func:`network_spec` turns any topology the controller accepts into what Mininet builds:

* one host per GPU (and per ``host`` node), with one NIC ``eth0`` on its switch and, when its
  server has an NVLink (or PCIe) fabric, an interface ``nvl0`` on that server's bridge;
* one P4 switch per switch node, ports numbered 1.. in the order of its neighbours' names;
* one Linux bridge per server fabric (NVLink emulated as a fast shaped link to the bridge); a
  mesh board's GPUs (joined pair by pair) share one bridge too, each GPU's port carrying the
  total of its NVLink links (``_mesh_ports``);
* every link's rate shaped to the topology's bandwidth divided by one factor ``slowdown``; a
  link still faster than ``MAX_SHAPED_BPS`` after that is left unshaped and said so. No
  latency is added: the kernels this runs on have no ``sch_netem``, and a hop through a veth
  and a software switch already takes far longer than a real one (the run measures it).

Names carry a per-run tag so that interfaces in the root namespace never collide with
another run's (Linux allows 15 characters: ``<tag><s|n><i>-eth<port>``). Addresses are
fixed per node (hosts live in their own namespaces): NICs ``10.0.0.0/16``, NVLink
``10.1.0.0/16``, switches answer INA from ``10.0.255.<i>``. MACs are locally administered.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

import networkx as nx

from controller.errors import InputError
from controller.topology.graph import GPU, HOST, NVSWITCH, SWITCH

NIC_NET = ipaddress.IPv4Network("10.0.0.0/16")
NVLINK_NET = ipaddress.IPv4Network("10.1.0.0/16")
SWITCH_IP_BASE = ipaddress.IPv4Address("10.0.255.0")
MAX_HOSTS = 256  # one Mininet host is a shell and a worker process: more do not fit one machine
MAX_SHAPED_BPS = 2e9  # above this, netem on a veth cannot keep the rate: left unshaped
IFNAME_MAX = 15
NIC_IF, NVLINK_IF = "eth0", "nvl0"


def _mac(kind: int, i: int) -> str:
    return f"02:48:53:{kind:02x}:{(i >> 8) & 0xFF:02x}:{i & 0xFF:02x}"


def _host_ip(net: ipaddress.IPv4Network, i: int) -> str:
    return str(net.network_address + (i // 250) * 256 + i % 250 + 1)


def new_tag() -> str:
    """A short random run tag: ``h`` + 3 base-36 characters."""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "h" + "".join(secrets.choice(alphabet) for _ in range(3))


@dataclass(frozen=True)
class Shape:
    """Emulated link parameters: rate in bits/s (0 = unshaped)."""

    rate_bps: float


@dataclass
class HostSpec:
    node: str  # graph node (GPU id)
    name: str  # Mininet name
    server: str | None
    nic_mac: str = ""
    nic_ip: str = ""
    switch: str | None = None  # the switch its NIC plugs into
    nvlink_mac: str = ""
    nvlink_ip: str = ""
    fabric: str | None = None  # nvswitch node (bridge) of its server


@dataclass
class PortSpec:
    port: int
    peer: str  # graph node at the other end
    intf: str  # switch-side interface name
    capacity: float  # bytes/s (real)
    peer_mac: str = ""
    peer_ip: str = ""


@dataclass
class SwitchSpec:
    node: str
    name: str
    device_id: int
    ina_mac: str
    ina_ip: str
    ports: dict[int, PortSpec] = field(default_factory=dict)

    def agent_ports(self) -> list[str]:
        """The switch agent's ``--port`` arguments (agents/switch/main.py)."""
        out = []
        for p in sorted(self.ports.values(), key=lambda q: q.port):
            s = f"{p.port}={p.peer}"
            if p.peer_mac:
                s += f",mac={p.peer_mac}"
            if p.peer_ip:
                s += f",ip={p.peer_ip}"
            out.append(s + f",gbps={p.capacity * 8 / 1e9:g}")
        return out


@dataclass
class BridgeSpec:
    node: str  # nvswitch node
    name: str


@dataclass
class LinkSpec:
    """A link between two graph nodes: ``a`` is the root-namespace end (switch or bridge)
    when there is one, so Mininet creates the pair there."""

    a: str
    b: str
    kind: str  # nvlink | pcie | ethernet
    a_intf: str
    b_intf: str
    capacity: float  # bytes/s, real
    latency_s: float  # real
    shape: Shape
    a_port: int | None = None
    b_port: int | None = None


@dataclass
class NetworkSpec:
    tag: str
    slowdown: float
    hosts: dict[str, HostSpec]
    switches: dict[str, SwitchSpec]
    bridges: dict[str, BridgeSpec]
    links: list[LinkSpec]
    unshaped: list[str] = field(default_factory=list)  # links too fast to shape, for the log

    def host_by_ip(self) -> dict[str, HostSpec]:
        return {h.nic_ip: h for h in self.hosts.values() if h.nic_ip}


def shape(capacity: float, slowdown: float) -> Shape:
    """A link of ``capacity`` bytes/s slowed down ``slowdown`` times."""
    rate = capacity * 8 / slowdown
    return Shape(0.0 if rate > MAX_SHAPED_BPS else rate)


def _check_names(tag: str, switches: int, bridges: int, max_port: int) -> None:
    longest = len(tag) + 1 + len(str(max(switches, bridges, 1))) + len(f"-eth{max_port}")
    if longest > IFNAME_MAX:
        raise InputError(
            f"topology too large to emulate: interface names would need {longest} characters "
            f"(Linux allows {IFNAME_MAX})"
        )


def network_spec(g: nx.Graph, slowdown: float, tag: str | None = None) -> NetworkSpec:
    """The emulated network of cluster ``g``. Raises InputError for what cannot be emulated
    (a GPU with several NICs, a link between kinds that have no emulation, too many nodes)."""
    if not slowdown >= 1.0:
        raise InputError(f"slowdown must be >= 1 (the emulation cannot run faster), got {slowdown}")
    tag = tag or new_tag()
    kind = {n: d["kind"] for n, d in g.nodes(data=True)}
    hosts_nodes = sorted(n for n, k in kind.items() if k in (GPU, HOST))
    switch_nodes = sorted(n for n, k in kind.items() if k == SWITCH)
    meshes = _mesh_ports(g)
    fabric_nodes = sorted({n for n, k in kind.items() if k == NVSWITCH} | set(meshes.values()))
    if len(hosts_nodes) > MAX_HOSTS:
        raise InputError(
            f"topology {g.name}: {len(hosts_nodes)} GPUs and hosts; one machine emulates at most "
            f"{MAX_HOSTS} (give a smaller topology file)"
        )
    degree = [g.degree(s) for s in switch_nodes + fabric_nodes if s in g]
    degree += [list(meshes.values()).count(b) for b in set(meshes.values())]
    max_port = max(degree, default=1)
    _check_names(tag, len(switch_nodes), len(fabric_nodes), max_port)

    hosts: dict[str, HostSpec] = {}
    for i, n in enumerate(hosts_nodes):
        hosts[n] = HostSpec(n, f"{tag}g{i}", g.nodes[n].get("server"))
    switches = {
        s: SwitchSpec(
            s,
            f"{tag}s{i + 1}",
            i + 1,
            _mac(0xFF, i + 1),
            str(SWITCH_IP_BASE + i + 1),
        )
        for i, s in enumerate(switch_nodes)
    }
    bridges = {f: BridgeSpec(f, f"{tag}n{i + 1}") for i, f in enumerate(fabric_nodes)}
    if len(switches) > 250:
        raise InputError(f"{len(switches)} switches: the emulation addresses at most 250")

    # Host interfaces: the NIC (one Ethernet link to a switch) and the server fabric.
    gpu_fabric: dict[str, str] = {}
    for i, n in enumerate(hosts_nodes):
        h = hosts[n]
        nics = [v for v in g.neighbors(n) if kind[v] == SWITCH]
        if len(nics) > 1:
            raise InputError(
                f"{n} has {len(nics)} links to switches; the emulation gives each GPU one NIC"
            )
        if nics:
            h.switch, h.nic_mac, h.nic_ip = nics[0], _mac(0x00, i), _host_ip(NIC_NET, i)
        fabrics = [v for v in g.neighbors(n) if kind[v] == NVSWITCH]
        peers = [v for v in g.neighbors(n) if kind[v] in (GPU, HOST)]
        if n in meshes:
            fabrics.append(meshes[n])
        elif peers:
            raise InputError(
                f"link {n}-{peers[0]}: direct GPU-to-GPU links are not emulated; "
                "join a server's GPUs through an nvswitch node (docs/topology.md)"
            )
        if len(fabrics) > 1:
            raise InputError(f"{n} is on {len(fabrics)} NVLink fabrics; the emulation allows one")
        if fabrics:
            h.fabric, h.nvlink_mac, h.nvlink_ip = fabrics[0], _mac(0x01, i), _host_ip(NVLINK_NET, i)
            gpu_fabric[n] = fabrics[0]

    # Switch ports: neighbours in name order.
    for s, sw in switches.items():
        for port, v in enumerate(sorted(g.neighbors(s)), start=1):
            d = g.edges[s, v]
            p = PortSpec(port, v, f"{sw.name}-eth{port}", float(d["capacity"]))
            if v in hosts:
                p.peer_mac, p.peer_ip = hosts[v].nic_mac, hosts[v].nic_ip
            elif v in switches:
                # INA packets addressed to that switch leave here (transit by L2).
                p.peer_mac = switches[v].ina_mac
            else:
                raise InputError(f"link {s}-{v}: a switch linked to a {kind[v]} is not emulated")
            sw.ports[port] = p

    links: list[LinkSpec] = []
    unshaped: list[str] = []

    def add(a: str, b: str, a_intf: str, b_intf: str, a_port=None, b_port=None) -> None:
        d = g.edges[a, b] if g.has_edge(a, b) else _mesh_port(g, b)
        sh = shape(float(d["capacity"]), slowdown)
        if sh.rate_bps == 0.0:
            unshaped.append(f"{a}-{b}")
        links.append(
            LinkSpec(
                a,
                b,
                d["link"],
                a_intf,
                b_intf,
                float(d["capacity"]),
                float(d["latency_s"]),
                sh,
                a_port,
                b_port,
            )
        )

    for s, sw in switches.items():
        for port, p in sw.ports.items():
            if p.peer in hosts:
                add(s, p.peer, p.intf, NIC_IF, port, None)
            elif p.peer > s:  # each switch-switch link once
                other = switches[p.peer]
                back = next(q for q in other.ports.values() if q.peer == s)
                add(s, p.peer, p.intf, back.intf, port, back.port)
    bridge_ports: dict[str, int] = {}
    for n, f in sorted(gpu_fabric.items()):
        bridge_ports[f] = bridge_ports.get(f, 0) + 1
        add(f, n, f"{bridges[f].name}-eth{bridge_ports[f]}", NVLINK_IF)
    for f in fabric_nodes:
        for v in g.neighbors(f) if f in g else ():
            if kind[v] not in (GPU, HOST):
                raise InputError(f"link {f}-{v}: an NVLink fabric joins GPUs only")
    return NetworkSpec(tag, float(slowdown), hosts, switches, bridges, links, unshaped)


def _mesh_ports(g: nx.Graph) -> dict[str, str]:
    """GPU -> the bridge that emulates its server's point-to-point NVLink mesh (a mesh board,
    docs/topology.md "Server fabrics"): every GPU whose links to other GPUs all stay in its
    server. The bridge is named as an NVSwitch fabric node would be (``<server>-nvsw``);
    refused when a node of the graph already has that name."""
    out: dict[str, str] = {}
    for n, d in g.nodes(data=True):
        if d["kind"] != GPU:
            continue
        peers = [v for v in g.neighbors(n) if g.nodes[v]["kind"] in (GPU, HOST)]
        server = d.get("server")
        if not peers or any(g.nodes[v].get("server") != server for v in peers):
            continue
        bridge = f"{server}-nvsw"
        if bridge in g:
            raise InputError(
                f"{n}: its server's NVLink mesh needs a bridge named {bridge!r}, already a node"
            )
        out[n] = bridge
    return out


def _mesh_port(g: nx.Graph, gpu: str) -> dict:
    """The emulated link of a mesh GPU to its server's bridge: the total of its links to its
    peers (a bridge cannot limit each pair; the prediction keeps the mesh), their kind and the
    slowest latency."""
    links = [g.edges[gpu, v] for v in g.neighbors(gpu) if g.nodes[v]["kind"] == GPU]
    return {
        "capacity": sum(e["capacity"] for e in links),
        "link": links[0]["link"],
        "latency_s": max(e["latency_s"] for e in links),
    }


def ring_route(spec: NetworkSpec, src: str, dst: str) -> tuple[str, str | None]:
    """How ``src`` reaches ``dst`` for ring traffic: (destination IP, relay IP or None).

    NVLink inside a server; the destination's NIC when both NICs share a switch; else, as
    NCCL's PXN does, through an NVLink peer of ``src`` whose NIC shares ``dst``'s switch.
    Raises InputError when none works: the switch agent forwards only to hosts on its own
    ports (docs/emulation.md)."""
    a, b = spec.hosts[src], spec.hosts[dst]
    if a.fabric is not None and a.fabric == b.fabric:
        return b.nvlink_ip, None
    if not b.nic_ip:
        raise InputError(f"{dst} has no NIC: unreachable from {src} outside its server")
    if a.switch is not None and a.switch == b.switch:
        return b.nic_ip, None
    if a.fabric is not None:
        for p in sorted(spec.hosts.values(), key=lambda h: h.node):
            if p.fabric == a.fabric and p.switch == b.switch and p.node != src:
                return b.nic_ip, p.nvlink_ip
    raise InputError(
        f"no emulated route from {src} to {dst}: their NICs are on different switches and no "
        f"NVLink peer of {src} is on {b.switch}"
    )
