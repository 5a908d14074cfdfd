"""The planners of the other seed papers (docs/design.md §6), on the project's cluster model and
cost model, returning colocated plans (``Plan.layout == "colocated"``) that
``controller.related.colocated`` runs. docs/related-planners.md describes them.

- ``helix`` (``000_...``): max flow of tokens/s, layer placement by MILP, IWRR per-request
  pipelines; its baselines ``swarm``, ``helix-sp`` (separate pipelines), ``helix-petals``.
- ``costeff`` (``002_...``): makespan of the workload mix under a $/h budget and availability.
- ``hetero-search`` (``003_...``): Alg. 1 throughput, TP per machine, capacity-aware mapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.errors import InputError
from controller.related.options import RelatedOptions

if TYPE_CHECKING:  # light at import: the planners' modules load when one plans
    import networkx as nx

    from controller.models.specs import ModelSpec
    from controller.plan import Plan
    from controller.workload.base import Workload
    from controller.workload.sla import SLA

RELATED = ("helix", "costeff", "hetero-search")
HELIX_BASELINES = ("swarm", "helix-sp", "helix-petals")


def plan_related(
    name: str,
    cluster: nx.Graph,
    model: ModelSpec,
    workload: Workload,
    sla: SLA,
    options: RelatedOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan with one of the seed papers' planners (``RELATED`` or ``HELIX_BASELINES``)."""
    opts = options or RelatedOptions()
    if name == "helix":
        from controller.related.helix import plan_helix

        return plan_helix(cluster, model, workload, sla, opts, progress)
    if name in HELIX_BASELINES:
        from controller.related.helix import plan_baseline

        return plan_baseline(name, cluster, model, workload, sla, opts)
    if name == "costeff":
        from controller.related.costeff import plan_costeff

        return plan_costeff(cluster, model, workload, sla, opts, progress)
    if name == "hetero-search":
        from controller.related.hetero_search import plan_hetero

        return plan_hetero(cluster, model, workload, sla, opts, progress)
    known = ", ".join(RELATED + HELIX_BASELINES)
    raise InputError(f"unknown related planner {name!r}; known: {known}")


__all__ = ["HELIX_BASELINES", "RELATED", "RelatedOptions", "plan_related"]
