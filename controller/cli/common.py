"""What several subcommands resolve the same way, defined once:

- :func:`default_model`: the model a command plans for when ``--model`` is not given;
- :func:`resolve_inputs`: (cluster, model, workload, SLA) from ``--topology``, ``--model``,
  ``--workload``, ``--sla-ttft``/``--sla-tpot`` and ``--seed`` (``plan``, ``compare``);
- :func:`cluster_for_plan`: the cluster a plan file runs on, checked against the plan
  (``simulate``, ``export``, ``validate``), the one place that says "pass --topology";
- :func:`plan_and_workload`: that cluster and the plan's workload (``simulate``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import networkx as nx

from controller.errors import InputError
from controller.inputs.plan_checks import check_plan_on_topology
from controller.models.specs import ModelSpec
from controller.plan import SLA, Plan
from controller.workload import Workload

LARGE_CLUSTERS = ("2tracks", "8tracks")  # the paper's §V clusters: its large-scale defaults


def default_model(topology: str) -> str:
    """OPT-66B on the testbed, OPT-175B on the track clusters (the paper's §V), LLaMA-2-70B
    on Helix's 24-node cluster (Helix's evaluation)."""
    if topology == "helix24":
        return "LLaMA-2-70B"
    return "OPT-175B" if topology in LARGE_CLUSTERS else "OPT-66B"


def resolve_inputs(
    a: argparse.Namespace, resolve_cluster: Callable[[str], nx.Graph]
) -> tuple[nx.Graph, ModelSpec, Workload, SLA]:
    """(cluster, model, workload, SLA) of a planning command. The SLA defaults to the paper's
    for the workload (chatbot's for a trace) at the cluster's scale; ``--sla-ttft`` and
    ``--sla-tpot`` override either bound."""
    from controller.models import model_spec
    from controller.workload import default_sla, resolve_workload

    g = resolve_cluster(a.topology)
    model = model_spec(a.model or default_model(a.topology))
    workload = resolve_workload(a.workload, seed=a.seed)
    scale = "large" if a.topology in LARGE_CLUSTERS else "testbed"
    base = default_sla(
        workload.name if workload.name in ("chatbot", "summarization") else "chatbot", scale
    )
    return g, model, workload, SLA(a.sla_ttft or base.ttft_s, a.sla_tpot or base.tpot_s)


def cluster_for_plan(
    plan: Plan,
    topology: str | None = None,
    source: str = "plan",
    resolve: Callable[[str], nx.Graph] | None = None,
) -> nx.Graph:
    """The cluster a plan runs on (``topology``, else the plan's own: a built-in name or a
    file), with the plan (read from ``source``) checked against it."""
    if resolve is None:
        from controller.topology import resolve_topology as resolve
    spec = topology or plan.topology
    try:
        g = resolve(spec)
    except InputError as e:
        if topology is None:
            raise InputError(
                f"plan's topology {spec!r} cannot be resolved ({e}): pass --topology"
            ) from None
        raise
    try:
        check_plan_on_topology(plan, g)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return g


def plan_and_workload(
    plan: Plan, topology: str | None, workload: str | None, source: str = "plan"
) -> tuple[nx.Graph, Workload]:
    """The plan's cluster (checked against the plan) and workload (``workload``, else the
    plan's own, else chatbot)."""
    from controller.workload import resolve_workload

    g = cluster_for_plan(plan, topology, source)
    return g, resolve_workload(workload or plan.workload or "chatbot")
