"""DistServe's own placement for clusters with slow cross-node links (DistServe, OSDI'24,
§4.3, "low node-affinity" placement, its Algorithm 2): the ``distserve-paper`` baseline.

- ``DISTSERVE_PAPER``: its policy: NCCL's ring only, no INA, as DistServe runs.
- ``search``: its planner's search (the common ``search`` signature): the low-affinity
  layouts (``colocated.colocated_search``, which describes them) priced under that policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.errors import InputError
from controller.planner.candidates import check_forced
from controller.planner.colocated import colocated_search
from controller.planner.deployment import SearchResult
from controller.planner.evaluate import Evaluator
from controller.planner.options import Policy, Problem
from controller.topology.graph import gpus

DISTSERVE_PAPER = Policy(
    "distserve-paper",
    grouping="packed",
    ina="none",
    ina_relay=False,
    ina_cross_server_only=True,
    prefer_intra_server=True,
)


def search(problem: Problem, policy: Policy, groupers: Sequence = ()) -> SearchResult:
    """The ``distserve-paper`` planner's search (the common ``search`` signature)."""
    check_forced(problem)
    result = colocated_search(Evaluator(problem, policy))
    if result is None:
        n = len(gpus(problem.cluster))
        raise InputError(
            f"no DistServe low-affinity layout of {problem.model.name} meets the SLA (TTFT "
            f"{problem.sla.ttft_s} s, TPOT {problem.sla.tpot_s} s) on the {n} GPUs: it needs "
            "nodes of one GPU type whose free GPUs can hold a prefill and a decode stage"
        )
    return result
