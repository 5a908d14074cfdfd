"""KV-cache transfer from prefill to decode (paper Eqs. 14-15, DESIGN.md §5).

A prefill GPU holds the KV cache of its stage's layers and its tensor shard of the KV heads;
it goes to the decode GPUs that hold overlapping layers and shards (when prefill and decode
TP/PP differ, shards map by overlap). Each prefill GPU sends its transfers one after the
other (Eq. 15 sums them); all prefill GPUs send at once, so flows share links; T_f is the
slowest prefill GPU (Eq. 14)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from controller.costmodel.network import choose_routes, flow_times
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


def kv_transfer(
    fabric: Fabric,
    model: ModelSpec,
    tokens: float,
    pairs: Sequence[tuple[Sequence[Sequence[str]], Sequence[Sequence[str]]]],
) -> tuple[float, list[KVFlow]]:
    """T_f (Eq. 14) for one request of ``tokens`` input tokens moving from each prefill
    instance to its paired decode instance (``pairs`` of (prefill stages, decode stages)),
    all pairs at once. Returns T_f and the flows with their routes and times."""
    total = tokens * model.kv_bytes_per_token()
    specs = [(s, d, f * total) for pre, dec in pairs for s, d, f in kv_shares(model, pre, dec)]
    if not specs:
        return 0.0, []
    options = [fabric.routes_between(s, d) for s, d, _ in specs]
    routes = [opts[0] if len(opts) == 1 else None for opts in options]
    # choose routes for the network flows with everything else as background
    net = [i for i, r in enumerate(routes) if r is None]
    if net:
        chosen, _ = choose_routes(
            fabric, [options[i] for i in net], [specs[i][2] for i in net], sweeps=1
        )
        for i, r in zip(net, chosen, strict=True):
            routes[i] = r
    flows = [(r, s[2]) for r, s in zip(routes, specs, strict=True)]
    times = flow_times(fabric, flows)  # type: ignore[arg-type]
    per_src: dict[str, float] = defaultdict(float)
    out = []
    for (src, dst, nb), r, t in zip(specs, routes, times, strict=True):
        per_src[src] += t  # Eq. 15: one prefill GPU's transfers go one after the other
        out.append(KVFlow(src, dst, nb, r, t))  # type: ignore[arg-type]
    return max(per_src.values()), out
