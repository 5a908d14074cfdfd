"""GPU grouping (Alg. 2 lines 4 and 12-22): which GPUs form each tensor-parallel group.

- ``latency_matrix``: D(i, j), the cost of sending a reference message from GPU i to GPU j
  over its best route (NVLink inside a server; otherwise best exit, switch path, best entry),
  computed with min-plus products over the few switches GPUs attach to, in the fabric's cost
  mode (``costmodel.pairs``). O(levels N^2 S).
- ``mds_embedding``: classical multidimensional scaling of D, because k-means-constrained
  takes Euclidean features, never a distance matrix. O(N^3) (dense eigensolver; N is a pod).
- ``kmeans_groups``: KMeansConstrained(n_clusters=N/TP, size_min=size_max=TP) on the embedding.
- ``perturb``: random swaps between groups, kept when they lower the two groups' summed
  all-reduce time (seeded, reproducible).
- ``packed_groups``: DistServe's placement, consecutive GPUs in server order.
- ``pods``: servers that share access switches; large clusters are grouped pod by pod.
- ``by_pods`` and ``PodGroups``: a pool grouped pod by pod, twin pods once; ``blocks`` merges
  pods too small for an instance.
- ``pod_signature`` and ``shape_signature``: keys equal for pods, groups and stage pairs that
  sit the same way in the same hardware, so their prices are shared.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from k_means_constrained import KMeansConstrained

from controller.costmodel.pairs import pair_times
from controller.topology.fabric import Fabric
from controller.topology.graph import gpu_sort_key, nic_switches


def latency_matrix(fabric: Fabric, gpus: Sequence[str], nbytes: float) -> np.ndarray:
    """D(i, j) in seconds for a message of ``nbytes`` (Alg. 2 line 2), unloaded links, in the
    fabric's cost mode (``costmodel.pairs.pair_times``)."""
    return pair_times(fabric, gpus, nbytes)


def mds_embedding(d: np.ndarray, dims: int = 8) -> np.ndarray:
    """Classical MDS: coordinates whose Euclidean distances approximate ``d``."""
    n = d.shape[0]
    if n <= 1:
        return np.zeros((n, 1))
    finite = np.isfinite(d)
    big = d[finite].max() * 10 if finite.any() else 1.0
    d = np.where(finite, d, big)
    j = np.eye(n) - np.ones((n, n)) / n
    b = -0.5 * j @ (d**2) @ j
    vals, vecs = np.linalg.eigh(b)
    order = np.argsort(vals)[::-1][: min(dims, n - 1)]
    vals = np.clip(vals[order], 0, None)
    return vecs[:, order] * np.sqrt(vals)


def kmeans_groups(gpus: Sequence[str], coords: np.ndarray, tp: int, seed: int) -> list[list[str]]:
    """Equal-size clusters of ``tp`` GPUs (Alg. 2 line 4)."""
    n = len(gpus)
    if tp == 1:
        return [[g] for g in gpus]
    if tp == n:
        return [list(gpus)]
    k = n // tp
    km = KMeansConstrained(n_clusters=k, size_min=tp, size_max=tp, random_state=seed, n_init=3)
    labels = km.fit_predict(coords[: k * tp])
    groups: list[list[str]] = [[] for _ in range(k)]
    for g, lab in zip(gpus[: k * tp], labels, strict=True):
        groups[int(lab)].append(g)
    return [sorted(grp, key=list(gpus).index) for grp in groups]


def packed_groups(g: nx.Graph, gpus: Sequence[str], tp: int) -> list[list[str]]:
    """Consecutive GPUs in (server, index) order: a group stays inside a server when TP divides
    the server's GPU count (DistServe's intra-op placement)."""
    order = sorted(gpus, key=gpu_sort_key(g))
    k = len(order) // tp
    return [order[i * tp : (i + 1) * tp] for i in range(k)]


def perturb(
    groups: list[list[str]], cost: Callable[[Sequence[str]], float], rng: random.Random, tries: int
) -> list[list[str]]:
    """Alg. 2 lines 12-22: for each group, swap a random member with a random member of a
    random other group while that lowers the two groups' summed cost; stop after ``tries``
    swaps in a row fail."""
    groups = [list(x) for x in groups]
    if len(groups) < 2:
        return groups
    costs = [cost(x) for x in groups]
    for gi in range(len(groups)):
        failed = 0
        while failed < tries:
            gj = rng.randrange(len(groups) - 1)
            gj = gj + 1 if gj >= gi else gj
            a, b = rng.randrange(len(groups[gi])), rng.randrange(len(groups[gj]))
            ga, gb = list(groups[gi]), list(groups[gj])
            ga[a], gb[b] = gb[b], ga[a]
            ca, cb = cost(ga), cost(gb)
            if ca + cb < costs[gi] + costs[gj] - 1e-12:
                groups[gi], groups[gj], costs[gi], costs[gj] = ga, gb, ca, cb
                failed = 0
            else:
                failed += 1
    return groups


class _Static:
    """What the grouping functions read of a graph again and again, indexed once: each GPU's
    sort key and pod (servers joined when their GPUs share an access switch), each node's part
    of a structure signature, and the signatures already made. Kept per graph object
    (``static``); a graph is not changed after it is built."""

    def __init__(self, g: nx.Graph) -> None:
        self.g = g
        key = gpu_sort_key(g)
        self.sort_key = {n: key(n) for n, d in g.nodes(data=True) if d["kind"] == "gpu"}
        # node -> its server (None off servers): a plain dict, not networkx's node views
        self.server_of: dict[str, str | None] = dict(g.nodes(data="server"))
        h = nx.Graph()
        for n in self.sort_key:
            s = ("srv", g.nodes[n].get("server") or n)
            h.add_node(s)
            for a in nic_switches(g, n):
                if g.nodes[a].get("tier", "access") == "access":
                    h.add_edge(s, ("sw", a))
        self.pod: dict[str, int] = {}
        for k, comp in enumerate(nx.connected_components(h)):
            for kind, s in comp:
                if kind == "srv":
                    self.pod[s] = k
        self.links: dict[str, tuple] = {}
        self.switch: dict[str, tuple] = {}
        self.signatures: dict[tuple, tuple] = {}

    def gpu_links(self, n: str) -> tuple:
        """(link kind, bandwidth, latency, the neighbour if it is a switch else None) per
        neighbour of GPU ``n``, in a fixed order."""
        hit = self.links.get(n)
        if hit is None:
            g = self.g
            out = []
            for v in sorted(g.neighbors(n), key=lambda v: (g.nodes[v]["kind"], v)):
                e = g.edges[n, v]
                sw = v if g.nodes[v]["kind"] == "switch" else None
                out.append((e["link"], e["available"], e["latency_s"], sw))
            hit = self.links[n] = tuple(out)
        return hit

    def switch_links(self, a: str) -> tuple:
        """(ina, slots, ((bandwidth, latency, neighbour switch), ...)) of switch ``a``."""
        hit = self.switch.get(a)
        if hit is None:
            g = self.g
            up = tuple(
                (g.edges[a, v]["available"], g.edges[a, v]["latency_s"], v)
                for v in g.neighbors(a)
                if g.nodes[v]["kind"] == "switch"
            )
            d = g.nodes[a]
            hit = self.switch[a] = (d.get("ina"), d.get("aggregator_slots"), up)
        return hit


_STATIC: weakref.WeakKeyDictionary[nx.Graph, _Static] = weakref.WeakKeyDictionary()


def static(g: nx.Graph) -> _Static:
    """The graph's index (``_Static``), built on first use."""
    hit = _STATIC.get(g)
    if hit is None:
        hit = _STATIC[g] = _Static(g)
    return hit


def pods(g: nx.Graph, gpus: Sequence[str]) -> list[list[str]]:
    """Split GPUs into pods: servers joined when their GPUs share an access switch. Tensor
    groups are formed inside a pod (a group across pods would cross the core tier, which is
    never cheaper than the pod's own access switches). O(N log N) once the graph is indexed."""
    st = static(g)
    by_pod: dict[int, list[str]] = {}
    pod, server_of = st.pod, st.server_of
    for n in gpus:
        by_pod.setdefault(pod[server_of[n] or n], []).append(n)
    key = st.sort_key.__getitem__
    out = [sorted(members, key=key) for members in by_pod.values()]
    out.sort(key=lambda p: key(p[0]))
    return out


def pod_signature(g: nx.Graph, pod: Sequence[str]) -> tuple:
    """A key equal for pods with the same local structure (GPU types, memories, NVLink and NIC
    bandwidths, which local access switch each NIC plugs into, uplink bandwidths), so a pod's
    grouping and group costs can be reused for its twins. Assumes a uniform core tier."""
    return _local_structure(g, pod, {})


def shape_signature(
    g: nx.Graph, parts: Sequence[Sequence[str]], server_gpus: Mapping[str, list[str]]
) -> tuple:
    """A key equal for tuples of GPU sets (a tensor group; the two stages of a pipeline hop)
    that sit the same way in servers of the same local structure: ``pod_signature`` of their
    whole servers (servers in name order) with each GPU marked by the part it belongs to.
    Such sets have the same routes up to renaming, so the same all-reduce and hop times.
    Assumes a uniform core tier, as pod twins do."""
    marks: dict[str, int] = {}
    for k, part in enumerate(parts, start=1):
        for x in part:
            marks[x] = k
    servers = sorted({g.nodes[x].get("server") or x for x in marks})
    gpus = [x for s in servers for x in server_gpus.get(s, [s])]
    return _local_structure(g, gpus, marks)


def _local_structure(g: nx.Graph, gpus: Sequence[str], marks: Mapping[str, int]) -> tuple:
    st = static(g)
    memo = (tuple(gpus), tuple(marks.get(n, 0) for n in gpus))
    hit = st.signatures.get(memo)
    if hit is not None:
        return hit
    local: dict[str, int] = {}
    servers: dict[str, int] = {}
    gpu_keys = []
    for n in gpus:
        d = g.nodes[n]
        s = servers.setdefault(d.get("server") or n, len(servers))
        links = tuple(
            (kind, bw, lat, -1 if sw is None else local.setdefault(sw, len(local)))
            for kind, bw, lat, sw in st.gpu_links(n)
        )
        gpu_keys.append(
            (d["gpu_type"], d["memory_gb"], s, d.get("index", 0), marks.get(n, 0), links)
        )
    sw_keys = []
    for a, k in sorted(local.items(), key=lambda x: x[1]):
        ina, slots, up = st.switch_links(a)
        ups = tuple(sorted((bw, lat, local.get(v, -1)) for bw, lat, v in up))
        sw_keys.append((k, ina, slots, ups))
    out = (tuple(gpu_keys), tuple(sw_keys))
    if len(st.signatures) < 200_000:  # bounded: a signature is reused, not hoarded
        st.signatures[memo] = out
    return out


def blocks(parts: list[list[str]], size: int) -> list[list[str]]:
    """Consecutive pods merged until a block holds a multiple of ``size`` GPUs (an instance)
    or at least four instances, so that few GPUs are left over; a last block too small for
    one instance joins the one before. O(pods)."""
    out: list[list[str]] = []
    cur: list[str] = []
    for p in parts:
        cur = cur + p
        if len(cur) >= size and (len(cur) % size == 0 or len(cur) >= 4 * size):
            out.append(cur)
            cur = []
    if cur:
        if out and len(cur) < size:
            out[-1] = out[-1] + cur
        else:
            out.append(cur)
    return out


@dataclass
class PodGroups:
    """The groups formed inside one pod. Pods with the same ``key`` (signature) are twins:
    their groups, instances and costs are the same up to renaming GPUs by position."""

    key: tuple | None
    members: list[str]
    groups: list[list[str]]


def by_pods(
    g: nx.Graph,
    pool: Sequence[str],
    tp: int,
    pp: int,
    group_fn: Callable[[list[str]], list[list[str]]],
    say: Callable[[str], None] | None = None,
    cache: dict[tuple, list[list[int]]] | None = None,
    tag: tuple = (),
) -> list[PodGroups]:
    """Run ``group_fn`` on each pod of ``pool``, once per distinct pod signature; twins get
    the first pod's grouping renamed by position. One pod (the whole pool) when a pod cannot
    hold an instance. ``cache`` (signature -> groups by position) may be shared between calls
    that group with the same function, TP and message size, so pools that share pods (the
    role splits of one cluster) group each distinct pod once. ``tag`` names the grouping in
    each pod's key, so pods grouped two ways are never taken for twins.

    When an instance needs more GPUs than a pod has, consecutive pods are merged into blocks
    that hold whole instances (``blocks``), and the blocks are grouped as pods are: locally,
    once per distinct block."""
    parts = pods(g, pool)
    if len(parts) > 1 and min(len(p) for p in parts) < tp * pp:
        parts = blocks(parts, tp * pp)
    if len(parts) == 1:
        return [PodGroups(None, list(pool), group_fn(list(pool)))]
    if cache is None:
        cache = {}
    out = []
    for k, pod in enumerate(parts):
        if say is not None and len(parts) > 8 and k % max(1, len(parts) // 4) == 0:
            say(f"    TP={tp} PP={pp}: pod {k + 1}/{len(parts)}, {len(cache)} distinct so far")
        sig = pod_signature(g, pod)
        if sig in cache:
            groups = [[pod[i] for i in grp] for grp in cache[sig]]
        else:
            groups = group_fn(pod)
            index = {x: i for i, x in enumerate(pod)}
            cache[sig] = [[index[x] for x in grp] for grp in groups]
        out.append(PodGroups((tag, sig), pod, groups))
    return out
