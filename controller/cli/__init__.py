"""The ``heroserve`` command. Bad input prints one line naming the problem and exits 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agents import __version__
from agents.cliutil import DefaultsHelpFormatter, missing_dependency
from controller.errors import InputError
from controller.inputs.args import (
    OneLineParser,
    bounded,
    output_file,
    parallelism,
    report_error,
    seed,
    write_text,
)
from controller.inputs.limits import MAX_CANDIDATES, MAX_SLA_S


def _positive(kind: type):
    """A positive finite ``kind``; options other branches add still use this name."""
    return bounded(kind, 0, low_open=True)


_parallelism = parallelism

COMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {}


# -- plan ------------------------------------------------------------------------------------
def _plan_args(p: argparse.ArgumentParser) -> None:
    from controller.costmodel.netparams import DEFAULT_INA_LANES, INA_LANES
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
        "--gpus",
        type=_positive(int),
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
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="progress line on stderr even for small clusters (shown above 64 GPUs)",
    )
    from controller.cli.related import add_related_args  # the seed planners' options

    add_related_args(p)


def default_model(topology: str) -> str:
    return "OPT-175B" if topology in ("2tracks", "8tracks") else "OPT-66B"


def run_plan(a: argparse.Namespace) -> int:
    from controller.cli.progress import ProgressLine
    from controller.cli.report import comparison_table, groups_table
    from controller.costmodel.netparams import NetParams
    from controller.models import model_spec
    from controller.planner import BASELINES, PLANNERS, PlannerOptions, plan
    from controller.related import HELIX_BASELINES, RELATED
    from controller.topology import resolve_topology
    from controller.workload import SLA, default_sla, resolve_workload

    if a.planner in RELATED + HELIX_BASELINES:  # colocated plans (docs/related-planners.md)
        from controller.cli.related import run_related_plan

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


COMMANDS["plan"] = (
    "plan a disaggregated deployment and compare it with the baselines",
    _plan_args,
    run_plan,
)


# -- validate --------------------------------------------------------------------------------
def _validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a topology (.yaml/.yml/.json), plan (.json) or trace (.csv/.json)")
    p.add_argument(
        "--as",
        dest="kind",
        choices=["topology", "plan", "trace"],
        help="what the file holds (default: told by its extension; a JSON list is a trace, "
        "a mapping with 'links' a topology, another mapping a plan)",
    )
    p.add_argument(
        "--topology",
        help="a plan is checked against this cluster (default: the plan's own topology)",
    )


def run_validate(a: argparse.Namespace) -> int:
    from controller.cli.validate import validate_file

    print(validate_file(a.file, a.kind, a.topology))
    return 0


COMMANDS["validate"] = (
    "check a topology, plan or trace file as every command reads it (limits: docs/topology.md)",
    _validate_args,
    run_validate,
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


# -- export ----------------------------------------------------------------------------------
def _export_args(p: argparse.ArgumentParser) -> None:
    from controller.export import add_args

    add_args(p)


def run_export(a: argparse.Namespace) -> int:
    from controller.export import run

    return run(a)


COMMANDS["export"] = (
    "turn a plan into a deployment file or vLLM/SGLang launch commands (docs/export.md)",
    _export_args,
    run_export,
)


# -- admin -----------------------------------------------------------------------------------
def _admin_args(p: argparse.ArgumentParser) -> None:
    from controller.cli.admin import add_args

    add_args(p)


def run_admin(a: argparse.Namespace) -> int:
    from controller.cli.admin import run

    return run(a)


COMMANDS["admin"] = (
    "operate a running controller: apply a plan, show state, agents, slots",
    _admin_args,
    run_admin,
)


# -- pki -------------------------------------------------------------------------------------
def _pki_args(p: argparse.ArgumentParser) -> None:
    from controller.cli.pki import add_args

    add_args(p)


def run_pki(a: argparse.Namespace) -> int:
    from controller.cli.pki import run

    return run(a)


COMMANDS["pki"] = (
    "make the CA and certificates for mutual TLS (docs/control-plane.md)",
    _pki_args,
    run_pki,
)


# -- emulate, demo (controller/cli/emulate.py) ------------------------------------------------
def _emulate_args(p: argparse.ArgumentParser) -> None:
    from controller.cli.emulate import emulate_args

    emulate_args(p)


def _run_emulate(a: argparse.Namespace) -> int:
    from controller.cli.emulate import run_emulate

    return run_emulate(a)


def _demo_args(p: argparse.ArgumentParser) -> None:
    from controller.cli.emulate import demo_args

    demo_args(p)


def _run_demo(a: argparse.Namespace) -> int:
    from controller.cli.emulate import run_demo

    return run_demo(a)


COMMANDS["emulate"] = (
    "emulate the cluster (Mininet) and compare INA with ring all-reduces on real packets",
    _emulate_args,
    _run_emulate,
)
COMMANDS["demo"] = (
    "bring up controller, switches and agents on this machine and show a plan arriving",
    _demo_args,
    _run_demo,
)


def _controller(argv: list[str]) -> int:
    from controller.service import main as controller_main

    return controller_main(argv)


def _softswitch(argv: list[str]) -> int:
    from agents.softswitch import main as softswitch_main

    return softswitch_main(argv)


def _simulate(argv: list[str]) -> int:
    from controller.cli.simulate import main as simulate_main

    return simulate_main(argv)


def _fidelity(argv: list[str]) -> int:
    from controller.evaluation.fidelity import main as fidelity_main

    return fidelity_main(argv)


def _evaluate(argv: list[str]) -> int:
    from controller.cli.evaluate import main as evaluate_main

    return evaluate_main(argv)


def _compare(argv: list[str]) -> int:
    from controller.cli.related import main_compare

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
    "fidelity": ("write docs/fidelity.md: the paper's claims beside the project's", _fidelity),
    "compare": ("every planner, the seed papers' too, side by side on one cluster", _compare),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="heroserve",
        formatter_class=DefaultsHelpFormatter,
        description="HeroServe: network control plane for disaggregated LLM serving",
    )
    parser.add_argument("--version", action="version", version=f"heroserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add_args, _) in COMMANDS.items():
        add_args(
            sub.add_parser(
                name,
                help=help_,
                description=help_,
                formatter_class=DefaultsHelpFormatter,
            )
        )
    for name, (help_, _) in PASSTHROUGH.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]][1](argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return COMMANDS[args.command][2](args)
    except InputError as e:
        return report_error("heroserve", e)
    except BrokenPipeError:  # output piped into head and the like
        return 0
    except ModuleNotFoundError as e:  # installed without the controller's extra
        return missing_dependency(e, "heroserve", "pip install 'heroserve[controller]'")
    except KeyboardInterrupt:
        print("heroserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
