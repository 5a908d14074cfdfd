"""The ``heroserve`` command. Bad input prints one line naming the problem and exits 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from controller.errors import InputError

COMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {}


def _positive(kind: type):
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a {kind.__name__}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {s}")
        return v

    return parse


def _parallelism(s: str) -> tuple[int, int]:
    try:
        tp, pp = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not TPxPP, e.g. 4x2") from None
    if tp < 1 or pp < 1:
        raise argparse.ArgumentTypeError(f"TP and PP must be positive in {s!r}")
    return tp, pp


# -- plan ------------------------------------------------------------------------------------
def _plan_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--sla-ttft", type=_positive(float), default=None, help="TTFT bound, s")
    p.add_argument("--sla-tpot", type=_positive(float), default=None, help="TPOT bound, s")
    p.add_argument(
        "--planner",
        default="all",
        help="heroserve | distserve | ds-atp | ds-switchml | exhaustive | all "
        "(heroserve and the three baselines) | the seed papers' helix | costeff | "
        "hetero-search (and Helix's baselines swarm | helix-sp | helix-petals)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-candi",
        type=_positive(int),
        default=20,
        help="candidate (TP, PP) pairs per phase (Alg. 1)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="write the plan (heroserve's, or the one "
        "planner's) here; with --planner all each baseline goes to PATH.<planner>.json",
    )
    p.add_argument(
        "--prefill-par",
        type=_parallelism,
        metavar="TPxPP",
        help="force the prefill parallelism, e.g. 4x1",
    )
    p.add_argument(
        "--decode-par",
        type=_parallelism,
        metavar="TPxPP",
        help="force the decode parallelism, e.g. 8x1",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--verbose", action="store_true", help="progress lines on stderr even for small clusters"
    )
    from controller.related.cli import add_related_args  # the seed planners' options

    add_related_args(p)


def default_model(topology: str) -> str:
    return "OPT-175B" if topology in ("2tracks", "8tracks") else "OPT-66B"


def run_plan(a: argparse.Namespace) -> int:
    from controller.models import model_spec
    from controller.planner import BASELINES, PLANNERS, PlannerOptions, plan
    from controller.related import HELIX_BASELINES, RELATED
    from controller.report import comparison_table, groups_table
    from controller.topology import resolve_topology
    from controller.workload import SLA, default_sla, resolve_workload

    if a.planner in RELATED + HELIX_BASELINES:  # colocated plans (docs/related-planners.md)
        from controller.related.cli import run_related_plan

        return run_related_plan(a)
    names = ["heroserve", *BASELINES] if a.planner == "all" else [a.planner]
    for n in names:
        if n not in PLANNERS:
            raise InputError(f"unknown planner {n!r}; known: {', '.join(PLANNERS)}, all")
    t0 = time.perf_counter()
    g = resolve_topology(a.topology)
    model = model_spec(a.model or default_model(a.topology))
    workload = resolve_workload(a.workload, seed=a.seed)
    scale = "large" if a.topology in ("2tracks", "8tracks") else "testbed"
    base = default_sla(
        workload.name if workload.name in ("chatbot", "summarization") else "chatbot", scale
    )
    sla = SLA(a.sla_ttft or base.ttft_s, a.sla_tpot or base.tpot_s)
    n_gpus = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    verbose = not a.quiet and (a.verbose or n_gpus > 64)  # small clusters plan in a blink

    def progress(msg: str) -> None:
        if verbose:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    progress(
        f"cluster {g.name}: {n_gpus} GPUs, {g.number_of_nodes()} nodes, {g.number_of_edges()} links"
    )
    opts = PlannerOptions(
        seed=a.seed, max_candi=a.max_candi, prefill_par=a.prefill_par, decode_par=a.decode_par
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
    head = names[0]
    print(
        f"HeroServe offline plan: topology {g.name} ({n_gpus} GPUs), model {model.name}, "
        f"workload {workload.name}, SLA TTFT {sla.ttft_s} s / TPOT {sla.tpot_s} s "
        f"({sla.attainment:.0%})\n"
    )
    print(comparison_table(plans, reference=head))
    for n, why in failed.items():
        print(f"{n}: no plan ({why})")
    print(f"\nGroups of the {head} plan (scheme per group and why):\n")
    print(groups_table(plans[head]))
    if a.json:
        path = Path(a.json)
        plans[head].save(path)
        for n in names[1:]:
            plans[n].save(path.with_name(f"{path.stem}.{n}.json"))
        print(f"\nplan written to {path}")
    progress(f"done in {time.perf_counter() - t0:.1f}s")
    return 0


COMMANDS["plan"] = (
    "plan a disaggregated deployment and compare it with the baselines",
    _plan_args,
    run_plan,
)


# -- topology --------------------------------------------------------------------------------
def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["validate", "export"])
    p.add_argument("source", help="a built-in name or a topology file")


def run_topology(a: argparse.Namespace) -> int:
    from controller.topology import resolve_topology, topology_to_dict

    g = resolve_topology(a.source)
    if a.action == "validate":
        n = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
        print(
            f"{a.source}: valid ({n} GPUs, {g.number_of_nodes()} nodes, "
            f"{g.number_of_edges()} links)"
        )
    else:
        json.dump(topology_to_dict(g), sys.stdout, indent=1)
        print()
    return 0


COMMANDS["topology"] = (
    "validate a topology file or export a built-in one",
    _topology_args,
    run_topology,
)


def _controller(argv: list[str]) -> int:
    from controller.service import main as controller_main

    return controller_main(argv)


def _softswitch(argv: list[str]) -> int:
    from agents.softswitch import main as softswitch_main

    return softswitch_main(argv)


def _simulate(argv: list[str]) -> int:
    from controller.sim.cli import main as simulate_main

    return simulate_main(argv)


def _evaluate(argv: list[str]) -> int:
    from controller.evaluation.cli import main as evaluate_main

    return evaluate_main(argv)


def _compare(argv: list[str]) -> int:
    from controller.related.cli import main_compare

    return main_compare(argv)


# Commands whose own parser takes every argument after the command name.
PASSTHROUGH: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "controller": ("run the controller: gRPC service for switch and GPU agents", _controller),
    "softswitch": ("run the executable model of the P4 INA switch (P4Runtime server)", _softswitch),
    "simulate": (
        "simulate a plan: SLA attainment, TTFT/TPOT, INA throughput, KV memory",
        _simulate,
    ),
    "evaluate": ("reproduce the paper's evaluation (Fig. 7-10) on a scenario", _evaluate),
    "compare": ("every planner, the seed papers' too, side by side on one cluster", _compare),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heroserve",
        description="HeroServe: network control plane for disaggregated LLM serving",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help_, description=help_))
    for name, (help_, _) in PASSTHROUGH.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]][1](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except InputError as e:
        print(f"heroserve: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head and the like
        return 0
    except KeyboardInterrupt:
        print("heroserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
