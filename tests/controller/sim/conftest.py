"""Plans the simulator's tests share: small testbed plans whose shapes exercise a path."""

import pytest

from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla


def testbed_plan(model: str, prefill: tuple[int, int], decode: tuple[int, int]):
    g = make_testbed()
    w = chatbot()
    opts = PlannerOptions(prefill_par=prefill, decode_par=decode)
    return g, w, plan(g, model_spec(model), w, default_sla("chatbot"), opts)


@pytest.fixture(scope="module")
def pp2_plan():
    """The testbed with prefill and decode in 2 pipeline stages each, so that a whole pass
    differs from stage by stage; tensor-parallel groups all-reduce."""
    g, w, p = testbed_plan("OPT-66B", (2, 2), (4, 2))
    assert p.prefill.pp == 2 and p.decode.pp == 2
    return g, w, p


@pytest.fixture(scope="module")
def many_plan():
    """A smaller model in more instances: requests are routed among 6 decode instances, so a
    lazy instance's state is read by routing between its steps. One GPU a stage: no
    all-reduce, the network carries only KV transfers and pipeline hops."""
    g, w, p = testbed_plan("OPT-13B", (1, 2), (1, 2))
    assert len(p.prefill.instances) == 2 and len(p.decode.instances) == 6
    return g, w, p


@pytest.fixture(scope="module")
def twelve_decode_plan():
    """OPT-13B on single GPUs: 2 prefill and 12 decode instances, more than the router
    compares at once (``ROUTE_ALL_MAX``), so it draws candidates."""
    g, w, p = testbed_plan("OPT-13B", (1, 1), (1, 1))
    assert len(p.prefill.instances) == 2 and len(p.decode.instances) == 12
    return g, w, p
