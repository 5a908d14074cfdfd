"""Scenario overrides the fidelity report sizes its clusters with: core switches of a track
cluster, the testbed's fixed role split, and the combinations refused."""

import pytest

from controller.errors import InputError
from controller.evaluation.scenarios import scenario
from controller.topology import testbed as make_testbed
from controller.topology.generators import paper_cores


def _cores(g):
    return sum(d.get("tier") == "core" for _, d in g.nodes(data=True))


def test_core_switches_default_to_the_papers_count_scaled_and_can_be_set():
    """2tracks at 24 servers: 27 cores of 1200 scaled is round(0.54), at least 2."""
    assert _cores(scenario("2tracks-chatbot", servers=24).cluster()) == 2
    assert _cores(scenario("2tracks-chatbot", servers=24, cores=4).cluster()) == 4
    assert _cores(scenario("8tracks-chatbot", servers=16, cores=16).cluster()) == 16


def test_the_fidelity_report_runs_the_papers_cores_at_full_size():
    """At 1,200 servers the report's track clusters are the paper's (27 and 280 cores); at
    48 servers the scaled counts (round(1.08) = 1 and round(11.2) = 11) are raised to 4 and
    16 cores, 8tracks' 1:1 core at that size."""
    from controller.evaluation.fidelity import cases

    full = {c.name: c.overrides for c in cases(1200)}
    assert full["2tracks-chatbot"] == {"servers": 1200, "cores": 27}
    assert full["8tracks-summarization"] == {"servers": 1200, "cores": 280}
    small = {c.name: c.overrides for c in cases(48)}
    assert small["2tracks-summarization"] == {"servers": 48, "cores": 4}
    assert small["8tracks-chatbot"] == {"servers": 48, "cores": 16}
    assert paper_cores("2tracks", 600) == 14 and paper_cores("8tracks", 600) == 140


def test_the_testbeds_fixed_role_split():
    g = scenario("testbed-chatbot", fixed_roles=True).cluster()
    want = make_testbed(fixed_roles=True)
    roles = dict(g.nodes(data="role"))
    assert roles == dict(want.nodes(data="role"))
    gpus = [n for n, d in g.nodes(data=True) if d["kind"] == "gpu"]
    assert {roles[n] for n in gpus} == {"prefill", "decode"}
    assert {d.get("role") for _, d in scenario("testbed-chatbot").cluster().nodes(data=True)
            if d["kind"] == "gpu"} == {"any"}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "over"),
    [("testbed-chatbot", {"cores": 4}), ("2tracks-chatbot", {"fixed_roles": True})],
)
def test_overrides_of_the_other_cluster_kind_are_refused(name, over):
    with pytest.raises(InputError):
        scenario(name, **over)
