"""Plans pinned to their bytes: a change meant only to speed the planner up (caches, shared
fabrics, vectorised pricing) must leave every plan byte for byte as it was. The digests are
sha256 of ``Plan.to_json()`` as main wrote them before the planner's speed-ups (testbed,
OPT-66B chatbot; 8tracks-16, OPT-175B chatbot). A change that means to change plans updates
them, and says why in its commit."""

from __future__ import annotations

import hashlib

import pytest

from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology import resolve_topology
from controller.workload import chatbot, default_sla

PINNED = {
    ("testbed", "heroserve"): "75f11b103c3d9dd34ace58b27ec4cd7fe4a1952c2e1536231e27162a6755bd58",
    ("testbed", "distserve"): "bc1f32eea69b464761fdb9ef4299d3289239c2189a679011f9c53b351f014578",
    ("testbed", "distserve-paper"): (
        "ffc35130bd495d520d78b67dcc301fd4a09ddbb8d7b3b98622671fc21f9fbda5"
    ),
}


def _digest(p) -> str:  # noqa: ANN001
    return hashlib.sha256(p.to_json().encode()).hexdigest()


@pytest.mark.parametrize(("cluster", "planner"), sorted(PINNED))
def test_testbed_plans_keep_their_bytes(cluster: str, planner: str) -> None:
    p = plan(
        resolve_topology(cluster), model_spec("OPT-66B"), chatbot(), default_sla("chatbot"),
        planner=planner,
    )  # fmt: skip
    assert _digest(p) == PINNED[cluster, planner]


def test_a_track_cluster_plan_priced_around_balance_points_keeps_its_bytes() -> None:
    """Few enough role splits allowed (4) that HeroServe places them around its own and its
    baselines' balance points, each priced by an evaluator of its own on one problem: the
    path where those evaluators share the problem's fabrics and their memos."""
    opts = PlannerOptions(max_splits=4, class_sample=4)
    p = plan(
        resolve_topology("8tracks-16"), model_spec("OPT-175B"), chatbot(),
        default_sla("chatbot", "large"), opts, planner="heroserve",
    )  # fmt: skip
    assert _digest(p) == "0b4718261e96dbb7f68288aa70e4a69af25e5e09500cf78323f48ba0fae4614a"
