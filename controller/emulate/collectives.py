"""All-reduces between the emulated hosts with the host INA library (docs/emulation.md).

One worker process (``python -m agents.ina.worker``) per GPU host that takes part, started in
the host's namespace and kept for the whole run (the INA rounds of each aggregator live in
it). For each group and scheme, every member is told what to do (its INA group as the switch
agent installed it, its ring channels), then all go at once; each answers its times, the
agreed lane exponent and a SHA-256 of its result. The expected result is computed here from
the same reproducible data (``member_data``): the exact int32 sum of every member's lanes,
or for an INA group in bfp16 lanes (the plan's ``ina_lanes``) the sums of the quantized
values, exact (flat: ``lanes.bfp16_reference``; hierarchical: the servers' float32 sums in
their rings' order, then each rail's bfp16, ``hier.hier_bfp16_reference``); a run is exact
when every member's digest equals it.
"""

from __future__ import annotations

import json
import logging
import secrets
import selectors
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.ina import lanes
from agents.ina.hier import hier_bfp16_reference
from agents.ina.packet import GENERATIONS, SESSIONS
from agents.ina.worker import lanes_digest, member_data, sums_digest
from controller.costmodel.ring import ring_order, server_blocks
from controller.emulate.cluster import Cluster, Proc
from controller.emulate.mn import ROOT
from controller.emulate.plans import GroupRun
from controller.emulate.spec import ring_route
from controller.topology.graph import gpu_sort_key

log = logging.getLogger("heroserve.emulate")

REPLY_TIMEOUT_S = 600.0  # one collective of the largest message on a loaded machine


class CollectiveError(RuntimeError):
    """A member failed or did not answer."""


@dataclass
class InaInfo:
    """An INA group as the switch agent installed it (read back from the switch)."""

    group_id: int
    window: int
    switch_ip: str


@dataclass
class Measurement:
    group: str
    scheme: str
    members: int
    nbytes: int
    seconds: float = 0.0  # median over repeats of the slowest member
    agree_s: float = 0.0
    exact: bool = False
    max_error: float = 0.0  # of the real-valued result against the float64 sum
    error_bound: float = 0.0
    ina_retransmissions: int = 0
    tcp_retransmissions: int = 0
    stale_results: int = 0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Workers:
    """The worker processes of the hosts, each answering JSON lines."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.procs: dict[str, Any] = {}
        self.pending: set[str] = set()  # launched, "ready" not read yet
        self.run_id = 0
        self.ina_sessions: dict[int, dict[str, int]] = {}

    def ina_session(self, group_id: int) -> dict[str, int]:
        """INA group ``group_id``'s session for this run: random session and first
        generation, the same for every member (docs/dataplane.md, "Known limits"). One per
        run is enough: a run starts its own switch and never restarts a worker."""
        if group_id not in self.ina_sessions:
            self.ina_sessions[group_id] = {
                "session": secrets.randbelow(SESSIONS),
                "first_generation": secrets.randbelow(GENERATIONS),
            }
        return self.ina_sessions[group_id]

    def fresh_session(self, group_id: int) -> dict[str, int]:
        """A session of ``group_id`` nobody has used: the next one (newer in RFC 1982 order,
        as the switch requires) with a new random first generation. For a client that
        starts its rounds from 0 (the plugin's ranks, docs/emulation.md); later members of
        the group get it from ``ina_session``, and a Python worker holding the old one
        opens a new session on it."""
        old = self.ina_session(group_id)
        self.ina_sessions[group_id] = {
            "session": (old["session"] + 1) % SESSIONS,
            "first_generation": secrets.randbelow(GENERATIONS),
        }
        return self.ina_sessions[group_id]

    def stop(self, gpus: list[str]) -> None:
        """Quit the workers of ``gpus`` (each holds its host's INA UDP port); ``ensure``
        starts them again when a later collective needs them."""
        for gpu in [g for g in gpus if g in self.procs]:
            p = self.procs.pop(gpu)
            self.pending.discard(gpu)
            try:
                p.stdin.write('{"op": "quit"}\n')
                p.stdin.flush()
                p.wait(timeout=60)
            except (OSError, ValueError):
                pass  # already gone
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def launch(self, gpus: list[str]) -> None:
        """Start the workers of ``gpus`` that do not run yet (they come up meanwhile)."""
        for gpu in gpus:
            if gpu in self.procs:
                continue
            path = self.cluster.workdir / f"worker-{gpu}.log"
            with open(path, "ab") as err:
                p = self.cluster.net.popen(
                    gpu,
                    [sys.executable, "-m", "agents.ina.worker", "--name", gpu],
                    stdin=-1,
                    stdout=-1,
                    stderr=err,
                    cwd=str(ROOT),
                    text=True,
                )
            self.procs[gpu] = p
            self.pending.add(gpu)
            self.cluster.procs.procs.append(Proc(f"worker-{gpu}", p, path))

    def ensure(self, gpus: list[str]) -> None:
        """The workers of ``gpus``, started and ready."""
        self.launch(gpus)
        for gpu in sorted(self.pending):
            reply = self._read(gpu, 120.0)
            if reply.get("ready") != gpu:
                raise CollectiveError(f"worker of {gpu} did not start: {reply}")
        self.pending.clear()

    def send(self, gpu: str, cmd: dict[str, Any]) -> None:
        p = self.procs[gpu]
        try:
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()
        except OSError as exc:
            raise CollectiveError(f"worker of {gpu} is gone: {exc}") from exc

    def _read(self, gpu: str, timeout_s: float) -> dict[str, Any]:
        p = self.procs[gpu]
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout=timeout_s):
                raise CollectiveError(f"worker of {gpu} did not answer in {timeout_s:g}s")
        finally:
            sel.close()
        line = p.stdout.readline()
        if not line:
            raise CollectiveError(f"worker of {gpu} exited (status {p.poll()})")
        try:
            return json.loads(line)
        except ValueError as exc:
            raise CollectiveError(f"worker of {gpu} answered {line[:200]!r}") from exc

    def ask_all(self, cmds: dict[str, dict[str, Any]], timeout_s: float) -> dict[str, dict]:
        for gpu, cmd in cmds.items():
            self.send(gpu, cmd)
        out = {gpu: self._read(gpu, timeout_s) for gpu in cmds}
        bad = {g: r for g, r in out.items() if not r.get("ok")}
        if bad:
            gpu, r = next(iter(bad.items()))
            raise CollectiveError(f"{gpu}: {r.get('error', r)}")
        return out


def ina_groups(cluster: Cluster) -> dict[tuple[str, frozenset[int]], InaInfo]:
    """Every INA group on every switch, keyed by (switch, the ports of its members): the
    multicast group of an assignment lists exactly its members' ports."""
    out: dict[tuple[str, frozenset[int]], InaInfo] = {}
    for s, d in cluster.switch_entries().items():
        sw = cluster.spec.switches[s]
        windows: dict[int, int] = {}
        for key, _action, _params in d["aggregation_table"]:
            windows[key[0]] = windows.get(key[0], 0) + 1
        for gid_s, ports in d["multicast_groups"].items():
            gid = int(gid_s)
            if gid in windows:
                out[(s, frozenset(ports))] = InaInfo(gid, windows[gid], sw.ina_ip)
    return out


def _ina_of(cluster: Cluster, installed: dict, switch: str, members: list[str]) -> InaInfo:
    sw = cluster.spec.switches[switch]
    ports = frozenset(p.port for p in sw.ports.values() if p.peer in members)
    info = installed.get((switch, ports))
    if info is None:
        raise CollectiveError(f"no INA group of {members} installed on {switch}")
    return info


def ring_channels(cluster: Cluster, members: list[str]) -> dict[str, list[list]]:
    """Each member's [rank, size, next IP] per channel. Channels as NCCL builds them between
    servers: as many as the smallest server has members, channel c entering every server at
    its c-th GPU, so the traffic between servers leaves through c different NICs."""
    g, spec = cluster.g, cluster.spec
    order = ring_order(g, members)
    blocks = server_blocks(g, order)
    channels = min(len(b) for b in blocks) if len(blocks) > 1 else 1
    out: dict[str, list[list]] = {m: [] for m in members}
    for c in range(channels):
        ring = [n for b in blocks for n in b[c:] + b[:c]]
        for i, n in enumerate(ring):
            nxt = ring[(i + 1) % len(ring)]
            out[n].append([i, len(ring), ring_route(spec, n, nxt)[0]])
    return out


def expected(seed: int, n: int, workers: int) -> tuple[str, int, float, float]:
    """(digest of the exact lane sum, agreed exponent, max error of the real-valued result
    against the float64 sum, the documented bound) for ``workers`` members' data."""
    data = [member_data(seed, i, n) for i in range(workers)]
    e = max(lanes.exponent_of(lanes.max_abs(x)) for x in data)
    total = np.zeros(n, dtype=np.int64)
    for x in data:
        total += lanes.to_lanes(x, workers, e)
    wrapped = total.astype(np.uint32).view(np.int32)
    real = np.sum(np.stack(data).astype(np.float64), axis=0)
    err = float(np.max(np.abs(lanes.from_lanes(wrapped, workers, e) - real))) if n else 0.0
    return lanes_digest(wrapped), e, err, lanes.error_bound(workers, e)


def expected_bfp16(seed: int, n: int, workers: int) -> tuple[str, float, float]:
    """(digest of the float64 sums, max error against the float64 sum, the documented
    bound) of a bfp16 all-reduce of ``workers`` members' data."""
    data = [member_data(seed, i, n) for i in range(workers)]
    sums, bound = lanes.bfp16_reference(data)
    real = np.sum(np.stack(data).astype(np.float64), axis=0)
    return sums_digest(sums), float(np.max(np.abs(sums - real))), bound


def expected_hier_bfp16(seed: int, n: int, servers: list[list[int]]) -> tuple[str, float, float]:
    """As :func:`expected_bfp16` for a hierarchical group whose server ``j`` holds the
    members of data indices ``servers[j]`` in local-rank (shard) order."""
    data = [[member_data(seed, i, n) for i in srv] for srv in servers]
    sums, bound = hier_bfp16_reference(data)
    real = np.sum(np.stack([x for srv in data for x in srv]).astype(np.float64), axis=0)
    return sums_digest(sums), float(np.max(np.abs(sums - real))), bound


def run_group(
    workers: Workers,
    installed: dict,
    run: GroupRun,
    scheme: str,
    nbytes: int,
    seed: int,
    repeat: int,
    lanes_of_ina: str = "int32",
) -> Measurement:
    """One scheme on one group: prepare every member, go, check the result exactly. INA,
    flat and hierarchical (its rails), runs the plan's lane format ``lanes_of_ina``; the
    ring runs int32 lanes."""
    bfp16 = scheme != "ring" and lanes_of_ina == "bfp16"
    lane_format = "bfp16" if bfp16 else "int32"
    ranked: list[list[int]] = []  # hier: each server's data indices in local-rank order
    cluster = workers.cluster
    grp = run.group
    members = sorted(grp.gpus, key=gpu_sort_key(cluster.g))
    if scheme == "ina":
        members = list(grp.gpus)  # worker id = index in the plan's list, as the controller
    n = max(1, nbytes // 4)
    m = Measurement(run.name, scheme, len(members), n * 4)
    workers.ensure(members)
    workers.run_id += 1
    rid = workers.run_id
    base = {"op": "prepare", "run": rid, "scheme": scheme, "elements": n, "repeat": repeat,
            "seed": seed, "workers": len(members)}  # fmt: skip
    cmds: dict[str, dict[str, Any]] = {}
    if scheme == "ina":
        assert grp.switch is not None
        info = _ina_of(cluster, installed, grp.switch, grp.gpus)
        for w, gpu in enumerate(grp.gpus):
            ina = {"group_id": info.group_id, "worker_id": w, "num_workers": len(grp.gpus),
                   "window": info.window, "switch_ip": info.switch_ip,
                   "lanes": lane_format, **workers.ina_session(info.group_id)}  # fmt: skip
            cmds[gpu] = {**base, "index": w, "ina": ina}
    elif scheme == "ring":
        chans = ring_channels(cluster, members)
        for i, gpu in enumerate(members):
            cmds[gpu] = {**base, "index": i, "ring": {"token": rid, "channels": chans[gpu]}}
    else:  # hier: local ring by shard, INA on the member's rail
        shard_of = {mm: r for r in grp.rails for mm in r.members}
        by_server: dict[str, list[str]] = {}
        for gpu in members:
            by_server.setdefault(cluster.g.nodes[gpu].get("server") or gpu, []).append(gpu)
        for srv in by_server.values():
            srv.sort(key=lambda x: shard_of[x].shard)
        ranked = [[members.index(x) for x in by_server[s]] for s in sorted(by_server)]
        for i, gpu in enumerate(members):
            rail = shard_of[gpu]
            local = by_server[cluster.g.nodes[gpu].get("server") or gpu]
            k = local.index(gpu)
            nxt = local[(k + 1) % len(local)]
            info = _ina_of(cluster, installed, rail.switch, rail.members)
            ina = {"group_id": info.group_id, "worker_id": rail.members.index(gpu),
                   "num_workers": len(rail.members), "window": info.window,
                   "switch_ip": info.switch_ip, "lanes": lane_format,
                   **workers.ina_session(info.group_id)}  # fmt: skip
            server_idx = sorted(by_server).index(cluster.g.nodes[gpu].get("server") or gpu)
            hop = ring_route(cluster.spec, gpu, nxt)[0]
            ring = {"token": rid * 1024 + server_idx, "channels": [[k, len(local), hop]]}
            cmds[gpu] = {**base, "index": i, "ina": ina, "ring": ring}
    # Data index = position in ``members``; the expected sum does not depend on the order.
    try:
        workers.ask_all(cmds, REPLY_TIMEOUT_S)
        replies = workers.ask_all({g: {"op": "go", "run": rid} for g in cmds}, REPLY_TIMEOUT_S)
    except CollectiveError as exc:
        m.error = str(exc)
        return m
    if bfp16:
        e = None
        if scheme == "hier":
            digest, err, bound = expected_hier_bfp16(seed, n, ranked)
        else:
            digest, err, bound = expected_bfp16(seed, n, len(members))
    else:
        digest, e, err, bound = expected(seed, n, len(members))
    m.exact = all(r["digest"] == digest and r["exponent"] == e for r in replies.values())
    m.extra.update(digests=sorted({r["digest"] for r in replies.values()}), seed=seed, elements=n,
                   lanes=lane_format)  # fmt: skip
    m.max_error, m.error_bound = err, bound
    per_repeat = [max(r["seconds"][k] for r in replies.values()) for k in range(repeat)]
    m.seconds = statistics.median(per_repeat)
    m.agree_s = max(r["agree_s"] for r in replies.values())
    for r in replies.values():
        st = r.get("stats", {})
        m.tcp_retransmissions += int(st.get("tcp_retransmissions", 0))
        ina = st.get("ina") or {}
        m.ina_retransmissions += int(ina.get("retransmissions", 0))
        m.stale_results += int(ina.get("stale", 0))
        for k in ("srtt_s", "rto_s", "cwnd"):
            if k in ina:
                m.extra[k] = max(m.extra.get(k, 0.0), float(ina[k]))
    return m
