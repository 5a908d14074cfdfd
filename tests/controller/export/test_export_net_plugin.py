"""The export names the CollNet plugin (NCCL_NET_PLUGIN) and the GPU agent's INA group file
(HEROSERVE_INA_CONFIG) beside the tuner, on the servers whose instances have INA or
hierarchical-INA groups only (naming the plugin moves NCCL's point-to-point traffic to its
TCP net); the GPU agent of such a server writes the file (--ina-config); vLLM's Ray executor
does not carry them to other servers; values the environment cannot carry are refused."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from controller.export.options import DEFAULT_INA_CONFIG, DEFAULT_NET_PLUGIN
from controller.export.vllm import NON_CARRY_OVER
from tests.controller.export.test_export import _export, hand_plan


def _servers(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    dep = yaml.safe_load((out / "deployment.yaml").read_text())
    return {(i["name"], s["server"]): s["env"] for i in dep["instances"] for s in i["servers"]}


def test_servers_with_ina_groups_name_both_plugins_exactly(tmp_path: Path) -> None:
    rc, out = _export(hand_plan(), "deployment", tmp_path)
    assert rc == 0
    env = _servers(out)
    # prefill/0: flat INA at s1 on srv0 (CUDA 0 and 2).
    assert env[("prefill/0", "srv0")] == {
        "CUDA_VISIBLE_DEVICES": "0,2",
        "NCCL_TUNER_PLUGIN": "libnccl-tuner-heroserve.so",
        "HEROSERVE_GROUP": "prefill/0/0",
        "NCCL_COLLNET_ENABLE": "1",
        "NCCL_NET_PLUGIN": DEFAULT_NET_PLUGIN,
        "HEROSERVE_INA_CONFIG": DEFAULT_INA_CONFIG,
    }
    # decode/0: hierarchical INA (rails on s1 and s2) on srv2.
    assert env[("decode/0", "srv2")]["NCCL_NET_PLUGIN"] == "heroserve"
    assert env[("decode/0", "srv2")]["HEROSERVE_INA_CONFIG"] == "/run/heroserve/ina-config.json"
    # Ring instances keep NCCL's own nets: neither variable, nor CollNet.
    for ring in (("prefill/1", "srv1"), ("decode/1", "srv3")):
        assert env[ring] == {
            "CUDA_VISIBLE_DEVICES": "0,1" if ring[1] == "srv1" else "0,1,2,3",
            "NCCL_TUNER_PLUGIN": "libnccl-tuner-heroserve.so",
            "HEROSERVE_GROUP": f"{ring[0]}/0",
        }
    agents = {
        a["server"]: shlex.split(a["command"])
        for a in yaml.safe_load((out / "deployment.yaml").read_text())["gpu_agents"]
    }
    for server in ("srv0", "srv2"):
        argv = agents[server]
        assert argv[argv.index("--ina-config") + 1] == DEFAULT_INA_CONFIG
    for server in ("srv1", "srv3"):
        assert "--ina-config" not in agents[server]


def test_options_set_the_values(tmp_path: Path) -> None:
    rc, out = _export(
        hand_plan(),
        "deployment",
        tmp_path,
        "--net-plugin",
        "/opt/heroserve/lib/libnccl-net-heroserve.so",
        "--ina-config",
        "/var/run/hs/ina.json",
    )
    assert rc == 0
    env = _servers(out)[("decode/0", "srv2")]
    assert env["NCCL_NET_PLUGIN"] == "/opt/heroserve/lib/libnccl-net-heroserve.so"
    assert env["HEROSERVE_INA_CONFIG"] == "/var/run/hs/ina.json"


def test_vllm_does_not_carry_them_to_other_servers() -> None:
    # The list a multi-server instance's head writes for Ray (controller/export/vllm.py).
    assert {"NCCL_NET_PLUGIN", "HEROSERVE_INA_CONFIG"} <= set(NON_CARRY_OVER)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--net-plugin", "lib net.so"], "--net-plugin 'lib net.so': up to 255 letters"),
        (["--net-plugin", "x\ny"], "--net-plugin 'x\\ny'"),
        (["--net-plugin", "/opt/../etc/x.so"], "without a '..' component"),
        (["--net-plugin", ""], "--net-plugin ''"),
        (["--ina-config", "relative/ina.json"], "--ina-config 'relative/ina.json': an absolute"),
        (["--ina-config", "/run/$(id)"], "--ina-config '/run/$(id)'"),
        (["--ina-config", "/run/" + "a" * 300], "up to 255"),
    ],
)
def test_values_the_environment_cannot_carry_are_refused(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _export(hand_plan(), "deployment", tmp_path, *flags)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
