"""The controller the service tests talk to: an in-process server on loopback given the
sample topology, a channel to it, and the testbed plan ``heroserve plan`` makes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from controller.service.sample import sample_topology
from controller.service.server import ControllerServer, ThreadedServer
from controller.service.store import Store


# test_service_fuzz.py and test_tls.py define an srv of their own (a plan applied, TLS),
# which pytest takes over this one for their tests.
@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedServer]:
    # The sample plans name topology "sample", no built-in: the controller is given it.
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"), "127.0.0.1:0", topology=sample_topology(ina_groups=2)
        )
    )
    yield s
    s.stop()


@pytest.fixture
def chan(srv: ThreadedServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        yield ch


@pytest.fixture(scope="module")
def testbed_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``heroserve plan --json PATH`` on the testbed with the paper's roles (prefill on the
    A100 servers, decode on the V100 servers), the plan only, with the parallelism the tests
    of test_service_plans.py rely on (prefill TP1xPP4, decode TP4xPP2, TP inside a server)
    forced: the planner's own choice follows the cost model."""
    from controller.cli import main as cli

    path = tmp_path_factory.mktemp("plan") / "plan.json"
    args = ["--prefill-par", "1x4", "--decode-par", "4x2", "--quiet", "--json", str(path)]
    args += ["--topology", "testbed-paper"]
    assert cli(["plan", "--planner", "heroserve", *args]) == 0
    return path.read_text()
