"""The subcommands' own options, one frozen dataclass per concern, from which their flags are
made (``controller/inputs/flags.py``; docs/inputs.md, "Flags from dataclasses"):

- :class:`PlanInputs`: what a planning command plans for (cluster, model, workload, SLA
  bounds, seed), shared by ``plan`` and ``compare``;
- :class:`PlanCommand`, :class:`CompareCommand`, :class:`SimulateCommand`,
  :class:`EvaluateCommand`, :class:`ExportCommand`: each command's own.

The options of the libraries are theirs: the planner's ``PlannerOptions``
(``controller/planner/options.py``) with the network's ``NetParams``
(``controller/costmodel/netparams.py``), the seed planners' ``RelatedOptions``
(``controller/related/options.py``), export's ``Options`` (``controller/export/options.py``).
Every module named here is light: ``--help`` is built from them.
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass
from typing import Literal

from controller.cli.planners import REGISTRY, describe, names, planner_list
from controller.export.options import Format
from controller.inputs.args import output_dir, output_file
from controller.inputs.flags import option
from controller.inputs.limits import (
    MAX_CV,
    MAX_RATE,
    MAX_SEED,
    MAX_SERVERS,
    MAX_SIM_REQUESTS,
    MAX_SIM_TOKENS,
    MAX_SLA_S,
)
from controller.models.engines import EngineName

_SEED = {"help": "random seed", "low": 0, "high": MAX_SEED}


@dataclass(frozen=True)
class PlanInputs:
    """What a planning command plans for (``controller.cli.common.resolve_inputs``)."""

    topology: str = option(
        "testbed",
        help="testbed | 2tracks | 8tracks | fig2 | l40s-rack (the seed planners also helix24 | "
        "hetero-v100) | a .yaml/.json topology file",
    )
    model: str | None = option(
        None,
        help="model name",
        default_help="OPT-66B on the testbed, OPT-175B on the track clusters, LLaMA-2-70B on "
        "helix24",
    )
    servers: int | None = option(
        None, help="2tracks | 8tracks: servers in the cluster (whole units of 6 and 16), the "
        "paper's core switches scaled to the size", low=1, high=MAX_SERVERS,
        default_help="the paper's 1200",
    )  # fmt: skip
    workload: str = option("chatbot", help="chatbot | summarization | a .csv/.json trace file")
    sla_ttft: float | None = option(
        None, help="TTFT bound", unit="s", low=0, high=MAX_SLA_S, low_open=True,
        default_help="the paper's for the workload at the cluster's scale",
    )  # fmt: skip
    sla_tpot: float | None = option(
        None, help="TPOT bound", unit="s", low=0, high=MAX_SLA_S, low_open=True,
        default_help="the paper's for the workload at the cluster's scale",
    )  # fmt: skip
    seed: int = option(0, **_SEED)


def _plan_planner(s: str) -> str:
    if s != "all" and s not in REGISTRY:
        raise argparse.ArgumentTypeError(
            f"unknown planner {s!r}; known: {', '.join(REGISTRY)}, all"
        )
    return s


_plan_planner.__name__ = "planner"


@dataclass(frozen=True)
class PlanCommand:
    """``heroserve plan``'s own options."""

    planner: str = option(
        "all",
        help="the planner: "
        + describe()
        + "; or all: "
        + ", ".join(n for n, p in REGISTRY.items() if p.in_all)
        + " side by side",
        parse=_plan_planner,
        metavar="NAME",
    )
    json: str | None = option(
        None,
        help="write the plan (the first planner's) here; with --planner all each baseline "
        "goes to PATH.<planner>.json",
        parse=output_file,
        metavar="PATH",
    )
    profile: str | None = option(
        None,
        help="an engine profile (heroserve profile): Eqs. 12-13 fitted to its measured times "
        "price compute for its GPU type (docs/engine-profile.md)",
        metavar="FILE",
        default_help="datasheet figures",
    )
    quiet: bool = option(False, help="no progress line on stderr")
    verbose: bool = option(
        False, help="progress line on stderr even for small clusters (shown above 64 GPUs)"
    )


@dataclass(frozen=True)
class CompareCommand:
    """``heroserve compare``'s own options."""

    planners: list[str] = option(
        help="comma-separated names: " + ", ".join(names()),
        default_factory=lambda: [n for n, p in REGISTRY.items() if p.in_compare],
        parse=planner_list(),
    )
    requests: int = option(300, help="fewest requests per simulated point", low=1, high=10**6)
    lives: int = option(
        10, help="a point's arrivals last this many request lives at the SLA (mean output x "
        "TPOT bound)", low=1, high=10**6,
    )  # fmt: skip
    max_requests: int = option(20000, help="most requests per simulated point", low=1, high=10**6)
    steps: int = option(6, help="bisection steps", low=1, high=40)
    no_sim: bool = option(False, help="plan only")
    json: str | None = option(
        None, help="write the rows as JSON", parse=output_file, metavar="PATH"
    )
    quiet: bool = option(False, help="no progress lines on stderr")


@dataclass(frozen=True)
class SimulateCommand:
    """``heroserve simulate``'s options."""

    plan: str = option(help="a plan JSON file (heroserve plan --json)")
    rate: float | None = option(
        None, help=f"requests offered (at most {MAX_RATE:g} in all)", unit="req/s", low=0,
        high=MAX_RATE, low_open=True, default_help="the rate the plan predicts",
    )  # fmt: skip
    per_gpu: bool = option(False, help="--rate is per GPU used by the plan")
    requests: int = option(
        2000,
        help=f"requests to simulate (at most {MAX_SIM_REQUESTS}, and {MAX_SIM_TOKENS:.0e} "
        "tokens over them)",
        low=1,
        high=MAX_SIM_REQUESTS,
    )
    workload: str | None = option(
        None,
        help="chatbot | summarization | a .csv/.json trace",
        default_help="the generator the plan names",
    )
    topology: str | None = option(
        None,
        help="the cluster the plan runs on (built-in name or topology file)",
        default_help="the built-in the plan names",
    )
    seed: int = option(0, **_SEED)
    profile: str | None = option(
        None,
        help="the engine profile the plan was made with (plan --profile)",
        metavar="FILE",
        default_help="none: a plan made with one needs it",
    )
    cv: float = option(
        1.0, help=f"inter-arrival CV (1: Poisson; at most {MAX_CV:g})", low=0, high=MAX_CV,
        low_open=True,
    )  # fmt: skip
    online_scheduler: bool = option(False, help="run the online scheduler (docs/policy-table.md)")
    exact: bool = option(
        False,
        help="the unabridged run: one event per stage iteration and per decode step, without "
        "the simulator's exact shortcuts (docs/simulator.md, Speed); the same result, slower",
    )
    fast: bool = option(
        False,
        help="the fast path: the same rules compiled, every transfer at its time alone (no "
        "link contention); for large clusters whose network the run does not load "
        "(docs/simulator.md, The fast path)",
    )
    json: str | None = option(
        None, help="write the full result as JSON", parse=output_file, metavar="PATH"
    )


# controller.evaluation.scenarios.SCENARIOS' names (tests/controller/cli/test_config.py)
Scenario = Literal[
    "testbed-chatbot",
    "testbed-summarization",
    "2tracks-chatbot",
    "8tracks-chatbot",
    "2tracks-summarization",
    "8tracks-summarization",
]


def _scenario(s: str) -> str:
    known = typing.get_args(Scenario)
    if s not in known:
        raise argparse.ArgumentTypeError(f"unknown scenario {s!r}; known: {', '.join(known)}")
    return s


_scenario.__name__ = "scenario"


@dataclass(frozen=True)
class EvaluateCommand:
    """``heroserve evaluate``'s options (and the sweep's: ``--workers``, ``--ray``,
    ``--journal``, ``--fresh``, shared with ``fidelity``: ``controller.inputs.args``)."""

    scenario: Scenario = option(
        help="the paper's §V scenario: " + " | ".join(typing.get_args(Scenario)),
        metavar="NAME",
        parse=_scenario,
    )
    out: str | None = option(
        None, help="output folder", parse=output_dir, default_help="eval/<scenario>"
    )
    requests: int | None = option(
        None,
        help="requests per simulation point",
        low=1,
        high=MAX_SIM_REQUESTS,
        default_help="those arriving in 30 request lives at the point's rate, at least 2000",
    )
    servers: int | None = option(
        None,
        help="track scenarios: servers in the cluster",
        low=1,
        high=MAX_SERVERS,
        default_help="1200",
    )
    planners: list[str] | None = option(
        None,
        help="comma-separated planners of HeroServe's family: " + ", ".join(names("heroserve")),
        parse=planner_list("heroserve"),
        default_help="heroserve and the 4 baselines",
    )
    seed: int = option(0, **_SEED)
    online_scheduler: bool = option(
        False, help="HeroServe's points run its online scheduler (docs/policy-table.md)"
    )
    fast: bool = option(
        False,
        help="simulate on the fast path (no link contention; docs/simulator.md, The fast "
        "path): a 1,200-server point in about a minute",
    )
    quiet: bool = option(False, help="no progress lines")


@dataclass(frozen=True)
class ExportCommand:
    """``heroserve export``'s options beside those the files carry (``export.options``)."""

    plan: str = option(help="plan JSON (heroserve plan --json PATH)")
    format: Format = option(help="what to write")
    out: str = option(".", help="folder to write into (created if missing)", parse=output_dir)
    topology: str | None = option(
        None,
        help="cluster the plan runs on (built-in name or topology file)",
        default_help="the built-in the plan names (a plan never opens a file)",
    )
    engine: EngineName | None = option(
        None,
        help="--format k8s: the engine the pods run",
        default_help="the one the plan was made for",
    )
    address: list[str] = option(
        help="a server's address (repeat per server)",
        default_factory=list,
        metavar="SERVER=IP",
        parse=str,
        many=True,
        default_help="each server's start script resolves its own name",
    )


def _grid(s: str) -> tuple[int, ...]:
    """A comma-separated, strictly increasing list of positive integers (a profile's axis)."""
    from controller.models.profile import MAX_GRID

    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{s!r} is not a comma-separated list of integers"
        ) from None
    if (
        not 1 <= len(v) <= MAX_GRID
        or v[0] < 1
        or any(b <= a for a, b in zip(v, v[1:], strict=False))
    ):
        raise argparse.ArgumentTypeError(
            f"{s!r}: give 1 to {MAX_GRID} positive integers in increasing order"
        )
    return v


_grid.__name__ = "grid"
_GRID = {"parse": _grid, "metavar": "N,N,..."}


@dataclass(frozen=True)
class ProfileCommand:
    """``heroserve profile``'s options (docs/engine-profile.md)."""

    gpu_type: str = option(
        help="the topology's GPU type the measured hardware stands for in plans (a name of "
        "controller/models/gpus.py)",
        metavar="TYPE",
    )
    out: str = option(help="the profile file to write", parse=output_file, metavar="PATH")
    model: str = option("OPT-125M", help="the model shape (dummy weights)")
    engine_python: str | None = option(
        None, help="the Python of a vLLM environment (tools/engines.sh)", metavar="PATH",
        default_help="~/.cache/heroserve-engines/vllm/bin/python",
    )  # fmt: skip
    model_dir: str | None = option(
        None, help="a folder with the model's config.json (written there if missing)",
        metavar="DIR", default_help="a temporary folder",
    )  # fmt: skip
    batch_sizes: tuple[int, ...] = option(
        (1, 2, 4, 8), help="prefill batch sizes", **_GRID, default_help="1,2,4,8"
    )
    prompt_lengths: tuple[int, ...] = option(
        (32, 64, 128, 256), help="prefill prompt lengths (tokens)", **_GRID,
        default_help="32,64,128,256",
    )  # fmt: skip
    decode_batches: tuple[int, ...] = option(
        (1, 2, 4, 8, 16), help="decode batch sizes", **_GRID, default_help="1,2,4,8,16"
    )
    contexts: tuple[int, ...] = option(
        (64, 128, 256, 512), help="decode context lengths (tokens)", **_GRID,
        default_help="64,128,256,512",
    )  # fmt: skip
    decode_steps: int = option(16, help="decode steps timed per point", low=1, high=4096)
    repeats: int = option(3, help="runs per point (the median is kept)", low=1, high=100)
    dtype: str = option("bfloat16", help="the engine's --dtype")
    tp: int = option(1, help="tensor parallelism of the engine", low=1, high=1024)
    timeout: float = option(
        3600.0, help="give up after this long", unit="s", low=0, high=86400, low_open=True
    )
