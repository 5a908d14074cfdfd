"""DistServe's low node-affinity layouts (DistServe, OSDI'24, §4.3, its Algorithm 2), priced
by any evaluator.

Each instance is cut into ``P`` pipeline stages over ``P`` nodes of one GPU type. On every
node, stage ``s`` of a prefill instance (``TP_p`` GPUs) and stage ``s`` of a decode instance
(``TP_d`` GPUs, ``TP_p + TP_d`` at most the node's GPUs) sit side by side, so the KV cache of
each stage moves over NVLink; tensor parallelism stays inside a node, only pipeline hops cross
nodes. ``colocated_search`` enumerates ``(P, TP_p, TP_d)`` (``unit_candidates``), prices each
with the evaluator it is given and replicates the best unit over every group of ``P`` nodes
of a type.

Its own module because two planners use it: the ``distserve-paper`` baseline
(``distserve_paper``, ring only, as DistServe runs) and HeroServe's search (``search``),
which prices the same layouts with its schemes and routes so that its candidates contain
that baseline's too. Both keep to a forced parallelism and to the plan's engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.models.engines import pair_problem, parallelism_problem
from controller.planner.bounds import capacity_bound
from controller.planner.candidates import valid_tp
from controller.planner.combine import Combination, combine
from controller.planner.deployment import SearchResult, settle_kv
from controller.planner.evaluate import Evaluator
from controller.planner.options import Problem, TimeLimitReached
from controller.planner.ttft import checked_ttft
from controller.topology.graph import servers
from controller.units import GB


def _nodes_by_type(problem: Problem) -> dict[str, list[list[str]]]:
    """Per GPU type, its servers' GPUs (index order) that may hold both roles, server order."""
    g = problem.cluster
    out: dict[str, list[list[str]]] = {}
    for _, members in sorted(servers(g).items()):
        free = [x for x in members if g.nodes[x].get("role", "any") == "any"]
        types = {g.nodes[x]["gpu_type"] for x in free}
        if free and len(types) == 1:
            out.setdefault(types.pop(), []).append(free)
    return out


def unit_candidates(
    problem: Problem, node_gpus: int, nodes: int, memory_gb: float
) -> list[tuple[int, int, int]]:
    """(P, TP_p, TP_d): P dividing the layers with P nodes available, TP_p + TP_d at most the
    node's GPUs, each a power of two splitting the heads (as ``tp_pp_candidates``) whose
    1 / (TP * P) weight shard fits."""
    model, r = problem.model, problem.options.r_frac
    out = []
    for pp in range(1, nodes + 1):
        if model.layers % pp:
            continue
        powers = [1 << k for k in range(node_gpus.bit_length()) if 1 << k < node_gpus]
        for tp_p in powers:
            for tp_d in (t for t in powers if tp_p + t <= node_gpus):
                if not (valid_tp(model, tp_p) and valid_tp(model, tp_d)):
                    continue
                shard = model.param_bytes / (min(tp_p, tp_d) * pp)
                if shard <= memory_gb * GB * r:
                    out.append((pp, tp_p, tp_d))
    return out


def _layout(
    nodes: Sequence[list[str]], pp: int, tp_p: int, tp_d: int
) -> tuple[list[list[list[str]]], list[list[list[str]]]]:
    """Prefill and decode instances of every unit of ``pp`` consecutive nodes: on each node
    the first ``tp_p`` GPUs hold the prefill stage and the next ``tp_d`` the decode stage."""
    pre, dec = [], []
    for u in range(len(nodes) // pp):
        unit = nodes[u * pp : (u + 1) * pp]
        pre.append([list(n[:tp_p]) for n in unit])
        dec.append([list(n[tp_p : tp_p + tp_d]) for n in unit])
    return pre, dec


def _allowed(problem: Problem, pp: int, tp_p: int, tp_d: int) -> bool:
    """A unit the options allow: the forced parallelism of each role, and what the plan's
    engine runs (its stage placement is checked with the instances, ``Evaluator``)."""
    opts, engine = problem.options, problem.engine
    if opts.prefill_par not in (None, (tp_p, pp)) or opts.decode_par not in (None, (tp_d, pp)):
        return False
    if engine is None:
        return True
    return (
        parallelism_problem(engine, "prefill", tp_p, pp) is None
        and parallelism_problem(engine, "decode", tp_d, pp) is None
        and pair_problem(engine, tp_p, tp_d) is None
    )


def colocated_search(ev: Evaluator) -> SearchResult | None:
    """The best DistServe low-affinity layout priced by ``ev`` (module docstring), by the H
    its plan states (``ttft.checked_ttft``), or None when no unit fits. Units of one type;
    the type whose layout gives the most H is kept (mixing types would put different units'
    rates in one deployment, which ``combine`` handles, but DistServe replicates one
    configuration)."""
    problem = ev.problem
    best: SearchResult | None = None
    stated: Combination | None = None  # ``best``'s combination as its plan states it
    tried = 0
    stopped = False  # by the time limit, inside a settlement
    g = problem.cluster
    for gpu_type, nodes in sorted(_nodes_by_type(problem).items()):
        if stopped:
            break
        size = min(len(n) for n in nodes)
        mem = min(g.nodes[x]["memory_gb"] for n in nodes for x in n)
        units = unit_candidates(problem, size, len(nodes), mem)
        for k, (pp, tp_p, tp_d) in enumerate(units, 1):
            # counted, so that a long search's progress can say what is left (cli/progress.py)
            problem.say(f"low-affinity unit {k}/{len(units)} ({gpu_type}): PP={pp}, "
                        f"TP {tp_p} prefill + {tp_d} decode")  # fmt: skip
            if not _allowed(problem, pp, tp_p, tp_d):
                continue
            pre_stages, dec_stages = _layout(nodes, pp, tp_p, tp_d)
            if not pre_stages:
                continue
            bound = min(
                capacity_bound(
                    ev, "prefill", [x for i in pre_stages for s in i for x in s], tp_p, pp
                ),
                capacity_bound(
                    ev, "decode", [x for i in dec_stages for s in i for x in s], tp_d, pp
                ),
            )
            if stated is not None and bound <= stated.rate * (1 + 1e-9):
                continue  # cannot beat the best layout found (compute alone bounds it)
            if problem.out_of_time(best is not None):
                break
            tried += 1
            pre = ev.phase_result("prefill", tp_p, pp, [ev.prefill_instance(s) for s in pre_stages])
            dec = ev.phase_result(
                "decode", tp_d, pp, [ev.decode_instance(s, 0.0) for s in dec_stages]
            )
            comb0 = combine(pre, dec, problem.sla.ttft_s, problem.options.max_gpus)
            if comb0 is None:
                continue
            try:
                settled = settle_kv(
                    ev,
                    pre,
                    dec,
                    lambda t_f, dec=dec: ev.reevaluate(dec, t_f),
                    comb0,
                    kv_contention=True,
                )
            except TimeLimitReached:  # the search's plan is in hand: keep the best layout
                stopped = True
                break
            if settled is None:
                continue
            comb = settled.combination
            if not comb.better_than(stated):
                continue  # the check below only lowers H
            # ranked by the H the plan will state: the engines' admission (``checked_ttft``)
            # lowers deep pipelines most, and ranked by the closed form the search kept a
            # layout the check then cut 3.4x (2tracks-1200 chatbot in the paper's cost mode:
            # PP 24 priced 1,732 req/s, checked 502; PP 48 checked 666). The result keeps
            # the closed form's combination: the plan checks it again and says what it lowered
            checked = checked_ttft(ev, pre, comb)
            if checked.better_than(stated):
                best = SearchResult(
                    ev, pre, settled.decode, comb, settled.t_f, settled.kv_flows, tried
                )
                stated = checked
    if best is not None:
        best.candidates_tried = tried
    return best
