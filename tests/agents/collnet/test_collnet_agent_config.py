"""The controller's INA session hand-out reaches the CollNet plugin through the GPU agent.

End to end, without a GPU: a controller (real gRPC, loopback) admits a plan with a
hierarchical-INA group (tests/support/service.py, hier_plan: rail 0 = srv0-gpu0 and
srv1-gpu0 on switch s1); two heroserve-gpu-agent daemons (srv0 and srv1, one GPU each) write
their INA group configuration (--ina-config) from the InaAssignment they receive; the switch
model (agents/ina/loopback.py) is programmed from the same assignment, as the switch agent
would; two ranks of csrc/tests/collnet_harness.cc load libnccl-net-heroserve.so with
HEROSERVE_INA_CONFIG naming their agent's file and all-reduce through the switch, bit-exact.
Skipped without the C++ build (`make cxx`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.gpu_agent import AGENT, Proc, wait_until
from support.service import hier_plan

from agents.ina.loopback import LoopbackSwitch
from tests.agents.collnet.test_collnet_plugin import HARNESS, LIB, free_port

pytestmark = pytest.mark.skipif(
    not (AGENT.exists() and LIB.exists() and HARNESS.exists()),
    reason="heroserve-gpu-agent / libnccl-net-heroserve.so / collnet_harness not built",
)

RAIL = "prefill/0/0/rail0"
MEMBERS = ("srv0-gpu0", "srv1-gpu0")


@pytest.fixture
def controller(tmp_path: Path) -> Iterator:
    from controller.service.server import ControllerServer, ThreadedServer
    from controller.service.store import Store

    s = ThreadedServer(ControllerServer(Store(tmp_path / "c.db"), "127.0.0.1:0"))
    yield s
    s.stop()


def _entries(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())["groups"]
    except (OSError, ValueError, KeyError):
        return []  # not written yet


def test_agents_write_the_controllers_groups_and_the_plugin_sums_exactly_with_them(
    controller, tmp_path: Path
) -> None:
    epoch, _ = controller.call(lambda: controller.server.core.apply_plan(hier_plan().to_json()))
    a = controller.server.core.state.ina_by_name[RAIL]
    assert [m.gpu for m in a.members] == list(MEMBERS)
    prefix = f"pytest{os.getpid()}w{time.monotonic_ns() % 1000000}."
    with LoopbackSwitch() as sw:
        sw.add_group(a.group_id, a.slots.count, [1, 2])
        agents, configs, binds = [], [], []
        try:
            for k, gpu in enumerate(MEMBERS):
                server = gpu.split("-")[0]
                cfg, bind = tmp_path / f"{server}-ina.json", free_port()
                sw.register(k + 1, ("127.0.0.1", bind))
                argv = [str(AGENT), "--controller", f"127.0.0.1:{controller.port}"]
                argv += ["--node-id", server, "--gpu", f"{gpu}:0", "--ina-config", str(cfg)]
                argv += ["--ina-switch", f"s1={sw.address[0]}:{sw.address[1]}"]
                argv += ["--ina-switch", "s2=127.0.0.1", "--ina-bind", f"127.0.0.1:{bind}"]
                env = dict(os.environ, HEROSERVE_SHM_PREFIX=prefix)
                agents.append(Proc(argv, env, tmp_path / f"{server}.log"))
                configs.append(cfg)
                binds.append(bind)
            for cfg, ag in zip(configs, agents, strict=True):
                wait_until(
                    lambda c=cfg: any(e["group_name"] == RAIL for e in _entries(c)),
                    what=f"{cfg.name} written\n{ag.text()}",
                )
            # What each agent wrote: its GPU's entry of the rail, from the controller's values.
            for k, cfg in enumerate(configs):
                (mine,) = [e for e in _entries(cfg) if e["group_name"] == RAIL]
                assert mine == {
                    "group_id": a.group_id,
                    "num_workers": 2,
                    "worker_id": k,
                    "window": a.slots.count,
                    "switch_ip": sw.address[0],
                    "switch_port": sw.address[1],
                    "session": epoch,
                    "first_generation": a.first_generation,
                    "bind_ip": "127.0.0.1",
                    "bind_port": binds[k],
                    "lane_format": "int32",
                    "gpu": MEMBERS[k],
                    "group_name": RAIL,
                }
                # The rail is the file's first entry: the one a new communicator claims.
                assert _entries(cfg)[0]["group_name"] == RAIL
            d = tmp_path / "handles"
            d.mkdir()
            ranks = []
            for k, cfg in enumerate(configs):
                cmd = [str(HARNESS), "--lib", str(LIB), "--dir", str(d), "--rank", str(k)]
                cmd += ["--nranks", "2", "--types", "int32,uint8", "--sizes", "4,4096,65536"]
                ranks.append(
                    subprocess.Popen(
                        cmd,
                        env=dict(os.environ, HEROSERVE_INA_CONFIG=str(cfg)),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            results = []
            for p in ranks:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, err[-3000:]
                results += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        finally:
            for ag in agents:
                ag.stop()
            for f in Path("/dev/shm").glob(f"heroserve-{prefix}*"):
                f.unlink()
    sums = [e for e in results if e.get("event") == "result"]
    assert len(sums) == 2 * 2 * 3  # two ranks, two types, three sizes
    assert all(e["exact"] for e in sums), sums
    assert sw.stats.frames_out > 0 and sw.stats.unknown_sender == 0  # through the switch
