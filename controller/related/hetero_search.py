"""The ``hetero-search`` planner (``003_...``): per machine, the tensor-parallel degree that
maximises Alg. 1's estimated throughput under the memory constraint (Eq. 2), every instance
inside one machine; served with the paper's request mapper (or round-robin, weighted
round-robin, memory-based or single-instance mapping, its comparisons).

The search is the paper's exhaustive one over every machine's TP choices. Alg. 1's system
throughput is a sum over instances and a machine's instances depend only on its own choice,
so the product of choices is maximised by each machine's best choice: the search walks each
machine's degrees instead of their product, with the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx
import numpy as np

from controller.errors import InputError
from controller.models.specs import ModelSpec
from controller.plan import ColocatedNode, ColocatedPlan, Plan, Predicted, Replica
from controller.related.common import RelatedOptions, colocated_plan, stats_of
from controller.related.hetero_model import (
    ENGINE_MEMORY_FRACTION,
    STATIC_BYTES_PER_GPU,
    InstanceModel,
    instance_model,
    instance_throughput,
)
from controller.related.perf import NodeHW, PerfModel, node_hw
from controller.topology.graph import servers
from controller.workload.base import Workload
from controller.workload.sla import SLA

MAPPERS = ("os", "rr", "wrr", "mb", "si")
ALG1_SAMPLE = 200  # the paper samples 200 requests for Alg. 1
OBJECTIVE = (
    "estimated tokens/s of the whole cluster (Alg. 1, no latency SLA), one instance per TP "
    "group inside a machine, prefill and decode on the same GPUs"
)


def tp_degrees(n_gpus: int, model: ModelSpec) -> list[int]:
    """TP degrees a machine of ``n_gpus`` can split into equal instances: divisors of the GPU
    count that also divide the model's attention and KV heads."""
    return [
        t
        for t in range(1, n_gpus + 1)
        if n_gpus % t == 0 and model.heads % t == 0 and model.kv_heads % t == 0
    ]


def _sample(workload: Workload, n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(workload.inputs), min(n, len(workload.inputs)), replace=False)
    return [int(x) for x in workload.inputs[idx]], [int(x) for x in workload.outputs[idx]]


def search(
    g: nx.Graph, model: ModelSpec, workload: Workload, opts: RelatedOptions
) -> tuple[list[tuple[NodeHW, InstanceModel, float]], list[str]]:
    """The best configuration: (instance, its model, its Alg. 1 tokens/s) for every instance,
    and notes on the machines left out."""
    perf = PerfModel(g, model, r_frac=opts.r_frac, max_batch=opts.max_batch)
    ins, outs = _sample(workload, ALG1_SAMPLE, opts.seed)
    need = (max(ins) + max(outs)) * perf.kv_bytes_per_token(model.layers)
    chosen: list[tuple[NodeHW, InstanceModel, float]] = []
    notes = []
    for server, gpus in sorted(servers(g).items()):
        best = None
        for t in tp_degrees(len(gpus), model):
            insts = [node_hw(g, gpus[k : k + t]) for k in range(0, len(gpus), t)]
            models = [instance_model(perf, hw) for hw in insts]
            if any(im.kv_bytes < need for im in models):  # Eq. 2
                continue
            thr = [instance_throughput(im, ins, outs) for im in models]
            if best is None or sum(thr) > best[0]:
                best = (sum(thr), list(zip(insts, models, thr, strict=True)))
        if best is None:
            notes.append(f"machine {server} cannot hold {model.name} with one longest request")
            continue
        chosen += best[1]
    if not chosen:
        raise InputError(
            f"no machine of {g.name} holds {model.name} with room for one longest request "
            f"(the paper deploys every instance inside one machine); try a smaller --model"
        )
    return chosen, notes


def plan_instances(
    planner: str,
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    opts: RelatedOptions,
    instances: Sequence[Sequence[str]],
    notes: Sequence[str] = (),
) -> Plan:
    """A plan serving one instance per GPU group in ``instances`` with ``opts.mapper`` (also
    the two-instance set-up of the paper's §5.2, where the groups are given)."""
    if opts.mapper not in MAPPERS:
        raise InputError(f"unknown mapper {opts.mapper!r}; known: {', '.join(MAPPERS)}")
    perf = PerfModel(g, model, r_frac=opts.r_frac, max_batch=opts.max_batch)
    stats = stats_of(workload, opts.sample, opts.seed)
    ins, outs = _sample(workload, ALG1_SAMPLE, opts.seed)
    rows = []
    for gpus in instances:
        hw = node_hw(g, gpus)
        im = instance_model(perf, hw)
        if im.kv_bytes <= 0:
            raise InputError(f"instance {','.join(gpus)} cannot hold {model.name}")
        rows.append((hw, im, instance_throughput(im, ins, outs)))
    rows.sort(key=lambda r: -r[2])  # the strongest first (the single-instance mapper's)
    nodes, replicas = [], []
    for k, (hw, _, thr) in enumerate(rows):
        name = f"inst{k}"
        nodes.append(ColocatedNode(name, list(hw.gpus), 0, model.layers, thr))
        replicas.append(Replica([name], thr / stats.tokens))
    total = sum(r[2] for r in rows)
    col = ColocatedPlan(
        scheduler=opts.mapper,
        nodes=nodes,
        replicas=replicas,
        tokens_per_s=total,
        objective=OBJECTIVE,
        params={
            "r_frac": opts.r_frac,
            "max_batch": opts.max_batch,
            "engine_memory_fraction": ENGINE_MEMORY_FRACTION,
            "static_bytes_per_gpu": STATIC_BYTES_PER_GPU,
            "mapper_k": opts.mapper_k,
            "out_mean": float(np.mean(workload.outputs)),
            "out_std": float(np.std(workload.outputs)),
            "instances": [r[1].to_params() for r in rows],
            "weights": [float(r[0].tp) for r in rows],  # WRR by GPUs, as the paper sets 4:1
        },
    )
    im0 = rows[0][1]
    b = im0.ideal_batch(stats.mean_in, stats.mean_out)
    ttft = im0.prefill_s(1, stats.mean_in)
    tpot = im0.decode_s(b, stats.mean_in, stats.mean_out) / max(stats.mean_out, 1.0)
    gpus = sum(r[0].tp for r in rows)
    rate = total / stats.tokens
    pred = Predicted(ttft, tpot, 0.0, rate, rate / gpus, gpus)
    all_notes = [
        f"{len(rows)} instances, TP {'/'.join(str(r[0].tp) for r in rows)}, Alg. 1 estimate "
        f"{total:.0f} tokens/s; requests mapped by {opts.mapper}",
        "serves without disaggregation: every instance runs prefill and decode (vLLM)",
        *notes,
    ]
    return colocated_plan(planner, g, model, workload, sla, col, pred, all_notes)


def plan_hetero(
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    opts: RelatedOptions,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    chosen, notes = search(g, model, workload, opts)
    if progress:
        progress(f"hetero-search: {len(chosen)} instances")
    return plan_instances(
        "hetero-search", g, model, workload, sla, opts, [list(hw.gpus) for hw, _, _ in chosen],
        notes,
    )  # fmt: skip
