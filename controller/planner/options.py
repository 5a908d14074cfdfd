"""Planner options and the problem every planner solves.

Holds ``PlannerOptions`` (the user's knobs), ``Policy`` (what a planner may use: grouping,
INA schemes, routes), ``Problem`` (cluster, model, workload, SLA and options together,
the serving engine's profile when the plan is for one, and the planner's clock for its time
limit), ``TimeLimitReached`` and ``DEFAULT_TIME_LIMIT_S``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from controller.costmodel.compute import ComputeCoefficients
from controller.costmodel.netparams import NetParams
from controller.inputs.args import parallelism
from controller.inputs.flags import option
from controller.inputs.limits import MAX_CANDIDATES
from controller.models.engines import EngineName, EngineProfile, engine_profile

if TYPE_CHECKING:  # light at run time: the command line builds its flags from PlannerOptions
    import networkx as nx

    from controller.models.specs import ModelSpec
    from controller.workload.base import Workload
    from controller.workload.sla import SLA

# an engine profile's fitted coefficients per GPU type and the profile's sha256
# (``PlannerOptions.compute`` and ``compute_source``; costmodel/profiled.py)
ProfileCompute = tuple[tuple[tuple[str, ComputeCoefficients], ...], str]

Progress = object  # a callable(str) or None; kept loose to stay plain data

# CPU seconds (of the planning process) one planner may search before it returns the best
# plan found so far (docs/planner.md, "Time limit"): several times what HeroServe's own search
# takes on the paper's 9,600-GPU clusters, so it only stops searches that would not finish in
# any useful time. CPU time rather than wall time: on a shared machine the wall time of the
# same search varies tenfold with the load, and the plan would vary with it.
DEFAULT_TIME_LIMIT_S = 300.0


@dataclass(frozen=True)
class PlannerOptions:
    """The planner's options; those declared with ``option`` are ``heroserve plan``'s flags
    (``controller/inputs/flags.py``), the others the program's own knobs."""

    max_candi: int = option(
        20, help="candidate (TP, PP) pairs per phase (Alg. 1)", low=1, high=MAX_CANDIDATES
    )
    r_frac: float = 0.9  # fraction of a GPU's memory a serving engine may use (Alg. 1 R_frac)
    seed: int = 0
    perturb_tries: int = 8  # failed random swaps per group before Alg. 2's loop moves on
    max_batch: int = 512  # largest decode batch considered
    net: NetParams = field(default_factory=NetParams)  # flags: --cost-mode, --ina-lanes
    # Eqs. 12-13's coefficients per GPU type fitted to an engine profile (``--profile``,
    # costmodel/profiled.py); a type not named here is priced from its datasheet
    compute: tuple[tuple[str, ComputeCoefficients], ...] = ()
    compute_source: str = ""  # the profile's sha256, recorded in the plan ("" : none)
    exhaustive_limit: int = 20000  # most groupings the exhaustive planner enumerates per phase
    prefill_par: tuple[int, int] | None = option(
        None, help="force the prefill parallelism, e.g. 4x1", parse=parallelism, metavar="TPxPP"
    )
    decode_par: tuple[int, int] | None = option(
        None, help="force the decode parallelism, e.g. 8x1", parse=parallelism, metavar="TPxPP"
    )
    max_gpus: int | None = option(
        None, flag="--gpus", metavar="N",
        help="plan for at most N GPUs of the cluster (a track cluster without --servers: the "
        "fewest whole units that hold them)",
        low=0, low_open=True, default_help="all of them",
    )  # fmt: skip
    max_splits: int = 64  # role splits priced one by one; beyond, around the balance point
    class_sample: int = 48  # servers per class whose rates place the balance point
    tpot_mode: Literal["amortized", "eq4"] = option(
        "amortized",
        help="amortized: the KV transfer paid once per request, spread over its output tokens "
        "(DistServe's TPOT, and the simulator's); eq4: added to every token, as Eq. 4 is written",
    )
    # an upper bound, not a deployment: every all-reduce the policy may aggregate in the
    # network costs nothing (docs/fidelity.md's free-INA bound)
    free_ina: bool = False
    engine: EngineName | None = option(
        None,
        help="plan only what this serving engine runs (its TP/PP rules and placement, "
        "docs/export.md; controller/models/engines.py)",
        default_help="an engine-neutral plan",
    )
    # the search stops at its first check past this many CPU seconds with a plan in hand
    # and returns the best found, marked (``Plan.time_limit_reached``); None: no limit
    time_limit_s: float | None = option(
        DEFAULT_TIME_LIMIT_S,
        help="CPU-time limit of the planning run (heroserve plan: from the command's start, "
        "inputs and every planner included): hitting it returns the best plan found, "
        "marked 'time limit reached'",
        unit="s", flag="--planner-time-limit", metavar="S", low=0, high=86400, low_open=True,
    )  # fmt: skip


@dataclass(frozen=True)
class Policy:
    """What a planner may use: the knobs that tell HeroServe and its baselines apart."""

    name: str
    grouping: Literal["kmeans", "packed", "exhaustive"]
    ina: Literal["none", "sync", "async"]  # INA off, SwitchML-style, ATP-style
    ina_relay: bool  # INA routes may relay over NVLink (heterogeneous, HeroServe)
    ina_cross_server_only: bool  # baselines keep NCCL's NVLink ring inside a server
    prefer_intra_server: bool  # DistServe: TP inside a server where it fits
    hier: bool = False  # hierarchical INA (NVLink reduce-scatter, INA per rail, all-gather)
    # also price DistServe's low-affinity layouts (a prefill and a decode stage per node)
    colocated_layouts: bool = False


class TimeLimitReached(Exception):  # noqa: N818 (a signal, not an error: always caught)
    """Raised by ``Problem.tick`` inside a pricing step once the time limit has passed with
    a plan in hand: the search levels above catch it and keep the best they have (the
    deployment being settled when its bisection has a served rate, else the split's best
    pair, else the best split), so that the step between two checks is one deployment's
    rate or one decode instance, not a whole settlement (minutes at 65,536 GPUs)."""


@dataclass
class Problem:
    cluster: nx.Graph
    model: ModelSpec
    workload: Workload
    sla: SLA
    options: PlannerOptions = field(default_factory=PlannerOptions)
    progress: object = None  # callable(str) for progress lines, or None
    started: float = field(default_factory=time.process_time)  # the planner's CPU clock
    timed_out: bool = False  # a search stopped at the time limit (``out_of_time``)
    # a deployment the search can return is in hand (the first pass's best): from then on
    # ``tick`` may stop the pricing in the middle of a step
    plan_in_hand: bool = False
    # the cluster's fabrics (relay or not -> Fabric), built by the first pricing context and
    # shared by every evaluator of this problem (a search prices its contained planners'
    # balance points with evaluators of their own): a fabric depends only on the cluster and
    # the cost mode, and its memos (routes, segments) hold no policy's choices
    fabrics: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def engine(self) -> EngineProfile | None:
        """The serving engine the plan must run on, or None for an engine-neutral plan."""
        name = self.options.engine
        return engine_profile(name) if name is not None else None

    def say(self, msg: str) -> None:
        if callable(self.progress):
            self.progress(msg)

    def out_of_time(self, have_plan: bool) -> bool:
        """Whether the search must stop now: past ``options.time_limit_s`` CPU seconds since
        the problem was made, with a plan in hand (without one it goes on: a time limit
        returns the best plan found, never none). Records that it stopped, for the mark."""
        limit = self.options.time_limit_s
        if not have_plan or limit is None or time.process_time() - self.started <= limit:
            return False
        if not self.timed_out:
            self.say(f"time limit of {limit:g} s reached: keeping the best plan found")
        self.timed_out = True
        return True

    def tick(self) -> None:
        """A check inside a pricing step: raises ``TimeLimitReached`` past the time limit
        when a plan is in hand (``plan_in_hand``); without one the step goes on, as
        ``out_of_time`` does. One ``time.process_time`` call (about 0.1 us)."""
        if self.plan_in_hand and self.out_of_time(True):
            raise TimeLimitReached
