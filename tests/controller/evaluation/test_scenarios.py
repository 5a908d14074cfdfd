"""Scenario overrides the fidelity report sizes its clusters with: core switches of a track
cluster, the testbed's fixed role split, and the combinations refused."""

import pytest

from controller.errors import InputError
from controller.evaluation.scenarios import scenario
from controller.topology import testbed as make_testbed


def _cores(g):
    return sum(d.get("tier") == "core" for _, d in g.nodes(data=True))


def test_core_switches_default_to_the_papers_count_scaled_and_can_be_set():
    """2tracks at 24 servers: 27 cores of 1200 scaled is round(0.54), at least 2."""
    assert _cores(scenario("2tracks-chatbot", servers=24).cluster()) == 2
    assert _cores(scenario("2tracks-chatbot", servers=24, cores=4).cluster()) == 4
    assert _cores(scenario("8tracks-chatbot", servers=16, cores=16).cluster()) == 16


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
