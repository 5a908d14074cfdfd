"""The testbed's mesh servers end to end: their 4 GPUs are joined pairwise
by NVLink with no NVSwitch node, and the GPU agent reported NVLink use as ``GPU|SERVER-nvsw``,
a link the topology does not have, so the controller refused every report of those servers
and the online scheduler heard nothing from them. Here the controller serves the testbed's
plan, the agent runs with the command line ``heroserve export`` writes for a mesh server
(``--nvlink-mesh``), a stand-in NVML (``fake_nvml.c``) reports NVLink traffic, and the
tuner plugin schedules AllReduces: the controller receives the selections and the use of
each mesh link. Without ``--nvlink-mesh`` the NVSwitch links are dropped and counted, and
the selections still arrive. Skipped when the C++ build or a C compiler is absent."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT
from support.gpu_agent import AGENT, PLUGIN, Proc, wait_until

pytestmark = pytest.mark.skipif(
    not (AGENT.exists() and PLUGIN.exists() and shutil.which("cc")),
    reason="C++ GPU agent not built (make cxx) or no C compiler",
)


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nvml")
    src = Path(__file__).with_name("fake_nvml.c")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(d / "libnvidia-ml.so.1"), str(src)],
        check=True,
    )
    return d


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator:
    """The controller serving the testbed's HeroServe plan, and the deployment ``heroserve
    export`` writes for it."""
    import yaml

    from controller.cli import main
    from controller.service.core import Options
    from controller.service.server import ControllerServer, ThreadedServer
    from controller.service.store import Store
    from controller.topology import resolve_topology

    plan = tmp_path / "plan.json"
    assert main(["plan", "--planner", "heroserve", "--json", str(plan), "--quiet"]) == 0
    out = tmp_path / "dep"
    assert main(["export", "--plan", str(plan), "--format", "deployment", "--out", str(out)]) == 0
    dep = yaml.safe_load((out / "deployment.yaml").read_text())
    opts = Options(apply_margin=5, telemetry_interval_s=0.2)
    s = ThreadedServer(
        ControllerServer(
            Store(tmp_path / "c.db"),
            "127.0.0.1:0",
            options=opts,
            topology=resolve_topology("testbed"),
        )
    )
    s.call(lambda: s.server.core.apply_plan(plan.read_text()))
    yield s, dep
    s.stop()


def _agent_argv(dep: dict, port: int, mesh: bool) -> tuple[list[str], str, str]:
    """The exported command line of the first agent serving a group, its controller address
    this test's, its binary the build's; with ``mesh`` False, without ``--nvlink-mesh``
    (what the export wrote before). Also the agent's server and first group."""
    a = next(x for x in dep["gpu_agents"] if x["groups"])
    argv = shlex.split(a["command"])
    assert argv[0] == "heroserve-gpu-agent" and "--nvlink-mesh" in argv  # a mesh server
    argv[0] = str(AGENT)
    argv[argv.index("--controller") + 1] = f"127.0.0.1:{port}"
    if not mesh:
        argv.remove("--nvlink-mesh")
    return [*argv, "--telemetry-interval", "0.2"], a["server"], a["groups"][0]


@pytest.mark.parametrize("mesh", [True, False])
def test_mesh_server_reports_reach_the_online_scheduler(
    testbed, fake_nvml: Path, tmp_path: Path, mesh: bool
) -> None:
    srv, dep = testbed
    core = srv.server.core
    argv, server, group = _agent_argv(dep, srv.port, mesh)
    prefix = f"pytest{os.getpid()}m{time.monotonic_ns() % 1000000}."
    env = {**os.environ, "HEROSERVE_SHM_PREFIX": prefix, "HEROSERVE_GROUP": group}
    env["LD_LIBRARY_PATH"] = f"{fake_nvml}:{env.get('LD_LIBRARY_PATH', '')}"
    agent = Proc(argv, env, tmp_path / "agent.log")
    driver = None
    try:
        wait_until(
            lambda: (r := core.store.agent(server)) is not None and r.acked_epoch >= 1,
            what=f"ack of {server}\n{agent.text()}",
        )
        driver = Proc(
            [sys.executable, "-m", "agents.gpu.tuner_driver", str(PLUGIN), "--ranks", "2"],
            {**env, "PYTHONPATH": str(ROOT)},
            tmp_path / "driver.log",
            stdin=True,
        )
        assert driver.ask("run 20 1048576")["agree"]
        # The selections reach the controller: the online scheduler's counters and the
        # group's sequence number.
        wait_until(lambda: core.store.last_seq(group) == 19, what=f"last_seq 19\n{agent.text()}")
        reg = core.metrics.registry
        total = sum(
            reg.get_sample_value(
                "heroserve_policy_selections_total", {"group": group, "policy": str(p)}
            )
            or 0.0
            for p in range(8)
        )
        assert total == 20
        dropped = {"reason": "unknown_link"}
        if mesh:
            # Each pair's link, with the smaller end's utilisation: GPU k is at (k + 1) %.
            want = {f"{server}-gpu{i}|{server}-gpu{j}": (i + 1) / 100 for i in range(4)
                    for j in range(i + 1, 4)}  # fmt: skip
            wait_until(lambda: set(want) <= set(core.utilisation), what="mesh link use")
            for lid, u in want.items():
                assert core.utilisation[lid] == pytest.approx(u, rel=0.25), lid
            assert not any("nvsw" in lid for lid in core.utilisation)
            assert (reg.get_sample_value("heroserve_telemetry_records_dropped_total", dropped)
                    or 0.0) == 0.0  # fmt: skip
        else:
            # The old command line: its NVSwitch links are dropped and counted, not the report.
            wait_until(
                lambda: (reg.get_sample_value(
                    "heroserve_telemetry_records_dropped_total", dropped) or 0) >= 4,
                what="dropped NVSwitch links",
            )  # fmt: skip
            assert not any(lid.startswith(f"{server}-") for lid in core.utilisation)
    finally:
        if driver is not None:
            driver.stop()
        assert agent.stop() == 0, agent.text()
        for f in Path("/dev/shm").glob(f"heroserve-{prefix}*"):
            f.unlink()
