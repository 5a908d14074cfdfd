"""Simulator of colocated plans (``Plan.layout == "colocated"``, the seed planners): prefill
and decode of a request run on the same GPUs, as vLLM serves them (docs/related-planners.md).

Modules: ``model`` (the plan priced on its cluster: nodes, routes, run state), ``routing``
(which pipeline serves a request: Helix's IWRR, Swarm, or a replica mapper), ``engine`` (the
event loop: batching, activation transfers, KV preemption), ``results`` (what a run
reports), ``options`` (a run's settings). This package only re-exports their public names.
"""

from controller.related.colocated.engine import ColocatedSim, simulate_colocated
from controller.related.colocated.model import (
    SOURCE,
    ColocatedModel,
    RequestState,
    SimNode,
    Stage,
    build_colocated,
)
from controller.related.colocated.options import ColocatedOptions
from controller.related.colocated.results import ColocatedResult, colocated_result
from controller.related.colocated.routing import (
    IWRR,
    IWRR_MAX_WEIGHT,
    FlowRouter,
    ReplicaRouter,
    Router,
    integer_weights,
)

__all__ = [
    "IWRR",
    "IWRR_MAX_WEIGHT",
    "SOURCE",
    "ColocatedModel",
    "ColocatedOptions",
    "ColocatedResult",
    "ColocatedSim",
    "FlowRouter",
    "ReplicaRouter",
    "RequestState",
    "Router",
    "SimNode",
    "Stage",
    "build_colocated",
    "colocated_result",
    "integer_weights",
    "simulate_colocated",
]
