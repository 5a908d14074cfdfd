"""All-pairs transfer times between GPUs (Alg. 2 lines 1-3: the latency matrix D(i, j)).

A route from GPU i to GPU j is three segments: an exit of i (its NIC, or an NVLink peer's),
a switch path, and the reverse of an exit of j; or, inside a server, the NVLink path. Each
segment s has a slowest hop ``m_s = max 1/B(e)`` and an additive part ``a_s``. In the paper's
store-and-forward mode a route costs ``sum_s (D sum_e 1/B(e) + latency)``, additive, so
D(i, j) is a min-plus product over the few switches GPUs attach to. Pipelined, a route costs
``(D - p) max_s m_s + sum_s a_s`` with ``a_s = latency_s + p sum_e 1/B(e)`` (p the packet,
``Fabric`` docs), which a min-plus product cannot take whole: it is taken per *level* M, one
of the few distinct m values (link speeds). With c = D - p >= 0, the routes whose segments all
have m <= M cost at most ``c M + sum a`` and the best route meets that bound at its own level,
so D = min over M of ``c M + minplus(segments with m <= M)``. With c < 0 (messages smaller
than a packet) the bound flips: D = min over M of ``c M + minplus(routes with some segment
m >= M)``, three min-plus products per level (the exit of i, the switch path or the exit of
j carries it). Exact in both cases. O(levels * N^2 S) for N GPUs and S switches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.topology.fabric import Fabric, Path


def _segment(fabric: Fabric, path: Path, nbytes: float) -> tuple[float, float]:
    """(m, a) of one segment: its slowest hop's 1/B and its additive cost in the mode."""
    table = fabric.link_table
    inv_sum = inv_max = lat = 0.0
    for e in zip(path, path[1:], strict=False):
        inv, le = table[e]
        inv_sum += inv
        lat += le
        inv_max = max(inv_max, inv)
    if fabric.pipelined:
        return inv_max, lat + fabric.packet_bytes * inv_sum
    return 0.0, lat + nbytes * inv_sum


def _minplus(exit_a: np.ndarray, sd: np.ndarray, exit_b: np.ndarray) -> np.ndarray:
    """D[i, j] = min over a, b of exit_a[i, a] + sd[a, b] + exit_b[j, b]: one (N, S) and
    then one (N, N) ``minimum`` per switch, not a reduction over a short last axis of an
    (N, N, S) array (the same sums; a min is exact in any order)."""
    n, ns = exit_a.shape
    via = np.full((n, ns), np.inf)
    for a in range(ns):
        np.minimum(via, exit_a[:, a, None] + sd[None, a, :], out=via)
    out = np.full((n, exit_b.shape[0]), np.inf)
    for b in range(ns):
        np.minimum(out, via[:, b, None] + exit_b[None, :, b], out=out)
    return out


def _exit_segments(fabric: Fabric, gpu: str, nbytes: float) -> list[tuple[str, int, float, float]]:
    """(switch, its position among ``gpu``'s exits to that switch, m, a) of every exit of
    ``gpu``, in ``Fabric.exits`` order; kept on the fabric (per size in the paper's mode,
    where ``a`` depends on it): every latency matrix over a GPU's pod asks again."""
    key = ("pairs-exits", gpu, None if fabric.pipelined else nbytes)
    hit = fabric.memo.get(key)
    if hit is None:
        seen: dict[str, int] = {}
        out = []
        for e in fabric.exits(gpu):
            x = seen[e[-1]] = seen.get(e[-1], -1) + 1
            out.append((e[-1], x, *_segment(fabric, e, nbytes)))
        hit = fabric.memo[key] = out
    return hit  # type: ignore[return-value]


def _switch_segment(fabric: Fabric, a: str, b: str, nbytes: float) -> tuple[float, float] | None:
    """``_segment`` of the switch path a..b (None when unreachable), kept on the fabric."""
    key = ("pairs-switch", a, b, None if fabric.pipelined else nbytes)
    memo = fabric.memo
    if key not in memo:
        p = fabric.switch_path(a, b)
        memo[key] = None if p is None else _segment(fabric, p, nbytes)
    return memo[key]  # type: ignore[return-value]


def _nvlink_time(fabric: Fabric, a: str, b: str, nbytes: float) -> float | None:
    """``Fabric.path_time`` of the NVLink path a..b (None without one), kept on the fabric."""
    key = ("pairs-nvlink", a, b, nbytes)
    memo = fabric.memo
    if key not in memo:
        p = fabric.nvlink_path(a, b)
        memo[key] = None if p is None else fabric.path_time(p, nbytes)
    return memo[key]  # type: ignore[return-value]


def pair_times(fabric: Fabric, gpus: Sequence[str], nbytes: float) -> np.ndarray:
    """D(i, j) in seconds for a message of ``nbytes`` from GPU i to GPU j over its best route,
    unloaded links, in the fabric's cost mode (module docstring). Each GPU's exit segments,
    each switch pair's path segment and each NVLink pair's time are kept on the fabric, the
    same floats every time, so a matrix over GPUs met before costs its numpy part."""
    n = len(gpus)
    segs = [_exit_segments(fabric, g, nbytes) for g in gpus]
    sw = sorted({s for row in segs for s, _, _, _ in row})
    idx = {s: k for k, s in enumerate(sw)}
    ns = len(sw)
    # every exit of GPU i to switch k (several: its own NIC and NVLink peers' on that switch)
    width = max((x + 1 for row in segs for _, x, _, _ in row), default=0)
    exit_m = np.full((n, ns, max(1, width)), np.inf)
    exit_a = np.full((n, ns, max(1, width)), np.inf)
    rows = [i for i, row in enumerate(segs) for _ in row]
    if rows:
        cols = [idx[s] for row in segs for s, _, _, _ in row]
        pos = [x for row in segs for _, x, _, _ in row]
        exit_m[rows, cols, pos] = [m for row in segs for _, _, m, _ in row]
        exit_a[rows, cols, pos] = [a for row in segs for _, _, _, a in row]
    sd_m = np.full((ns, ns), np.inf)
    sd_a = np.full((ns, ns), np.inf)
    for a_sw in sw:
        for b_sw in sw:
            seg = _switch_segment(fabric, a_sw, b_sw, nbytes)
            if seg is not None:
                sd_m[idx[a_sw], idx[b_sw]], sd_a[idx[a_sw], idx[b_sw]] = seg
    d = np.full((n, n), np.inf)
    best_exit = exit_a.min(axis=2)
    if ns and not fabric.pipelined:
        d = _minplus(best_exit, sd_a, best_exit)
    elif ns:
        c = nbytes - fabric.packet_bytes
        finite = np.concatenate([exit_m[np.isfinite(exit_m)], sd_m[np.isfinite(sd_m)]])
        for lv in np.unique(finite):
            if c >= 0:  # every segment at most this level
                ea = np.where(exit_m <= lv, exit_a, np.inf).min(axis=2)
                sa = np.where(sd_m <= lv, sd_a, np.inf)
                best = _minplus(ea, sa, ea)
            else:  # some segment at least this level
                ea = np.where(exit_m >= lv, exit_a, np.inf).min(axis=2)
                sa = np.where(sd_m >= lv, sd_a, np.inf)
                best = np.minimum(
                    np.minimum(_minplus(ea, sd_a, best_exit), _minplus(best_exit, sa, best_exit)),
                    _minplus(best_exit, sd_a, ea),
                )
            d = np.minimum(d, best + c * lv)
    # NVLink inside a server: only pairs of one server can use it, so the walk is over each
    # server's GPUs (O(N G) for G GPUs a server), not over all N^2 pairs
    by_server: dict[object, list[int]] = {}
    for i, g in enumerate(gpus):
        server = fabric.g.nodes[g].get("server")
        if server is not None:
            by_server.setdefault(server, []).append(i)
    for members in by_server.values():
        for x, i in enumerate(members):
            for j in members[x + 1 :]:
                a, b = (i, j) if i < j else (j, i)
                t = _nvlink_time(fabric, gpus[a], gpus[b], nbytes)
                if t is not None:
                    d[a, b] = min(d[a, b], t)
    d = np.minimum(d, d.T)
    np.fill_diagonal(d, 0.0)
    return d
