"""What the export tells each GPU agent about its board: on a mesh board
(the testbed's 4-GPU A100 and V100 servers: GPUs joined pairwise, no NVSwitch node) the
agent runs with ``--nvlink-mesh``, so it reports the mesh links the topology has instead of
``GPU|SERVER-nvsw``; on a board with a fabric node it keeps its default. The deployment
file's command and the k8s DaemonSet's both carry it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from controller.cli import main
from controller.export.layout import nvlink_args
from controller.topology import resolve_topology
from tests.controller.export.test_export import hand_plan


def test_each_board_gets_what_its_links_are_named_by() -> None:
    tb, fig2 = resolve_topology("testbed"), resolve_topology("fig2")
    assert nvlink_args(tb, "srv0-gpu0") == ["--nvlink-mesh"]  # GPU-GPU links, no fabric
    assert "srv0-nvsw" not in tb
    gpu = next(n for n, d in fig2.nodes(data=True) if d["kind"] == "gpu")
    assert nvlink_args(fig2, gpu) == []  # its server's NVSwitch node: the agent's default


def _deployment(tmp: Path, fmt: str, *extra: str) -> Path:
    pf = tmp / "plan.json"
    hand_plan().save(pf)
    out = tmp / fmt
    argv = ["export", "--plan", str(pf), "--format", fmt, "--out", str(out), *extra]
    assert main(argv) == 0
    return out


def test_the_deployment_runs_mesh_agents_with_nvlink_mesh(tmp_path: Path) -> None:
    dep = yaml.safe_load((_deployment(tmp_path, "deployment") / "deployment.yaml").read_text())
    agents = dep["gpu_agents"]
    assert {a["server"] for a in agents} == {"srv0", "srv1", "srv2", "srv3"}
    for a in agents:
        argv = shlex.split(a["command"])
        assert argv.count("--nvlink-mesh") == 1 and "--nvlink-peer" not in argv, a["command"]
        assert a["nvlink"] == ["--nvlink-mesh"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_k8s_agents_run_with_nvlink_mesh(tmp_path: Path, engine: str) -> None:
    out = _deployment(tmp_path, "k8s", "--engine", engine, "--heroserve-image", "reg.example/h:1")
    docs = [d for d in yaml.safe_load_all((out / "k8s.yaml").read_text()) if d]
    sets = [d for d in docs if d["kind"] == "DaemonSet" and "gpu-agent" in d["metadata"]["name"]]
    assert len(sets) == 4
    for d in sets:
        c = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "gpu-agent")
        argv = c.get("command", []) + c.get("args", [])
        assert "--nvlink-mesh" in argv, argv
