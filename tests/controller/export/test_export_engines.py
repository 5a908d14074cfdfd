"""`heroserve export --format vllm|sglang` deploys a P/D pool an engine can serve: a plan the
engine cannot run is refused in one line naming the rule; each server's script starts Ray
heads before workers and engines, waits for each engine's /health, binds the KV side
channel to the server's address, gives instances on one server distinct ports, and a router
joins each pool's prefill and decode URLs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from controller.cli import main
from controller.plan import Instance, KVTransfer, Plan
from tests.controller.export.test_export import _group, hand_plan


def _plan(tmp: Path, *args: str) -> Path:
    out = tmp / "plan.json"
    assert main(["plan", "--planner", "heroserve", "--quiet", "--json", str(out), *args]) == 0
    return out


def _export(plan: Path, fmt: str, tmp: Path, *extra: str) -> tuple[int, Path]:
    out = tmp / f"out-{fmt}"
    argv = ["export", "--plan", str(plan), "--format", fmt, "--out", str(out), *extra]
    return main(argv), out


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def _functions(script: str) -> dict[str, list[str]]:
    """Function name -> its body's lines, in order."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^(on_\w+)\(\) \{\n(.*?)^\}", script, re.S | re.M):
        out[m.group(1)] = [ln.strip() for ln in m.group(2).splitlines()]
    return out


@pytest.fixture(scope="module")
def vllm_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _plan(tmp_path_factory.mktemp("vllm"), "--engine", "vllm")


def test_vllm_refuses_the_neutral_plans_pipelined_decode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(tmp_path, "--decode-par", "4x2")  # a plan made for no engine: decode 4x2
    capsys.readouterr()
    rc, out = _export(plan, "vllm", tmp_path)
    err = _one_line(capsys)
    assert rc == 2 and "vllm cannot run this plan" in err and "decode with PP <= 1" in err
    assert not out.exists()
    rc, _ = _export(plan, "sglang", tmp_path)  # SGLang pipelines decode
    assert rc == 0


def test_sglang_refuses_an_uneven_split_and_opt175b_needs_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.controller.planner.test_planner_engine import _uneven

    topo = _uneven(tmp_path)
    plan = _plan(tmp_path, "--topology", str(topo), "--model", "OPT-175B", "--prefill-par", "1x12")
    capsys.readouterr()
    at = ("--topology", str(topo))
    rc, out = _export(plan, "sglang", tmp_path, *at)
    err = _one_line(capsys)
    assert rc == 2 and "sglang cannot run this plan" in err and "8+4 GPUs on 2 servers" in err
    assert not out.exists()
    rc, out = _export(plan, "vllm", tmp_path, *at)  # vLLM runs it, from a checkpoint it is given
    err = _one_line(capsys)
    assert rc == 2 and "OPT-175B has no public checkpoint: pass --model-path" in err
    rc, out = _export(plan, "vllm", tmp_path, *at, "--model-path", "/models/opt-175b")
    assert rc == 0
    doc = json.loads((out / "vllm.json").read_text())
    serve = [c["argv"] for c in doc["commands"] if c["what"] == "engine"]
    assert all(a[:3] == ["vllm", "serve", "/models/opt-175b"] for a in serve)


def test_vllm_scripts_start_in_dependency_order(vllm_plan: Path, tmp_path: Path) -> None:
    rc, out = _export(vllm_plan, "vllm", tmp_path)
    assert rc == 0
    script = (out / "vllm.sh").read_text()
    subprocess.run(["bash", "-n", str(out / "vllm.sh")], check=True)
    doc = json.loads((out / "vllm.json").read_text())
    fns = _functions(script)
    heads = {c["instance"]: c for c in doc["commands"] if c["what"] == "ray head"}
    assert heads, "the testbed's vLLM plan has an instance over two servers"
    for c in doc["commands"]:
        body = fns["on_" + c["server"]]
        line = body.index(f"# {c['instance']}: {c['what']}") + 1  # the comment, then it
        if c["what"] == "ray worker":  # waits for its head's port, then joins it
            gcs = _flag(heads[c["instance"]]["argv"], "--port")
            assert c["after"].endswith(f":{gcs}") and _flag(c["argv"], "--address") == c["after"]
            assert body[line] == f"wait_port {c['after']}"
            line += 1
        assert c["argv"][0] in body[line]
        if c["what"] in ("ray head", "ray worker"):  # every engine starts after Ray is up
            assert all("vllm serve" not in ln for ln in body[:line])
        if c["what"] == "engine":
            assert f"wait_up {c['health']}" in body[line:]
            assert body[-1] == "wait"
            if c["instance"] in heads:  # serves on its own Ray cluster, after its head
                head = heads[c["instance"]]
                assert c["env"]["RAY_ADDRESS"] == f"{c['server']}:{_flag(head['argv'], '--port')}"
                assert head["server"] == c["server"] and head["stage"] < c["stage"]
                non_carry = next(
                    x for x in doc["commands"]
                    if x["what"] == "vllm config" and x["instance"] == c["instance"]
                )  # fmt: skip
                # written into the run's own new folder, never a fixed name in /tmp
                assert c["env"]["VLLM_CONFIG_ROOT"] == non_carry["argv"][4]
                assert c["env"]["VLLM_CONFIG_ROOT"].startswith("${RUN}/")
                assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in non_carry["argv"][5]
        if c["what"] in ("engine", "ray head", "ray worker"):  # each binds its own address
            assert c["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "${ADDR}"
    for name, body in fns.items():
        if name != "on_router":
            assert body[0] == f"ADDR=$(addr_of {name[3:]})"
    # the router waits for its pool, then joins its prefill and decode URLs
    router = next(c for c in doc["commands"] if c["what"] == "router")
    urls = {i["name"]: i["url"] for i in doc["instances"]}
    for pool in doc["pools"]:
        assert [_flag(router["argv"], "--prefill")] == [urls[n] for n in pool["prefill"]]
        assert [_flag(router["argv"], "--decode")] == [urls[n] for n in pool["decode"]]
    assert "--vllm-pd-disaggregation" in router["argv"]
    assert fns["on_router"][1:3] == [f"wait_up {u}" for u in urls.values()]
    # a pipelined prefill keeps a request per stage in flight
    for c in doc["commands"]:
        if c["what"] == "engine" and c["instance"].startswith("prefill"):
            pp = int(_flag(c["argv"], "--pipeline-parallel-size"))
            assert int(_flag(c["argv"], "--max-num-seqs")) >= pp > 1


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _shared_server_plan() -> Plan:
    """hand_plan with both decode instances (TP=2) on srv2."""
    p = hand_plan()
    d0, d1 = ["srv2-gpu0", "srv2-gpu1"], ["srv2-gpu2", "srv2-gpu3"]
    p.decode.tp = 2
    p.decode.instances = [Instance([d0]), Instance([d1])]
    p.decode.groups = [_group(0, d0), _group(1, d1)]
    p.kv_transfer[1] = KVTransfer(
        "srv1-gpu0", "srv2-gpu2", 1e6, ["srv1-gpu0", "s1", "srv2-gpu2"], 1e-4
    )
    return p


def _ports(c: dict) -> set[int]:
    """Every port ``c`` opens on its server."""
    out = {int(_flag(c["argv"], f)) for f in c["argv"] if f.endswith("port") and f.startswith("--")}
    out.discard(0)
    if "--node-manager-port" in c["argv"]:  # Ray's workers take a range
        lo, hi = (
            int(_flag(c["argv"], "--min-worker-port")),
            int(_flag(c["argv"], "--max-worker-port")),
        )
        out |= set(range(lo, hi + 1))
    if "VLLM_NIXL_SIDE_CHANNEL_PORT" in c["env"]:
        tp = (
            int(_flag(c["argv"], "--tensor-parallel-size"))
            if "--tensor-parallel-size" in c["argv"]
            else 1
        )
        side = int(c["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        out |= set(range(side, side + tp))
    return out


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_instances_on_one_server_open_distinct_ports(fmt: str, tmp_path: Path) -> None:
    pf = tmp_path / "plan.json"
    _shared_server_plan().save(pf)
    rc, out = _export(pf, fmt, tmp_path, "--address", "srv2=10.0.0.2")
    assert rc == 0
    doc = json.loads((out / f"{fmt}.json").read_text())
    on_srv2 = [c for c in doc["commands"] if c["server"] == "srv2" and c["what"] == "engine"]
    assert sorted(c["instance"] for c in on_srv2) == ["decode/0", "decode/1"]
    a, b = (_ports(c) for c in on_srv2)
    assert a and b and not a & b
    for c in on_srv2:  # --address binds the side channel to the given address
        host_env = "VLLM_NIXL_SIDE_CHANNEL_HOST" if fmt == "vllm" else "SGLANG_HOST_IP"
        assert c["env"][host_env] == "10.0.0.2"
    assert "ADDR=" not in _functions((out / f"{fmt}.sh").read_text())["on_srv2"][0]


def test_bad_address_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    hand_plan().save(pf)
    for bad in ("srv9=10.0.0.1", "srv0=nowhere", "srv0"):
        rc, _ = _export(pf, "vllm", tmp_path, "--address", bad)
        assert rc == 2 and f"--address {bad!r}" in _one_line(capsys)


def test_ray_blocks_are_reused_across_servers_and_bounded() -> None:
    """Ray port blocks were 20000 + 1000 k for instance k: from the 46th instance on, past
    65535 (decode 30 of a 1,024-GPU 2tracks plan got --port 66000) with exit 0. Instances on
    distinct servers now share block 0; 45 blocks fit on one server, a 46th is refused."""
    from types import SimpleNamespace as NS

    from controller.errors import InputError
    from controller.export.vllm import RAY_BLOCKS, ray_blocks

    def inst(name: str, *servers: str) -> NS:
        return NS(name=name, servers=[NS(server=s) for s in servers])

    apart = [inst(f"decode/{k}", f"a{k}", f"b{k}") for k in range(200)]
    assert set(ray_blocks(apart).values()) == {20000}
    # a chain: each instance shares a server with the one before, so two blocks alternate
    chain = [inst(f"d/{k}", f"s{k}", f"s{k + 1}") for k in range(50)]
    assert set(ray_blocks(chain).values()) == {20000, 21000}
    assert RAY_BLOCKS == 45 and 20000 + 1000 * RAY_BLOCKS - 1 <= 65535
    same = [inst(f"d/{k}", "s0", f"x{k}") for k in range(RAY_BLOCKS)]
    assert max(ray_blocks(same).values()) == 20000 + 1000 * (RAY_BLOCKS - 1)  # 64000..64999
    with pytest.raises(InputError, match="d/45: its servers hold 45 other multi-server"):
        ray_blocks([*same, inst("d/45", "s0", "y")])


def test_ports_past_65535_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pf = tmp_path / "plan.json"
    hand_plan().save(pf)  # four instances: HTTP ports base .. base + 3
    rc, _ = _export(pf, "vllm", tmp_path, "--base-port", "64511")
    assert rc == 0
    from controller.errors import InputError
    from controller.export.engines import checked_port

    with pytest.raises(InputError, match="port 65536 is not in 1..65535"):
        checked_port(65536, "x")
