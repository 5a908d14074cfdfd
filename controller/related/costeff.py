"""The ``costeff`` planner (``002_...``): which GPUs to rent under a budget and the cluster's
availability, how to group them into replicas, and which workload class goes where, by
minimising the makespan of a sample of the workload (the MILP or its binary search,
``costeff_milp``). Serves without disaggregation: every replica runs prefill and decode.

On a given cluster the available GPUs a_n are the cluster's; the budget defaults to what
renting every priced GPU would cost, so the planner then chooses the best replicas among all
of them. The activated copies are placed on machines (each stage a TP group inside one
machine; the largest stages first, each on the machine with the fewest free GPUs that holds
it) and become the plan's replicas, each with its share of every workload class.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import networkx as nx
import numpy as np

from controller.errors import InputError
from controller.models.specs import ModelSpec
from controller.plan import ColocatedNode, ColocatedPlan, Plan, Predicted, Replica
from controller.related.common import RelatedOptions, colocated_plan
from controller.related.costeff_configs import (
    LONG_INPUT,
    LONG_OUTPUT,
    PRICES,
    Config,
    classes_of,
    enumerate_configs,
)
from controller.related.costeff_milp import CostProblem, CostSolution, solve_binary, solve_milp
from controller.related.perf import PerfModel
from controller.topology.graph import servers
from controller.workload.base import Workload
from controller.workload.sla import SLA

OBJECTIVE = (
    "least makespan of the workload mix (throughput) within a $/h budget and the available "
    "GPUs, choosing which GPUs to rent; prefill and decode on the same GPUs"
)


def _place(g: nx.Graph, configs: list[Config], sol: CostSolution) -> list[list[list[str]]]:
    """GPU ids for every stage of every activated copy: [copy][stage] -> GPUs."""
    free = {
        s: list(gpus)
        for s, gpus in servers(g).items()
        if len({g.nodes[x]["gpu_type"] for x in gpus}) == 1
    }
    copies = [(c, k) for c, y in enumerate(sol.copies) for k in range(y)]
    wants = [(st.tp, st.gpu_type, j, s) for j, (c, _) in enumerate(copies)
             for s, st in enumerate(configs[c].stages)]  # fmt: skip
    out: list[list[list[str]]] = [[[] for _ in configs[c].stages] for c, _ in copies]
    for tp, kind, j, s in sorted(wants, key=lambda w: (-w[0], w[2], w[3])):
        fits = [
            srv for srv, gs in free.items()
            if len(gs) >= tp and g.nodes[gs[0]]["gpu_type"] == kind
        ]  # fmt: skip
        if not fits:
            raise InputError(f"cannot place a {kind} x{tp} stage: machines too fragmented")
        srv = min(fits, key=lambda x: (len(free[x]), x))
        out[j][s] = free[srv][:tp]
        free[srv] = free[srv][tp:]
    return out


def plan_costeff(
    g: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    opts: RelatedOptions,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    t0 = time.process_time()
    perf = PerfModel(g, model, r_frac=opts.r_frac, max_batch=opts.max_batch)
    rng = np.random.default_rng(opts.seed)
    n = len(workload.inputs)
    idx = rng.choice(n, min(n, opts.sample), replace=False)
    classes = classes_of(workload.inputs[idx], workload.outputs[idx])
    prices = {**PRICES, **opts.prices}
    configs, avail = enumerate_configs(g, perf, classes, prices, opts.max_stages)
    if not configs:
        unpriced = sorted(t for t in avail if t not in prices)
        why = f" (no price for {', '.join(unpriced)}: pass --price TYPE=USD)" if unpriced else ""
        raise InputError(
            f"no configuration of {g.name}'s GPUs holds {model.name} with one longest request{why}"
        )
    types = sorted(avail)
    full = sum(avail[t] * prices[t] for t in types if t in prices)
    budget = opts.budget if opts.budget is not None else full
    problem = CostProblem(
        classes=list(classes),
        demand=[float(s.count) for s in classes.values()],
        configs=[c.name() for c in configs],
        rate=[[c.rate[w] for w in classes] for c in configs],
        price=[c.price for c in configs],
        types=types,
        gpus=[[c.gpus.get(t, 0) for t in types] for c in configs],
        avail=[avail[t] for t in types],
        budget=budget,
    )
    if progress:
        progress(f"costeff: {len(configs)} configurations, {len(classes)} workload classes")
    solve = solve_milp if opts.costeff_method == "milp" else solve_binary
    limit = opts.time_limit_s
    if opts.planner_time_limit_s is not None:  # what is left of the planner's own limit
        limit = min(limit, max(0.01, opts.planner_time_limit_s - (time.process_time() - t0)))
    sol = solve(problem, limit)
    stages = _place(g, configs, sol)
    nodes, replicas = [], []
    j = 0
    for c, copies in enumerate(sol.assign):
        cfg = configs[c]
        for share in copies:
            names, start = [], 0
            for s, gpus in enumerate(stages[j]):
                name = f"r{j}s{s}"
                end = start + cfg.layers[s]
                nodes.append(ColocatedNode(name, gpus, start, end, 0.0))
                names.append(name)
                start = end
            reqs = sum(share[w] * problem.demand[w] for w in range(len(classes)))
            replicas.append(
                Replica(
                    names,
                    reqs / sol.makespan if sol.makespan > 0 else 0.0,
                    {w: float(share[i]) for i, w in enumerate(classes)},
                )
            )
            j += 1
    total = float(sum(problem.demand))
    rate = total / sol.makespan if sol.makespan > 0 else 0.0
    gpus = sum(len(x.gpus) for x in nodes)
    col = ColocatedPlan(
        scheduler="assignment",
        nodes=nodes,
        replicas=replicas,
        objective=OBJECTIVE,
        solver={
            "solver": "SciPy milp (HiGHS)",
            "method": sol.method,
            "status": sol.status,
            "makespan_s": sol.makespan,
            "bound_s": sol.bound,
            "time_s": sol.time_s,
            "time_limit_s": limit,
            "configurations": len(configs),
            "binary_search_steps": len(sol.steps),
        },
        params={
            "r_frac": opts.r_frac,
            "max_batch": opts.max_batch,
            "classes": {
                w: {"requests": s.count, "mean_in": s.mean_in, "mean_out": s.mean_out}
                for w, s in classes.items()
            },  # fmt: skip
            "long_input": LONG_INPUT,
            "long_output": LONG_OUTPUT,
            "budget_per_h": budget,
            "cost_per_h": sol.cost,
            "prices_per_h": {t: prices[t] for t in types if t in prices},
        },
    )
    col.tokens_per_s = rate * float(np.mean(workload.inputs[idx] + workload.outputs[idx]))
    notes = [
        f"cost efficiency ({sol.method}, {sol.status}): makespan {sol.makespan:.2f} s for "
        f"{total:.0f} sampled requests, bound {sol.bound:.2f} s, {sol.time_s:.2f} s to solve; "
        f"rents {gpus} GPUs for {sol.cost:.2f} $/h of a {budget:.2f} $/h budget",
        "serves without disaggregation: every replica runs prefill and decode (vLLM)",
    ]
    if sol.status == "time-limit":
        notes.append(
            f"the solver hit its {limit:g} s time limit: this is the best plan "
            "found, not a proven optimum"
        )
    unpriced = sorted(t for t in avail if t not in prices)
    if unpriced:
        notes.append(f"GPU types without a price are not rented: {', '.join(unpriced)}")
    ttft = tpot = 0.0
    if replicas:
        from controller.related.common import pipeline_latency
        from controller.related.perf import LengthStats, node_hw

        st = LengthStats.of(workload.inputs[idx], workload.outputs[idx])
        by = {x.name: x for x in nodes}
        best = max(replicas, key=lambda r: r.rate)
        ttft, tpot = pipeline_latency(
            perf, [(node_hw(g, by[x].gpus), by[x].end - by[x].start) for x in best.nodes], st
        )
    pred = Predicted(ttft, tpot, 0.0, rate, rate / gpus if gpus else 0.0, gpus)
    plan = colocated_plan(
        "costeff",
        g,
        model,
        workload,
        sla,
        col,
        pred,
        notes,
        f"not rented: the MILP ({sol.status}) finishes the sampled requests' makespan on the "
        f"copies it activates, within the {budget:.2f} $/h budget",
    )
    plan.time_limit_reached = sol.status == "time-limit"
    return plan
