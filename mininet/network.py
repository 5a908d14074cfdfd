"""Build and tear down the Mininet network of a :class:`controller.emulate.spec.NetworkSpec`.

Uses Mininet's node and link classes (hosts in network namespaces, veth pairs) without its
``Mininet`` container, whose start-up raises machine-wide sysctl limits and whose stop may
``pkill`` processes it did not start. Every link's rate is shaped with a token bucket
(``tbf``) on both ends. Loss, duplication and reordering, when asked for, are applied to the
hosts' NIC links by a user-space link emulator per switch (``linkemu.py``): the kernels this
project runs on may lack ``sch_netem``. :meth:`EmulatedNetwork.stop` is idempotent and removes
every interface whose name carries the run's tag, also after a start that failed half-way.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from mininet.link import Link

from agents.ina.impairments import Impairments
from controller.emulate.spec import NIC_IF, NVLINK_IF, LinkSpec, NetworkSpec, ring_route

from .nodes import GpuHost, LinkEmulator, NvlinkFabric, P4Switch, run_script

TBF_LIMIT_BYTES = 4 << 20  # queue of a shaped link: a ring step of a few MB never overflows it
TBF_MIN_BURST = 3200  # two full frames: the bucket must hold at least one MTU


def tbf_line(intf: str, rate_bps: float) -> str:
    """``tc`` line shaping ``intf``'s egress to ``rate_bps``, or "" for an unshaped link.
    The bucket holds 4 ms of the rate (one tick at HZ=250) or two frames, whichever is more."""
    if rate_bps <= 0:
        return ""
    burst = max(TBF_MIN_BURST, round(rate_bps / 8 * 0.004))
    return (
        f"tc qdisc replace dev {intf} root tbf rate {round(rate_bps)}bit "
        f"burst {burst} limit {TBF_LIMIT_BYTES}"
    )


def free_mgmt_subnets(count: int) -> list[tuple[str, str]]:
    """``count`` (root IP, switch IP) pairs of /30 subnets of 10.254.0.0/16 that no address of
    the root namespace uses (another run's management links live there too)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30
    ).stdout
    used = set()
    for ip in re.findall(r"inet 10\.254\.(\d+)\.(\d+)/", out):
        used.add((int(ip[0]), int(ip[1]) // 4))
    pairs = []
    for third in range(256):
        for block in range(64):
            if (third, block) not in used:
                base = f"10.254.{third}.{block * 4}"
                pairs.append((base[: base.rfind(".")] + f".{block * 4 + 1}",
                              base[: base.rfind(".")] + f".{block * 4 + 2}"))  # fmt: skip
                if len(pairs) == count:
                    return pairs
    raise RuntimeError("no free management subnet in 10.254.0.0/16")


def root_interfaces(prefix: str) -> list[str]:
    """Interfaces of the root namespace whose name starts with ``prefix``."""
    out = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30
    ).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix):
                names.append(name)
    return names


class EmulatedNetwork:
    """Hosts, bridges and P4 switches of one emulation run."""

    def __init__(
        self,
        spec: NetworkSpec,
        *,
        workdir: Path,
        python: str,
        root: Path,
        switch_kind: str = "model",
        impair: Impairments | None = None,
        impair_seed: int = 0,
        bmv2_json: str | None = None,
    ) -> None:
        self.spec = spec
        self.workdir = workdir
        self.python = python
        self.root = root
        self.switch_kind = switch_kind
        self.impair = impair
        self.impair_seed = impair_seed
        self.bmv2_json = bmv2_json
        self.hosts: dict[str, GpuHost] = {}
        self.bridges: dict[str, NvlinkFabric] = {}
        self.switches: dict[str, P4Switch] = {}
        self.emulators: dict[str, LinkEmulator] = {}
        self.links: list[Link] = []
        self._stopped = False

    # -- bring-up ------------------------------------------------------------------------
    def start(self) -> None:
        spec = self.spec
        for n, h in spec.hosts.items():
            self.hosts[n] = GpuHost(h.name)
        for f, b in spec.bridges.items():
            self.bridges[f] = NvlinkFabric(b.name, workdir=str(self.workdir))
        mgmt = free_mgmt_subnets(len(spec.switches)) if self.switch_kind == "bmv2" else []
        for i, (s, sw) in enumerate(spec.switches.items()):
            self.switches[s] = P4Switch(
                sw.name,
                device_id=sw.device_id,
                ports={p: ps.intf for p, ps in sw.ports.items()},
                workdir=str(self.workdir),
                python=self.python,
                root=str(self.root),
                kind=self.switch_kind,
                bmv2_json=self.bmv2_json,
                mgmt=(f"{spec.tag}m{sw.device_id}", *mgmt[i]) if mgmt else None,
            )
        for i, ls in enumerate(spec.links):
            self._link(ls, i)
        self._shape()
        for node in (*self.switches.values(), *self.emulators.values(), *self.bridges.values()):
            node.start([])  # a switch's process starts here and comes up meanwhile
        for n in spec.hosts:
            self.hosts[n].configure(self._host_lines(n), self.workdir)
        for h in self.hosts.values():
            h.wait_configured()
        for s in self.switches.values():
            s.wait_started()

    def _node(self, name: str) -> Any:
        return self.hosts.get(name) or self.bridges.get(name) or self.switches[name]

    def _link(self, ls: LinkSpec, index: int) -> None:
        """Mininet link(s) of one spec link: a host's NIC link goes through the link
        emulator of its switch when impairments are asked for."""
        spec = self.spec
        a, b = self._node(ls.a), self._node(ls.b)
        # Switch-side ends get MACs of their own (Mininet sets both or neither).
        addr1 = f"02:48:53:fe:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}"
        addr2 = f"02:48:53:fd:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}"
        if ls.b in spec.hosts:
            h = spec.hosts[ls.b]
            addr2 = h.nic_mac if ls.b_intf == NIC_IF else h.nvlink_mac
        if self.impair and ls.b in spec.hosts and ls.b_intf == NIC_IF and ls.a_port:
            emu = self._emulator(ls.a)
            e_sw, e_host = f"{emu.name}-eth{2 * ls.a_port - 1}", f"{emu.name}-eth{2 * ls.a_port}"
            emu.params["pairs"].append((e_sw, e_host))
            self.links.append(
                Link(
                    a,
                    emu,
                    port1=ls.a_port,
                    port2=2 * ls.a_port - 1,
                    intfName1=ls.a_intf,
                    intfName2=e_sw,
                    addr1=addr1,
                    addr2=f"02:48:53:fc:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}",
                )
            )
            self.links.append(
                Link(
                    emu,
                    b,
                    port1=2 * ls.a_port,
                    port2=None,
                    intfName1=e_host,
                    intfName2=ls.b_intf,
                    addr1=f"02:48:53:fb:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}",
                    addr2=addr2,
                )
            )
            return
        self.links.append(
            Link(
                a,
                b,
                port1=ls.a_port,
                port2=ls.b_port,
                intfName1=ls.a_intf,
                intfName2=ls.b_intf,
                addr1=addr1,
                addr2=addr2,
            )
        )

    def _emulator(self, switch: str) -> LinkEmulator:
        emu = self.emulators.get(switch)
        if emu is None:
            assert self.impair is not None
            sw = self.spec.switches[switch]
            args = [
                "--loss",
                str(self.impair.loss),
                "--duplicate",
                str(self.impair.duplicate),
                "--reorder",
                str(self.impair.reorder),
                "--seed",
                str(self.impair_seed * 1000 + sw.device_id),
            ]
            emu = LinkEmulator(
                f"{self.spec.tag}x{sw.device_id}",
                pairs=[],
                args=args,
                workdir=str(self.workdir),
                python=self.python,
                root=str(self.root),
            )
            self.emulators[switch] = emu
        return emu

    def _shape(self) -> None:
        """A token bucket on both ends of every link that has a rate."""
        root_lines: list[str] = []
        host_lines: dict[str, list[str]] = {}
        for ls in self.spec.links:
            for node, intf in ((ls.a, ls.a_intf), (ls.b, ls.b_intf)):
                line = tbf_line(intf, ls.shape.rate_bps)
                if not line:
                    continue
                in_ns = (
                    node in self.spec.hosts
                    or node in self.spec.bridges
                    or (self.switch_kind == "bmv2" and node in self.spec.switches)
                )
                if in_ns:
                    host_lines.setdefault(node, []).append(line)
                else:
                    root_lines.append(line)
        if root_lines:
            out = subprocess.run(
                ["bash", "-c", "set -e\n" + "\n".join(root_lines)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode:
                raise RuntimeError(f"shaping links: {out.stderr.strip()[:400]}")
        for node, lines in host_lines.items():
            n = self._node(node)
            res = run_script(n, lines, self.workdir / f"{n.name}-tc.sh")
            if res.strip():
                raise RuntimeError(f"shaping links of {n.name}: {res.strip()[:400]}")

    def _host_lines(self, node: str) -> list[str]:
        """Addresses, static neighbours and PXN routes of one host."""
        spec = self.spec
        h = spec.hosts[node]
        lines: list[str] = []
        if h.nic_ip:
            lines += [
                f"sysctl -qw net.ipv6.conf.{NIC_IF}.disable_ipv6=1",
                f"ethtool -K {NIC_IF} rx off tx off sg off tso off gso off gro off >/dev/null 2>&1",
                f"ip addr add {h.nic_ip}/16 dev {NIC_IF}",
                f"ip link set {NIC_IF} up",
            ]
            sw = spec.switches[h.switch] if h.switch else None
            if sw is not None:
                lines.append(f"ip neigh replace {sw.ina_ip} lladdr {sw.ina_mac} dev {NIC_IF}")
            for o in spec.hosts.values():
                if o.node != node and o.nic_ip and o.switch == h.switch:
                    lines.append(f"ip neigh replace {o.nic_ip} lladdr {o.nic_mac} dev {NIC_IF}")
        if h.nvlink_ip:
            lines += [
                f"sysctl -qw net.ipv6.conf.{NVLINK_IF}.disable_ipv6=1",
                f"ethtool -K {NVLINK_IF} rx off tx off sg off tso off gso off gro off"
                " >/dev/null 2>&1",
                f"ip addr add {h.nvlink_ip}/16 dev {NVLINK_IF}",
                f"ip link set {NVLINK_IF} up",
            ]
            for o in spec.hosts.values():
                if o.node != node and o.fabric == h.fabric:
                    lines.append(
                        f"ip neigh replace {o.nvlink_ip} lladdr {o.nvlink_mac} dev {NVLINK_IF}"
                    )
        if h.nic_ip and h.nvlink_ip:
            for o in spec.hosts.values():
                if o.node == node or not o.nic_ip:
                    continue
                try:
                    _, relay = ring_route(spec, node, o.node)
                except ValueError:
                    continue  # unreachable: the ring check says so when it matters
                if relay is not None:
                    lines.append(
                        f"ip route replace {o.nic_ip}/32 via {relay} dev {NVLINK_IF} src {h.nic_ip}"
                    )
        return lines

    # -- use -----------------------------------------------------------------------------
    def p4runtime(self, switch: str) -> str:
        return self.switches[switch].p4runtime

    def popen(self, host: str, argv: list[str], **kw: Any) -> subprocess.Popen:
        """A process in ``host``'s namespace (its own session: ``mnexec -da``)."""
        return self.hosts[host].popen(argv, **kw)

    # -- tear-down -----------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything this network made; returns what had to be swept by name."""
        if self._stopped:
            return []
        self._stopped = True
        errors: list[str] = []
        for group in (self.switches, self.emulators, self.bridges):
            for node in group.values():
                try:
                    node.stop(deleteIntfs=True)  # a Mininet switch's stop leaves its shell
                    node.terminate()
                except Exception as exc:  # keep tearing down the rest
                    errors.append(f"{node.name}: {exc}")
        for h in self.hosts.values():
            try:
                h.terminate()
            except Exception as exc:
                errors.append(f"{h.name}: {exc}")
        swept = root_interfaces(self.spec.tag)
        for name in swept:
            subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
        return swept + errors
