"""``heroserve export``: every format parses, names every GPU of
the plan once, carries each instance's TP/PP and batch, pairs instances as the plan does,
never sets NCCL_ALGO/NCCL_PROTO; a plan that contradicts its topology is refused, named."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.cli import main
from controller.export.script import _q
from controller.inputs.plan_checks import load_plan
from controller.plan import (
    SLA,
    Group,
    Instance,
    KVTransfer,
    PhasePlan,
    Plan,
    Predicted,
    Rail,
    SlotRange,
)

FORMATS = ("deployment", "vllm", "sglang")


def _group(inst: int, gpus: list[str], scheme: str = "ring", **kw: object) -> Group:
    paths = kw.pop("paths", {})
    return Group(
        instance=inst, stage=kw.pop("stage", 0), gpus=gpus, scheme=scheme,  # type: ignore[arg-type]
        switch=kw.pop("switch", None), slots=kw.pop("slots", None), paths=paths,  # type: ignore[arg-type]
        allreduce_s=1e-5, ina_s=None, ring_s=1e-5, reason="test", **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def hand_plan() -> Plan:
    """The testbed with the paper's roles (A100 servers prefill, V100 servers decode),
    OPT-13B: prefill/0 TP2 on srv0 with INA at s1 (GPUs 0 and 2 are on s1),
    prefill/1 TP2 on srv1 with ring; decode/0 TP4 on srv2 with hierarchical INA (rails on s1
    and s2) and its own batch 40, decode/1 TP4 on srv3 with ring. KV: prefill/i -> decode/i."""
    p0, p1 = ["srv0-gpu0", "srv0-gpu2"], ["srv1-gpu0", "srv1-gpu1"]
    d0, d1 = [f"srv2-gpu{i}" for i in range(4)], [f"srv3-gpu{i}" for i in range(4)]
    prefill = PhasePlan(
        role="prefill", tp=2, pp=1, gpu_type="A100-40GB",
        instances=[Instance([p0]), Instance([p1])],
        groups=[
            _group(0, p0, "ina", switch="s1", slots=SlotRange(0, 8),
                   paths={g: [g, "s1"] for g in p0}),
            _group(1, p1),
        ],
        comm_s=1e-3, compute_s=1e-2, batch_size=2, rate_per_instance=5.0,
    )  # fmt: skip
    rails = [
        Rail("s1", 0, 2, ["srv2-gpu0"], SlotRange(8, 4), {"srv2-gpu0": ["srv2-gpu0", "s1"]}),
        Rail("s2", 1, 2, ["srv2-gpu1"], SlotRange(0, 4), {"srv2-gpu1": ["srv2-gpu1", "s2"]}),
    ]
    decode = PhasePlan(
        role="decode", tp=4, pp=1, gpu_type="V100-32GB",
        instances=[Instance([d0], batch=40), Instance([d1])],
        groups=[_group(0, d0, "hier", rails=rails), _group(1, d1)],
        comm_s=1e-3, compute_s=1e-2, batch_size=46, rate_per_instance=4.0,
    )  # fmt: skip
    kv = [
        KVTransfer("srv0-gpu0", "srv2-gpu0", 1e6, ["srv0-gpu0", "s1", "srv2-gpu0"], 1e-4),
        KVTransfer("srv1-gpu1", "srv3-gpu1", 1e6, ["srv1-gpu1", "s2", "srv3-gpu1"], 1e-4),
    ]
    return Plan(
        "heroserve", "testbed-paper", "OPT-13B", "chatbot", SLA(2.5, 0.15),
        prefill, decode, kv, Predicted(0.1, 0.1, 1e-3, 9.0, 0.75, 12),
    )  # fmt: skip


def _export(plan: Plan, fmt: str, tmp: Path, *extra: str) -> tuple[int, Path]:
    pf = tmp / "plan.json"
    plan.save(pf)
    out = tmp / fmt
    return main(["export", "--plan", str(pf), "--format", fmt, "--out", str(out), *extra]), out


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def planned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """The testbed plan `heroserve plan --engine E` makes (whatever the planner chooses)."""
    path = tmp_path_factory.mktemp("plan") / "tb.json"
    argv = ["plan", "--planner", "heroserve", "--quiet", "--engine", request.param]
    assert main([*argv, "--json", str(path)]) == 0
    return load_plan(path)


# every server of the testbed at an address, so that the scripts hold no ${ADDR}
ADDRESSES = [f"--address=srv{i}=10.0.0.{i}" for i in range(4)]


def _expected(plan: Plan) -> dict[str, dict]:
    out = {}
    for ph in (plan.prefill, plan.decode):
        for i, inst in enumerate(ph.instances):
            out[f"{ph.role}/{i}"] = {
                "tp": ph.tp, "pp": ph.pp, "batch": inst.batch or ph.batch_size,
                "gpus": [g for st in inst.stages for g in st],
            }  # fmt: skip
    return out


def _pairs(plan: Plan) -> set[tuple[str, str]]:
    owner = {g: n for n, e in _expected(plan).items() for g in e["gpus"]}
    return {(owner[k.src], owner[k.dst]) for k in plan.kv_transfer}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def check_all_formats(plan: Plan, tmp: Path, formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    want, pairs = _expected(plan), _pairs(plan)
    outs = {}
    for fmt in formats:
        rc, out = _export(plan, fmt, tmp, *(ADDRESSES if fmt != "deployment" else ()))
        assert rc == 0
        outs[fmt] = out
        for f in out.iterdir():
            assert not re.search(r"NCCL_(ALGO|PROTO)\s*[=:]", f.read_text()), f
    # deployment: YAML, every GPU once, TP/PP/batch, KV peers as the plan pairs them
    if "deployment" not in outs:
        rc, outs["deployment"] = _export(plan, "deployment", tmp)
        assert rc == 0
    dep = yaml.safe_load((outs["deployment"] / "deployment.yaml").read_text())
    seen = [g for inst in dep["instances"] for s in inst["servers"] for g in s["gpu_ids"]]
    assert sorted(seen) == sorted(plan.all_gpus()) and len(seen) == len(set(seen))
    got_pairs = set()
    for inst in dep["instances"]:
        w = want[inst["name"]]
        assert (inst["tp"], inst["pp"], inst["batch"]) == (w["tp"], w["pp"], w["batch"])
        assert [g for s in inst["servers"] for g in s["gpu_ids"]] == w["gpus"]
        for s in inst["servers"]:
            assert "NCCL_TUNER_PLUGIN" in s["env"]
            assert s["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, s["gpus"]))
        for p in inst["kv_peers"]:
            pair = (inst["name"], p["instance"])
            got_pairs.add(pair if inst["role"] == "prefill" else pair[::-1])
    assert got_pairs == pairs
    # vllm and sglang: the shell parses, the JSON lists the same commands
    for fmt in (f for f in formats if f != "deployment"):
        sh = outs[fmt] / f"{fmt}.sh"
        subprocess.run(["bash", "-n", str(sh)], check=True)
        doc = json.loads((outs[fmt] / f"{fmt}.json").read_text())
        text = sh.read_text()
        for c in doc["commands"]:
            # quoted as the scripts quote (test_export_hostile.py runs what this gives)
            env = " ".join(f"{k}={_q(v)}" for k, v in c["env"].items())
            assert (env + " " + " ".join(map(_q, c["argv"]))).strip() in text
        gpus = [g for inst in doc["instances"] for s in inst["servers"] for g in s["gpu_ids"]]
        assert sorted(gpus) == sorted(plan.all_gpus()) and len(gpus) == len(set(gpus))
        inst_pairs = {
            (i["name"], p)
            for i in doc["instances"]
            if i["role"] == "prefill"
            for p in i["kv_peers"]
        }
        assert inst_pairs == pairs
        engines = [c for c in doc["commands"] if c["what"].startswith("engine")]
        # a prefill keeps a request per stage in flight and at least the engine's default
        # (256), so that its batches fill; a decode instance its batch
        limit = {n: max(w["batch"], w["pp"], 256) if n.startswith("prefill") else w["batch"]
                 for n, w in want.items()}  # fmt: skip
        for c in engines:
            w, argv = want[c["instance"]], c["argv"]
            servers = {
                s["server"]: s
                for i in doc["instances"]
                for s in i["servers"]
                if i["name"] == c["instance"]
            }
            cuda = ",".join(map(str, servers[c["server"]]["gpus"]))
            assert c["env"]["CUDA_VISIBLE_DEVICES"] == cuda
            if fmt == "vllm":
                assert int(_flag(argv, "--tensor-parallel-size")) == w["tp"]
                assert int(_flag(argv, "--pipeline-parallel-size")) == w["pp"]
                assert int(_flag(argv, "--max-num-seqs")) == limit[c["instance"]]
                role = json.loads(_flag(argv, "--kv-transfer-config"))["kv_role"]
                assert role == (
                    "kv_producer" if c["instance"].startswith("prefill") else "kv_consumer"
                )
            else:
                assert int(_flag(argv, "--tp-size")) == w["tp"]
                assert int(_flag(argv, "--pp-size")) == w["pp"]
                assert int(_flag(argv, "--max-running-requests")) == limit[c["instance"]]
                assert _flag(argv, "--disaggregation-mode") == c["instance"].split("/")[0]
            assert ("--disable-custom-all-reduce" in argv) == (w["tp"] > 1)
    return outs


def test_the_planners_testbed_plan_exports_for_its_engine(planned: Plan, tmp_path: Path) -> None:
    check_all_formats(planned, tmp_path, ("deployment", planned.options["engine"]))


def test_hand_plan_exports_groups_rails_batches_and_pools(tmp_path: Path) -> None:
    outs = check_all_formats(hand_plan(), tmp_path)
    dep = yaml.safe_load((outs["deployment"] / "deployment.yaml").read_text())
    inst = {i["name"]: i for i in dep["instances"]}
    ina = inst["prefill/0"]["groups"][0]
    assert (ina["scheme"], ina["switch"], ina["slots"]) == ("ina", "s1", {"start": 0, "count": 8})
    assert inst["prefill/0"]["servers"][0]["env"]["NCCL_COLLNET_ENABLE"] == "1"
    assert "NCCL_COLLNET_ENABLE" not in inst["prefill/1"]["servers"][0]["env"]
    hier = inst["decode/0"]["groups"][0]
    assert [(r["switch"], r["shard"], r["members"], r["slots"]) for r in hier["rails"]] == [
        ("s1", 0, ["srv2-gpu0"], {"start": 8, "count": 4}),
        ("s2", 1, ["srv2-gpu1"], {"start": 0, "count": 4}),
    ]
    assert inst["decode/0"]["batch"] == 40 and inst["decode/1"]["batch"] == 46
    assert inst["decode/0"]["servers"][0]["env"]["HEROSERVE_GROUP"] == "decode/0/0"
    agents = {a["server"]: a for a in dep["gpu_agents"]}
    assert agents["srv2"]["shm"] == ["/dev/shm/heroserve-decode.0.0"]
    assert "--gpu srv2-gpu3:3" in agents["srv2"]["command"]
    sg = json.loads((outs["sglang"] / "sglang.json").read_text())
    # one router over every instance, whatever pairs the plan priced (prefill/0 with
    # decode/0, prefill/1 with decode/1): any prefill may hand its KV to any decode
    assert sg["pools"] == [
        {
            "prefill": ["prefill/0", "prefill/1"],
            "decode": ["decode/0", "decode/1"],
            "router": "http://127.0.0.1:8000",
        }
    ]
    (router,) = [c["argv"] for c in sg["commands"] if c["what"] == "router"]
    assert [router[i + 1] for i, x in enumerate(router) if x == "--prefill"] == [
        "http://10.0.0.0:8100",
        "http://10.0.0.1:8101",
    ]
    assert [router[i + 1] for i, x in enumerate(router) if x == "--decode"] == [
        "http://10.0.0.2:8102",
        "http://10.0.0.3:8103",
    ]
    assert router[router.index("--policy") + 1] == "power_of_two"


def _broken(change) -> Plan:  # noqa: ANN001 - a function that edits the plan
    p = hand_plan()
    change(p)
    return p


def _swap(p: Plan, a: tuple[str, int, int], b: tuple[str, int, int]) -> None:
    """Swap one GPU of one ring instance with one of another: the plan stays consistent
    (each GPU once), only the cluster can object."""
    (pa, ia, ja), (pb, ib, jb) = a, b
    sa = getattr(p, pa).instances[ia].stages[0]
    sb = getattr(p, pb).instances[ib].stages[0]
    sa[ja], sb[jb] = sb[jb], sa[ja]


@pytest.mark.parametrize(
    "change, says",
    [
        (  # instance 1's GPU 0: its list is its ring group's too (no paths); no KV names it
            lambda p: p.prefill.instances[1].stages[0].__setitem__(0, "srv9-gpu0"),
            "GPU 'srv9-gpu0' is not in topology 'testbed-paper'",
        ),
        (
            lambda p: p.prefill.instances[1].stages[0].__setitem__(0, "s1"),
            "GPU 's1' is not in topology 'testbed-paper'",
        ),
        (lambda p: setattr(p, "model", "OPT-66B"), "cannot hold its 1/2 weight shard"),
        (
            lambda p: _swap(p, ("prefill", 1, 0), ("decode", 1, 2)),
            "GPU 'srv3-gpu2' is reserved for decode",
        ),
        (
            lambda p: setattr(p.kv_transfer[0], "path", ["srv0-gpu0", "s2", "srv2-gpu0"]),
            "hop srv0-gpu0 - s2 of srv0-gpu0's path is not a link of 'testbed-paper'",
        ),
        (
            lambda p: setattr(p.decode.groups[0].rails[0], "switch", "srv2-nvsw"),
            "srv2-nvsw",
        ),
        (lambda p: setattr(p, "model", "GPT-5"), "unknown model 'GPT-5'"),
        (
            lambda p: p.options.__setitem__("ina_lanes", "fp16"),
            "plan priced for 'fp16' INA lanes, but the switches' program "
            "(p4/heroserve_ina.p4) aggregates int32 or bfp16 lanes",
        ),
    ],
)
def test_a_plan_that_contradicts_its_topology_is_refused(
    change,
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],  # noqa: ANN001
) -> None:
    rc, out = _export(_broken(change), "deployment", tmp_path)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_bad_command_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--plan", str(tmp_path / "none.json"), "--format", "vllm"]) == 2
    assert "does not exist" in capsys.readouterr().err
    p = hand_plan()
    p.topology = "nowhere"
    rc, _ = _export(p, "vllm", tmp_path)
    assert rc == 2 and "give its cluster with --topology" in capsys.readouterr().err
    rc, _ = _export(hand_plan(), "vllm", tmp_path, "--topology", "testbed", "--base-port", "70000")
    assert rc == 2 and "--base-port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--shm-prefix", "../../etc/x"], "--shm-prefix '../../etc/x': up to 64 letters"),
        (["--shm-prefix", "a/b"], "--shm-prefix 'a/b'"),
        (["--shm-prefix", "x..y"], "without '..'"),
        (["--controller", "not an address"], "--controller 'not an address': spaces"),
        (["--controller", "ctl:99999"], "--controller 'ctl:99999': port 99999 is not in 1..65535"),
        (["--controller", "ctl"], "--controller 'ctl' is not HOST:PORT"),
        (["--model-path", "m\nx"], "--model-path 'm\\nx': control characters"),
    ],
)
def test_options_the_files_cannot_carry_are_refused(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _export(hand_plan(), "deployment", tmp_path, *flags)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_servers_whose_names_differ_only_in_punctuation_get_their_own_function(
    tmp_path: Path,
) -> None:
    """``srv-0``, ``srv_0``, ``srv.0`` and ``srv:0`` once all became ``on_srv_0``: bash kept
    the last definition, so three servers would have run the fourth's engines."""
    from controller.export.engines import Command
    from controller.export.layout import Options
    from controller.export.script import render_shell
    from controller.models.engines import engine_profile

    servers = ["srv-0", "srv_0", "srv.0", "srv:0", "srv__0", "srv_2d0"]
    # stage 0 (as a Ray head): run in the foreground, its output on the script's stdout
    cmds = [Command(s, "prefill/0", ["echo", f"engine of {s}"], stage=0) for s in servers]
    script = tmp_path / "x.sh"
    script.write_text(render_shell("vllm", engine_profile("vllm"), cmds, [], Options()))
    for s in servers:
        r = subprocess.run(["bash", str(script), s], capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, f"engine of {s}\n"), r.stderr
