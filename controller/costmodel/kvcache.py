"""KV-cache transfer from prefill to decode (paper Eqs. 14-15, DESIGN.md §5).

A prefill GPU holds the KV cache of its stage's layers and its tensor shard of the KV heads;
it goes to the decode GPUs that hold overlapping layers and shards (when prefill and decode
TP/PP differ, shards map by overlap). Each prefill GPU sends its transfers one after the
other (Eq. 15 sums them); all prefill GPUs send at once, so flows share links; T_f is the
slowest prefill GPU (Eq. 14)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.costmodel.network import path_time, rail_routes
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


def kv_shares(
    model: ModelSpec, pre_stages: Sequence[Sequence[str]], dec_stages: Sequence[Sequence[str]]
) -> list[tuple[str, str, float]]:
    """(prefill GPU, decode GPU, fraction of the request's whole KV cache) for every pair that
    shares layers and KV-head shards. Fractions over all pairs sum to 1."""
    layers = model.layers
    out = []
    pp_p, pp_d = len(pre_stages), len(dec_stages)
    for i, stage in enumerate(pre_stages):
        l0, l1 = i * layers / pp_p, (i + 1) * layers / pp_p
        tp_p = len(stage)
        for j, src in enumerate(stage):
            h0, h1 = j / tp_p, (j + 1) / tp_p
            for k, dstage in enumerate(dec_stages):
                m0, m1 = k * layers / pp_d, (k + 1) * layers / pp_d
                lo = _overlap(l0, l1, m0, m1) / layers
                if lo == 0:
                    continue
                tp_d = len(dstage)
                for q, dst in enumerate(dstage):
                    ho = _overlap(h0, h1, q / tp_d, (q + 1) / tp_d)
                    if ho > 0:
                        out.append((src, dst, lo * ho))
    return out


def kv_route(fabric: Fabric, src: str, dst: str, nbytes: float) -> Path:
    """The route of one KV share of ``nbytes`` bytes from prefill GPU ``src`` to decode GPU
    ``dst``: NVLink inside a server, otherwise NCCL's rail routes (``rail_routes``), the
    cheapest alone (Eq. 10 for one flow). The planner and the simulator both take it from here.
    O(routes * hops)."""
    nv = fabric.nvlink_path(src, dst)
    if nv is not None:
        return nv
    return min(rail_routes(fabric, src, dst), key=lambda p: path_time(fabric, p, nbytes))
