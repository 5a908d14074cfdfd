"""Track clusters of another size than the paper's (``plan --servers N``): built by
``track_cluster``, named ``KIND-N``, and read back from that name wherever a plan names it."""

import argparse

import pytest

from controller.cli.common import resolve_inputs
from controller.errors import InputError
from controller.topology import plan_topology, resolve_topology
from controller.topology.generators import paper_cores, track_cluster


def gpus(g) -> int:
    return sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")


def switches(g, tier: str) -> int:
    return sum(1 for _, d in g.nodes(data=True) if d["kind"] == "switch" and d["tier"] == tier)


def test_a_sized_cluster_has_its_servers_and_scaled_cores() -> None:
    g = track_cluster("8tracks", 32)
    # 2 units of 16 8-GPU servers; 8 access switches a unit; 280 x 32/1200 = 7.5 -> 7 cores
    assert (g.graph["name"], gpus(g)) == ("8tracks-32", 256)
    assert (switches(g, "access"), switches(g, "core")) == (16, 7) and paper_cores(
        "8tracks", 32
    ) == 7


def test_the_name_reads_back_through_both_resolvers() -> None:
    for resolve in (resolve_topology, plan_topology):
        g = resolve("2tracks-12")
        assert (g.graph["name"], gpus(g), switches(g, "core")) == ("2tracks-12", 96, 2)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("2tracks-13", "whole units of 6 servers: 13"),
        ("8tracks-99999", "at most 16384"),
    ],
)
def test_a_bad_size_is_one_input_error(spec: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        resolve_topology(spec)


def test_servers_sizes_only_the_track_clusters() -> None:
    a = argparse.Namespace(
        topology="2tracks", servers=6, model=None, workload="chatbot", seed=0,
        sla_ttft=None, sla_tpot=None,
    )  # fmt: skip
    g, model, _, sla = resolve_inputs(a, resolve_topology)
    # the track clusters' defaults hold at any size: OPT-175B and the large-scale SLA
    assert (g.graph["name"], gpus(g), model.name) == ("2tracks-6", 48, "OPT-175B")
    with pytest.raises(InputError, match="--servers sizes the track clusters"):
        resolve_inputs(argparse.Namespace(**{**vars(a), "topology": "testbed"}), resolve_topology)
