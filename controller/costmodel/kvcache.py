"""KV-cache transfer from prefill to decode (paper Eqs. 14-15, docs/design.md §5).

A prefill GPU holds the KV cache of its stage's layers and its tensor shard of the KV heads;
it goes to the decode GPUs that hold overlapping layers and shards (when prefill and decode
TP/PP differ, shards map by overlap); T_f is the slowest prefill GPU (Eq. 14). All prefill
GPUs send at once, so their flows share links (``kv_time``):

* pipelined: a prefill GPU posts its shares together and they stream at once (RDMA writes to
  several peers interleave on the NIC), every share of every GPU on the links at once; a GPU
  takes as long as its slowest share, each priced with all the bytes on its links, so a GPU
  whose shares leave through one NIC takes at least its bytes over that NIC;
* paper: Eq. 15 as written, a GPU's shares one after the other, their times summed; a share
  shares its links with the other GPUs' shares, not with its own GPU's other shares (which
  do not run at the same time)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from controller.costmodel.network import flow_times, path_time
from controller.costmodel.ring import rail_routes
from controller.models.specs import ModelSpec
from controller.topology.fabric import Fabric, Path


@dataclass
class KVFlow:
    src: str
    dst: str
    nbytes: float
    path: Path
    time_s: float


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _layer_share(i: int, pp_p: int, k: int, pp_d: int, layers: int) -> float:
    """Fraction of the model's layers that prefill stage i of pp_p and decode stage k of
    pp_d both hold."""
    return _overlap(i * layers / pp_p, (i + 1) * layers / pp_p, k * layers / pp_d,
                    (k + 1) * layers / pp_d) / layers  # fmt: skip


def _head_share(j: int, tp_p: int, q: int, tp_d: int) -> float:
    """Fraction of the KV heads that member j of tp_p and member q of tp_d both hold."""
    return _overlap(j / tp_p, (j + 1) / tp_p, q / tp_d, (q + 1) / tp_d)


def stage_kv_shares(
    model: ModelSpec, pre_stages: Sequence[Sequence[str]], pp_d: int, k: int, tp_d: int
) -> list[tuple[str, int, float]]:
    """(prefill GPU, position q in the stage, fraction of the request's whole KV cache) that
    decode stage ``k`` of ``pp_d`` stages of ``tp_d`` GPUs receives, whichever GPUs hold it.
    O(PP_p * TP_p * TP_d)."""
    pp_p = len(pre_stages)
    out = []
    for i, stage in enumerate(pre_stages):
        lo = _layer_share(i, pp_p, k, pp_d, model.layers)
        if lo == 0:
            continue
        for j, src in enumerate(stage):
            for q in range(tp_d):
                ho = _head_share(j, len(stage), q, tp_d)
                if ho > 0:
                    out.append((src, q, lo * ho))
    return out


def kv_shares(
    model: ModelSpec, pre_stages: Sequence[Sequence[str]], dec_stages: Sequence[Sequence[str]]
) -> list[tuple[str, str, float]]:
    """(prefill GPU, decode GPU, fraction of the request's whole KV cache) for every pair that
    shares layers and KV-head shards (the rule of :func:`stage_kv_shares`), in prefill order.
    Fractions over all pairs sum to 1. The positions and fractions depend only on the stage
    sizes (``_share_layout``, kept per shape): only the names are looked up per call."""
    layout = _share_layout(
        model.layers, tuple(len(s) for s in pre_stages), tuple(len(s) for s in dec_stages)
    )
    return [(pre_stages[i][j], dec_stages[k][q], f) for i, j, k, q, f in layout]


@lru_cache(maxsize=4096)
def _share_layout(
    layers: int, pre_sizes: tuple[int, ...], dec_sizes: tuple[int, ...]
) -> tuple[tuple[int, int, int, int, float], ...]:
    """(prefill stage, member, decode stage, member, fraction) of every share between
    stages of these sizes, in ``kv_shares``' order."""
    pp_p, pp_d = len(pre_sizes), len(dec_sizes)
    out = []
    for i, tp_i in enumerate(pre_sizes):
        los = [_layer_share(i, pp_p, k, pp_d, layers) for k in range(pp_d)]
        for j in range(tp_i):
            for k, tp_k in enumerate(dec_sizes):
                lo = los[k]
                if lo == 0:
                    continue
                for q in range(tp_k):
                    ho = _head_share(j, tp_i, q, tp_k)
                    if ho > 0:
                        out.append((i, j, k, q, lo * ho))
    return tuple(out)


def kv_route(fabric: Fabric, src: str, dst: str, nbytes: float) -> Path:
    """The route of one KV share of ``nbytes`` bytes from prefill GPU ``src`` to decode GPU
    ``dst``: NVLink inside a server, otherwise NCCL's rail routes (``rail_routes``), the
    cheapest alone (Eq. 10 for one flow). The planner and the simulator both take it from here.
    O(routes * hops)."""
    head, last = kv_route_parts(fabric, src, dst, nbytes)
    return head + [last] if last is not None else list(head)


def kv_route_parts(fabric: Fabric, src: str, dst: str, nbytes: float) -> tuple[Path, str | None]:
    """``kv_route`` as a kept list and the node to append (None: the list is the whole
    route). The list is the fabric's own (an NVLink path, or a rail route's winner up to
    ``dst``'s switch, shared by every destination that ties with ``dst``): read it, never
    change it. A caller that converts routes into link numbers converts each kept list once
    (``KVPricer._kv_price``)."""
    nv = fabric.nvlink_path(src, dst)
    if nv is not None:
        return nv, None
    if fabric.pipelined and nbytes >= 0:
        fast = _cheapest_rail_prefix(fabric, src, dst, nbytes)
        if fast is not None:
            return fast, dst
    return min(rail_routes(fabric, src, dst), key=lambda p: path_time(fabric, p, nbytes)), None


def _cheapest_rail_prefix(fabric: Fabric, src: str, dst: str, nbytes: float) -> Path | None:
    """``min(rail_routes(src, dst), key=path_time)`` for GPUs of two servers on a pipelined
    fabric, up to ``dst``'s switch, without building every candidate: the same candidates in
    the same order (exit of ``src``, switch path, ``dst``'s own NIC; ``ring._rail_routes``),
    each priced by ``Fabric.pipelined_time`` from the ``Fabric.hop_sums`` of its route up to
    ``dst``'s switch (kept per source, exit and switch) carried over the last hop:
    ``path_time``'s floats, and ``min``'s first-cheapest tie rule. None when no candidate
    exists (the caller falls back to ``rail_routes``).

    Every float compared depends only on the source, the size and the destination's own
    NICs: their switches and their last hop's 1/B and latency (its *signature*). So the
    winner, up to ``dst``'s switch, is kept per (source, signature, size) and shared by every
    destination with the same signature (a decode GPU's twins behind the same switch)."""
    memo = fabric.memo
    mine = _own_nics(fabric, dst)
    choices: dict = memo.setdefault("kv-choice", {})
    key = (src, mine[0], nbytes)
    hit = choices.get(key)
    if hit is None:
        hit = choices[key] = _cheapest_prefix(fabric, src, mine[1], mine[2], nbytes)
    return None if hit is False else hit


def kv_destination_class(fabric: Fabric, dst: str) -> int:
    """A number equal for decode GPUs whose own NICs have the same switches, 1/B and
    latency (their *signature*): from one source, a share of one size to any of them takes
    the same rail route up to their switch (``kv_route_parts``' kept list), the last hop
    apart."""
    return _own_nics(fabric, dst)[0]


def _own_nics(fabric: Fabric, dst: str) -> tuple[int, list, set]:
    """(signature number, own NICs as (switch, last hop), their switches) of ``dst``, kept."""
    memo = fabric.memo
    owns: dict = memo.setdefault("kv-own", {})
    mine = owns.get(dst)
    if mine is None:
        table = fabric.link_table
        own = [(f[-1], ((f[-1], dst),)) for f in fabric.exits(dst) if len(f) == 2]
        sig = tuple((sw, *table[last[0]]) for sw, last in own)
        sigs: dict = memo.setdefault("kv-signatures", {})
        mine = owns[dst] = (sigs.setdefault(sig, len(sigs)), own, {sw for sw, _ in own})
    return mine


def _cheapest_prefix(fabric: Fabric, src: str, own: list, rails: set, nbytes: float) -> Path | bool:
    """``_cheapest_rail_route``'s winner up to the destination's switch, or False."""
    prefixes: dict = fabric.memo.setdefault("kv-prefix", {})
    best: Path | bool = False
    best_t = 0.0
    for i, e in enumerate(fabric.exits(src)):
        if len(e) != 2 and e[-1] not in rails:
            continue  # a peer's NIC that is not on the destination's rail
        for sw, last in own:
            key = (src, i, sw)
            pre = prefixes.get(key)
            if pre is None:
                pre = prefixes[key] = _prefix(fabric, e, sw)
            if pre is False:
                continue  # no switch path
            t = fabric.pipelined_time(fabric.hop_sums(last, pre[1]), nbytes)
            if best is False or t < best_t:
                best, best_t = pre[0], t
    return best


def _prefix(fabric: Fabric, exit_path: Path, switch: str) -> tuple | bool:
    """(route from the exit to ``switch``, its ``Fabric.hop_sums``), or False without a
    switch path."""
    sp = fabric.flow_switch_path(exit_path[-1], switch, exit_path[0])
    if sp is None:
        return False
    path = exit_path + sp[1:]
    return path, fabric.hop_sums(zip(path, path[1:], strict=False))


def kv_share_terms(
    fabric: Fabric, shares: Sequence[tuple[str, Path, float]]
) -> list[tuple[str, list[tuple[tuple[str, str], float]], float]]:
    """Each share (prefill GPU, route, bytes) as (its GPU, [(link, bytes counted on it)],
    fixed seconds): the bytes a share is priced with on each of its links in the fabric's
    mode (module docstring): every share's (pipelined), or every other GPU's plus its own
    (paper, Eq. 15)."""
    total: dict[tuple[str, str], float] = defaultdict(float)
    own: dict[tuple[str, tuple[str, str]], float] = defaultdict(float)
    edges = []
    for src, route, nb in shares:
        es = list(zip(route, route[1:], strict=False))
        edges.append(es)
        for e in es:
            total[e] += nb
            own[(src, e)] += nb
    out = []
    for (src, _, nb), es in zip(shares, edges, strict=True):
        if fabric.pipelined:
            counted = [(e, total[e]) for e in es]
        else:
            counted = [(e, total[e] - own[(src, e)] + nb) for e in es]
        out.append((src, counted, fabric.fixed_s(es)))
    return out


def kv_time(fabric: Fabric, shares: Sequence[tuple[str, Path, float]]) -> tuple[float, list[float]]:
    """T_f (Eq. 14) of KV shares (prefill GPU, route, bytes) sent at once, and each share's
    time: pipelined, a GPU's shares stream together (its time is the slowest); paper, one
    after the other (Eq. 15, summed). O(total hops)."""
    if not shares:
        return 0.0, []
    table = fabric.link_table
    if fabric.pipelined:
        times = flow_times(fabric, [(r, nb) for _, r, nb in shares])
    else:
        times = [
            sum(b * table[e][0] for e, b in counted) + fixed
            for _, counted, fixed in kv_share_terms(fabric, shares)
        ]
    per_src: dict[str, float] = {}
    for (src, _, _), t in zip(shares, times, strict=True):
        if fabric.pipelined:
            per_src[src] = max(per_src.get(src, 0.0), t)
        else:
            per_src[src] = per_src.get(src, 0.0) + t
    return max(per_src.values()), times
