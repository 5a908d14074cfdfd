"""What several subcommands resolve the same way, defined once:

- :func:`default_model`: the model a command plans for when ``--model`` is not given;
- :func:`resolve_inputs`: (cluster, model, workload, SLA) from ``--topology``, ``--model``,
  ``--workload``, ``--sla-ttft``/``--sla-tpot`` and ``--seed`` (``plan``, ``compare``);
- :func:`plan_cluster`: the cluster a plan file runs on (``--topology`` or the built-in the
  plan names), and :func:`cluster_for_plan`: the same checked against the plan
  (``simulate``, ``export``, ``validate``), the one place that says "give --topology";
- :func:`workload_for_plan`: ``--workload`` or the generator the plan names;
- :func:`plan_and_workload`: both for ``simulate``;
- :func:`offered_work`: the rate and requests ``simulate`` offers a plan (``--rate``, else the
  plan's predicted rate), within :func:`check_work`'s bounds, for both kinds of plan.

A plan's own ``topology`` and ``workload`` fields name built-ins only; the files behind a plan
are the command line's (``--topology``, ``--workload``): a plan never opens a file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from controller.errors import InputError
from controller.inputs.limits import MAX_RATE, MAX_SIM_TOKENS
from controller.plan import SLA, Plan

if TYPE_CHECKING:  # light: ``validate`` reads a topology without numpy or the workloads
    import networkx as nx

    from controller.models.specs import ModelSpec
    from controller.workload import Workload

LARGE_CLUSTERS = ("2tracks", "8tracks")  # the paper's §V clusters: its large-scale defaults


def default_model(topology: str) -> str:
    """OPT-66B on the testbed, OPT-175B on the track clusters (the paper's §V), LLaMA-2-70B
    on Helix's 24-node cluster (Helix's evaluation)."""
    if topology == "helix24":
        return "LLaMA-2-70B"
    return "OPT-175B" if topology in LARGE_CLUSTERS else "OPT-66B"


def sized_topology(topology: str, servers: int | None, gpus: int | None = None) -> str:
    """The topology name ``--topology``, ``--servers`` and ``--gpus`` give together: a track
    cluster of ``servers`` servers is ``KIND-N`` (``controller.topology.resolve_topology``
    builds it); without ``--servers``, ``--gpus N`` sizes a track cluster to the fewest whole
    units that hold N GPUs, so the search prices pools of the size it plans, not the paper's
    9,600 GPUs; ``--servers`` with any other topology is refused."""
    if servers is None and gpus is not None and topology in LARGE_CLUSTERS:
        from controller.topology.generators import PAPER_SERVERS, track_servers_for

        servers = track_servers_for(topology, gpus)
        if servers == PAPER_SERVERS:
            return topology
    if servers is None:
        return topology
    if topology not in LARGE_CLUSTERS:
        raise InputError(
            f"--servers sizes the track clusters ({', '.join(LARGE_CLUSTERS)}), not {topology!r}"
        )
    return f"{topology}-{servers}"


def resolve_inputs(
    a: argparse.Namespace, resolve_cluster: Callable[[str], nx.Graph]
) -> tuple[nx.Graph, ModelSpec, Workload, SLA]:
    """(cluster, model, workload, SLA) of a planning command. The SLA defaults to the paper's
    for the workload (chatbot's for a trace) at the cluster's scale; ``--sla-ttft`` and
    ``--sla-tpot`` override either bound."""
    from controller.models import model_spec
    from controller.workload import default_sla, resolve_workload

    gpus = getattr(a, "gpus", None)  # `--gpus` (PlannerOptions.max_gpus)
    name = sized_topology(a.topology, getattr(a, "servers", None), gpus)
    g = resolve_cluster(name)
    if gpus is not None:
        have = sum(1 for _, kind in g.nodes(data="kind") if kind == "gpu")
        if gpus > have:
            raise InputError(f"--gpus {gpus} is more than the {have} GPUs of {name}")
    model = model_spec(default_model(a.topology) if a.model is None else a.model)
    workload = resolve_workload(a.workload, seed=a.seed)
    scale = "large" if a.topology in LARGE_CLUSTERS else "testbed"
    base = default_sla(
        workload.name if workload.name in ("chatbot", "summarization") else "chatbot", scale
    )
    return g, model, workload, SLA(a.sla_ttft or base.ttft_s, a.sla_tpot or base.tpot_s)


def plan_cluster(
    plan: Plan,
    topology: str | None = None,
    source: str = "plan",
    resolve: Callable[[str], nx.Graph] | None = None,
    builtins: Mapping[str, Callable[[], nx.Graph]] | None = None,
) -> nx.Graph:
    """The cluster a plan runs on, not yet checked against it: ``topology`` (the command's
    ``--topology``, resolved by ``resolve``), else the built-in (one of ``builtins``) the
    plan names (:func:`controller.topology.plan_topology`)."""
    from controller.topology import BUILTIN, plan_topology, resolve_topology

    if topology is not None:
        return (resolve or resolve_topology)(topology)
    try:
        return plan_topology(plan.topology, BUILTIN if builtins is None else builtins)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None


def cluster_for_plan(plan: Plan, topology: str | None = None, source: str = "plan") -> nx.Graph:
    """:func:`plan_cluster` with the plan (read from ``source``) checked against it."""
    from controller.inputs.plan_checks import check_plan_on_topology

    g = plan_cluster(plan, topology, source)
    try:
        check_plan_on_topology(plan, g)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return g


def workload_for_plan(plan: Plan, workload: str | None, source: str = "plan") -> Workload:
    """``workload`` (the command's ``--workload``), else the generator the plan names
    (:func:`controller.workload.plan_workload`), else chatbot."""
    from controller.workload import plan_workload, resolve_workload

    if workload:
        return resolve_workload(workload)
    try:
        return plan_workload(plan.workload or "chatbot")
    except InputError as e:
        raise InputError(f"{source}: {e}") from None


def plan_and_workload(
    plan: Plan, topology: str | None, workload: str | None, source: str = "plan"
) -> tuple[nx.Graph, Workload]:
    """The plan's cluster (checked against the plan) and workload (``simulate``)."""
    return cluster_for_plan(plan, topology, source), workload_for_plan(plan, workload, source)


def check_work(reqs, rate: float) -> None:
    """The bounds on one simulation's work (controller/inputs/limits.py)."""
    if rate > MAX_RATE:
        raise InputError(f"offered rate {rate:.4g} req/s is above the bound {MAX_RATE:g}")
    tokens = sum(r.input_tokens + r.output_tokens for r in reqs)
    if tokens > MAX_SIM_TOKENS:
        raise InputError(
            f"{len(reqs)} requests hold {tokens} tokens, more than one simulation may run "
            f"({MAX_SIM_TOKENS:.0e}): pass fewer --requests"
        )


def offered_work(a: argparse.Namespace, plan, w, gpus_used: int) -> tuple[float, list]:
    """The offered rate (req/s, the whole deployment) and its requests, within the bounds.

    Without ``--rate`` the plan's own predicted rate is offered, and a line on stderr says so:
    the rate the planner claims the deployment sustains is the one worth checking first."""
    from controller.sim import make_requests

    if a.rate is None:
        if a.per_gpu:
            raise InputError("--per-gpu scales --rate: pass --rate too")
        rate = plan.predicted.rate
        if not rate > 0:
            raise InputError(f"the plan predicts no rate ({rate:g} req/s): pass --rate")
        print(f"no --rate: offering the plan's predicted rate, {rate:.4g} req/s", file=sys.stderr)
    else:
        rate = a.rate * gpus_used if a.per_gpu else a.rate
    reqs = make_requests(w, rate, a.requests, a.seed, a.cv)
    check_work(reqs, rate)
    return rate, reqs


def profile_compute(path: str | None, model: ModelSpec, g: nx.Graph | None = None):
    """``--profile FILE``: the engine profile fitted for ``model`` (``PlannerOptions.compute``
    and ``compute_source``, ``ProfileCompute``) and the fit, or ``(((), ""), None)`` without
    one. One line on stderr says what prices compute and how well the fit matches; the
    profile's GPU type must be one of ``g``'s."""
    import sys

    from controller.costmodel.profiled import compute_table, fit_profile
    from controller.models.profile import read_profile

    if path is None:
        return ((), ""), None
    fit = fit_profile(read_profile(path), model)
    if g is not None:
        types = {d.get("gpu_type") for _, d in g.nodes(data=True) if d.get("kind") == "gpu"}
        if fit.profile.gpu_type not in types:
            raise InputError(
                f"{path}: the profile stands for GPU type {fit.profile.gpu_type!r}, which the "
                "cluster has none of"
            )
    print(fit.describe(), file=sys.stderr)
    return (compute_table(fit), fit.profile.digest), fit


def say_extrapolated(fit, plan: Plan, workload: Workload) -> None:
    """One line on stderr where the plan's operating point lies past the profile's grid
    (Eqs. 12-13's form extrapolates there): the longest prompt, the decode batch and a decode
    step's mean context (what the planner prices decode at)."""
    import sys

    if fit is None or plan.layout != "disaggregated":
        return
    past = fit.outside(max(workload.inputs), plan.decode.batch_size, workload.mean_kv_tokens)
    if past:
        print(f"profile extrapolated (past its grid): {'; '.join(past)}", file=sys.stderr)
    else:
        print("profile: the plan's operating point is within its grid", file=sys.stderr)
