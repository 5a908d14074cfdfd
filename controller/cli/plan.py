"""``heroserve plan``: plan a disaggregated deployment with HeroServe and its baselines and
print them side by side (or one planner's plan, the seed papers' planners too).

Bad input prints one line naming the problem and exits 2 (``controller/cli/__init__.py``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from controller.cli.common import resolve_inputs
from controller.cli.related import add_related_args, run_related_plan
from controller.errors import InputError
from controller.inputs.args import bounded, output_file, parallelism, seed, write_text
from controller.inputs.limits import MAX_CANDIDATES, MAX_SLA_S

HELP = "plan a disaggregated deployment and compare it with the baselines"


def add_args(p: argparse.ArgumentParser) -> None:
    from controller.costmodel.netparams import DEFAULT_INA_LANES, INA_LANES
    from controller.planner.options import DEFAULT_TIME_LIMIT_S
    from controller.topology.fabric import PIPELINED

    p.add_argument(
        "--topology",
        default="testbed",
        help="testbed | 2tracks | 8tracks | fig2 | a .yaml/.json topology file",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model name (default: OPT-66B on the testbed, OPT-175B on the track clusters)",
    )
    p.add_argument(
        "--workload", default="chatbot", help="chatbot | summarization | a .csv/.json trace file"
    )
    sla_s = bounded(float, 0, MAX_SLA_S, low_open=True)
    p.add_argument("--sla-ttft", type=sla_s, default=None, help="TTFT bound, s")
    p.add_argument("--sla-tpot", type=sla_s, default=None, help="TPOT bound, s")
    p.add_argument(
        "--planner",
        default="all",
        help="heroserve | distserve | ds-atp | ds-switchml | exhaustive | all "
        "(heroserve and the three baselines) | the seed papers' helix | costeff | "
        "hetero-search (and Helix's baselines swarm | helix-sp | helix-petals)",
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--max-candi",
        type=bounded(int, 1, MAX_CANDIDATES),
        default=20,
        help="candidate (TP, PP) pairs per phase (Alg. 1)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        type=output_file,
        help="write the plan (heroserve's, or the one "
        "planner's) here; with --planner all each baseline goes to PATH.<planner>.json",
    )
    p.add_argument(
        "--prefill-par",
        type=parallelism,
        metavar="TPxPP",
        help="force the prefill parallelism, e.g. 4x1",
    )
    p.add_argument(
        "--decode-par",
        type=parallelism,
        metavar="TPxPP",
        help="force the decode parallelism, e.g. 8x1",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        help="plan only what this serving engine runs (its TP/PP rules and placement, "
        "docs/export.md); default: an engine-neutral plan",
    )
    p.add_argument(
        "--gpus",
        type=bounded(int, 0, low_open=True),
        metavar="N",
        help="plan for at most N GPUs of the cluster (default: all of them)",
    )
    p.add_argument(
        "--ina-lanes",
        default=DEFAULT_INA_LANES,
        help="INA lane format on the wire: "
        + ", ".join(INA_LANES)
        + f" (default {DEFAULT_INA_LANES}, what p4/heroserve_ina.p4 aggregates)",
    )
    p.add_argument(
        "--cost-mode",
        default=PIPELINED,
        help="network pricing: pipelined (packet by packet, the default) or paper (the "
        "paper's store-and-forward sums, as in its Fig. 2); docs/costmodel.md",
    )
    p.add_argument(
        "--tpot-mode",
        default="amortized",
        help="amortized: the KV transfer paid once per request, spread over its output tokens "
        "(DistServe's TPOT, the default); eq4: added to every token, as Eq. 4 is written",
    )
    p.add_argument(
        "--planner-time-limit",
        type=bounded(float, 0, 86400, low_open=True),
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="CPU-time limit of each planner's search, s: hitting it returns the best plan "
        f"found, marked 'time limit reached' (default {DEFAULT_TIME_LIMIT_S:g})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="progress line on stderr even for small clusters (shown above 64 GPUs)",
    )
    add_related_args(p)


def run(a: argparse.Namespace) -> int:
    from controller.cli.progress import ProgressLine
    from controller.cli.report import comparison_table, groups_table, idle_lines
    from controller.costmodel.netparams import NetParams
    from controller.planner import BASELINES, PLANNERS, PlannerOptions, plan
    from controller.related import HELIX_BASELINES, RELATED
    from controller.topology import resolve_topology

    if a.planner in RELATED + HELIX_BASELINES:  # colocated plans (docs/related-planners.md)
        return run_related_plan(a)
    names = ["heroserve", *BASELINES] if a.planner == "all" else [a.planner]
    for n in names:
        if n not in PLANNERS:
            raise InputError(f"unknown planner {n!r}; known: {', '.join(PLANNERS)}, all")
    t0 = time.perf_counter()
    g, model, workload, sla = resolve_inputs(a, resolve_topology)
    n_gpus = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    verbose = not a.quiet and (a.verbose or n_gpus > 64)  # small clusters plan in a blink
    line = ProgressLine() if verbose else None

    def progress(msg: str) -> None:
        if line is not None:
            line(msg)

    progress(
        f"cluster {g.name}: {n_gpus} GPUs, {g.number_of_nodes()} nodes, {g.number_of_edges()} links"
    )
    if a.tpot_mode not in ("amortized", "eq4"):
        raise InputError(f"--tpot-mode must be amortized or eq4, got {a.tpot_mode!r}")
    try:
        net = NetParams(cost_mode=a.cost_mode, ina_lanes=a.ina_lanes)
    except InputError as e:
        flag = "--ina-lanes" if "lanes" in str(e) else "--cost-mode"
        raise InputError(f"{flag}: {e}") from None
    opts = PlannerOptions(
        seed=a.seed,
        max_candi=a.max_candi,
        prefill_par=a.prefill_par,
        decode_par=a.decode_par,
        max_gpus=a.gpus,
        tpot_mode=a.tpot_mode,
        net=net,
        engine=a.engine,
        time_limit_s=a.planner_time_limit,
    )
    plans = {}
    failed: dict[str, str] = {}
    for n in names:
        progress(f"planning with {n}")
        try:
            plans[n] = plan(g, model, workload, sla, opts, planner=n, progress=progress)
        except InputError as e:
            if n == names[0]:
                raise
            failed[n] = str(e)  # a baseline with no feasible plan is a result, not an error
    if line is not None:
        line.close()
    head = names[0]
    print(
        f"HeroServe offline plan: topology {g.name} ({n_gpus} GPUs), model {model.name}, "
        f"workload {workload.name}, SLA TTFT {sla.ttft_s} s / TPOT {sla.tpot_s} s "
        f"({sla.attainment:.0%})\n"
    )
    print(comparison_table(plans, reference=head))
    idle = idle_lines(plans)
    if idle:
        print(f"\nGPUs left idle (docs/planner.md):\n{idle}")
    for n, why in failed.items():
        print(f"{n}: no plan ({why})")
    print(f"\nGroups of the {head} plan (scheme per group and why):\n")
    print(groups_table(plans[head]))
    if a.json:
        path = Path(a.json)
        write_text(path, plans[head].to_json() + "\n", "--json")
        for n in names[1:]:
            if n in plans:
                write_text(
                    path.with_name(f"{path.stem}.{n}.json"), plans[n].to_json() + "\n", "--json"
                )
        print(f"\nplan written to {path}")
    if verbose:
        print(f"planned in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
