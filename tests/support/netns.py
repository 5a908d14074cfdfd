"""Four worker network namespaces joined to this namespace by veth pairs, whose ends here are
a switch's ports 1..4, with the addresses the workers and the switch use. Root only:
``netns_unavailable`` says why the bed cannot be built here, or None."""

from __future__ import annotations

import os
import shutil
import subprocess

N = 4
SWITCH_MAC, SWITCH_IP = "02:00:00:00:00:fe", "10.77.0.254"


def worker_mac(w: int) -> str:
    return f"02:00:00:00:01:{w + 1:02x}"


def worker_ip(w: int) -> str:
    return f"10.77.0.{w + 1}"


def run_checked(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces and AF_PACKET sockets"
    for tool, package in (("ip", "iproute2"), ("sysctl", "procps")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (Debian package {package})"
    probe = f"hsprobe{os.getpid()}"
    try:
        run_checked("ip", "netns", "add", probe)
        run_checked("ip", "netns", "del", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return f"`ip netns` does not work here: {e}"
    return None


class NetnsBed:
    """4 worker namespaces; their veth peers stay in this namespace as switch ports 1..4."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"hsw{tag}w{w}" for w in range(N)]
        self.ports = [f"hs{tag}p{w + 1}" for w in range(N)]

    def up(self) -> None:
        for w in range(N):
            ns, port, peer = self.ns[w], self.ports[w], f"{self.ports[w]}h"
            run_checked("ip", "netns", "add", ns)
            run_checked("ip", "link", "add", port, "type", "veth", "peer", "name", peer)
            run_checked("ip", "link", "set", peer, "netns", ns)
            for cmd in (
                # No IPv6: its neighbour discovery would add frames the counters see.
                ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
                ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
                ["ip", "link", "set", peer, "name", "eth0"],
                ["ip", "link", "set", "eth0", "address", worker_mac(w)],
                ["ip", "addr", "add", f"{worker_ip(w)}/24", "dev", "eth0"],
                ["ip", "link", "set", "eth0", "up"],
                ["ip", "link", "set", "lo", "up"],
                ["ip", "neigh", "add", SWITCH_IP, "lladdr", SWITCH_MAC, "dev", "eth0"],
            ):
                run_checked("ip", "netns", "exec", ns, *cmd)
            run_checked("sysctl", "-qw", f"net.ipv6.conf.{port}.disable_ipv6=1")
            run_checked("ip", "link", "set", port, "up")

    def __enter__(self) -> NetnsBed:
        """The bed up; whatever part of it came up is taken down if the rest fails."""
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def down(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for port in self.ports:
            subprocess.run(["ip", "link", "del", port], capture_output=True, timeout=30)


def start_collnet_rank(
    bed: NetnsBed,
    w: int,
    harness: str,
    lib: str,
    handles: str,
    group: dict,
    args: list[str],
    env: dict[str, str],
) -> subprocess.Popen:
    """Rank ``w`` of csrc/tests/collnet_harness.cc in worker namespace ``w``: its INA
    config (``group`` completed with the bed's size, the rank's worker id and address)
    written beside the handle directory ``handles``, then the harness with ``args``
    (``--types``, ``--sizes``, ...). Text pipes for its JSON lines and its log."""
    import json
    from pathlib import Path

    cfg = Path(handles).parent / f"{Path(handles).name}-ina{w}.json"
    g = {**group, "num_workers": N, "worker_id": w, "bind_ip": worker_ip(w)}
    cfg.write_text(json.dumps({"groups": [g]}))
    argv = ["ip", "netns", "exec", bed.ns[w], harness, "--lib", lib, "--dir", handles,
            "--rank", str(w), "--nranks", str(N), *args]  # fmt: skip
    return subprocess.Popen(
        argv,
        env=dict(env, HEROSERVE_INA_CONFIG=str(cfg)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect_ranks(
    procs: list[subprocess.Popen], bound_s: float
) -> list[tuple[int, list[dict], str]]:
    """Waits for the ranks :func:`start_collnet_rank` started, all within ``bound_s`` seconds
    (a bound for a hang, not a measure: each rank ends when its sums do; one past it is
    killed): per rank (exit status, its JSON event lines, its log)."""
    import json
    import time

    outs = []
    t0 = time.monotonic()
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, bound_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        outs.append((p.returncode, [json.loads(x) for x in o.splitlines() if x.startswith("{")], e))
    return outs
