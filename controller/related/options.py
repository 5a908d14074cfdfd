"""Options of the seed planners (``heroserve plan --planner helix|costeff|hetero-search``,
docs/related-planners.md): :class:`RelatedOptions`, whose fields declared with ``option`` are
also the command line's flags (``controller/inputs/flags.py``). Light: no planner imported."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Literal

from controller.errors import InputError
from controller.inputs.flags import option
from controller.planner.options import DEFAULT_TIME_LIMIT_S


def price(s: str) -> tuple[str, float]:
    """``TYPE=USD``: a GPU type's price per hour."""
    kind, sep, value = s.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = math.nan
    if not sep or not kind or not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{s!r} is not TYPE=USD_PER_HOUR, e.g. V100-32GB=2.48")
    return kind, v


@dataclass(frozen=True)
class RelatedOptions:
    """Options of the seed planners. Memory fraction and batch cap are PlannerOptions'
    (r_frac, max_batch)."""

    seed: int = 0
    r_frac: float = 0.9
    max_batch: int = 512
    # solvers
    time_limit_s: float = option(
        60.0, help="MILP time limit; hitting it returns the best plan found", unit="s",
        flag="--time-limit", metavar="S", low=0, high=86400, low_open=True,
    )  # fmt: skip
    # the whole planner's CPU-time limit (``PlannerOptions.time_limit_s``); None: none
    planner_time_limit_s: float | None = DEFAULT_TIME_LIMIT_S
    early_stop_gap: float = 0.01  # Helix: stop within this fraction of its upper bound
    workers: int = 2  # CP-SAT search workers
    # Helix
    partial_inference: bool = option(True, help="helix: without partial inference")
    prune_degree: float = option(
        12.0, help="helix: average node degree after pruning slow links (0: keep all)",
        low=0, high=1000,
    )  # fmt: skip
    helix_nodes: Literal["server", "gpu"] = option(
        "server", help="helix: a compute node is a server (TP inside) or a GPU"
    )
    # cost efficiency
    budget: float | None = option(
        None, help="costeff: budget", unit="$/h", default_help="all", low=0, high=1e9,
        low_open=True,
    )  # fmt: skip
    prices: dict[str, float] = option(
        help="costeff: a GPU type's price per hour (repeatable)", default_factory=dict,
        flag="--price", metavar="TYPE=USD", parse=price, many=True, convert=dict,
    )  # fmt: skip
    costeff_method: Literal["milp", "binary"] = option(
        "milp", help="costeff: milp (exact) or binary (binary search on the makespan)"
    )
    max_stages: int = 4  # most pipeline stages of a configuration
    # heterogeneous throughput search
    mapper: Literal["os", "rr", "wrr", "mb", "si"] = option(
        "os", help="hetero-search: request mapper (os: the paper's)"
    )
    mapper_k: float = 2.0  # exponent of the KV utilisation term (the paper sets 2)
    sample: int = 1000  # requests sampled for the planners' workload estimates

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise InputError(f"solver time limit must be positive, got {self.time_limit_s}")
        if not 0 <= self.early_stop_gap < 1:
            raise InputError(f"early-stop gap must be in [0, 1), got {self.early_stop_gap}")
        if self.helix_nodes not in ("server", "gpu"):
            raise InputError(f"Helix nodes are 'server' or 'gpu', got {self.helix_nodes!r}")
        if self.budget is not None and not self.budget > 0:
            raise InputError(f"budget must be positive, got {self.budget}")
        if self.costeff_method not in ("milp", "binary"):
            raise InputError(f"costeff method is milp or binary, got {self.costeff_method!r}")
        if self.sample < 10:
            raise InputError(f"the planning sample needs at least 10 requests, got {self.sample}")
        for t, p in self.prices.items():
            if not (isinstance(p, int | float) and math.isfinite(p) and p > 0):
                raise InputError(f"price of {t} must be a positive number, got {p!r}")
