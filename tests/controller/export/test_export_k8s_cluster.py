"""`--format k8s` as a cluster runs it: pinned images (checked references), /dev/shm, the model
volume, the token Secret, RDMA and IPC_LOCK, the NCCL plugins from the GPU agent's DaemonSet,
the controller with its plan and certificates, the switch agents, placement by node label,
and that the validation refuses a broken manifest."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from controller.cli import main
from controller.errors import InputError
from controller.export.k8s_names import IMAGE_REF, PLUGIN_LIBS, SERVER_LABEL, check_image
from controller.inputs.plan_checks import load_plan
from controller.models.engines import PROFILES
from controller.plan import Plan
from tests.controller.export.test_export import hand_plan

pytest.importorskip("kubernetes_validate")
pytest.importorskip("jsonschema")
from tests.controller.export.k8s_validate import pod_templates, problems  # noqa: E402

IMAGE = "registry.example/heroserve:0.1.0"
ROOT = Path(__file__).resolve().parents[3]


def _export(tmp: Path, *extra: str, plan: Plan | None = None, engine: str = "vllm") -> list[dict]:
    path = tmp / "plan.json"
    (plan or hand_plan()).save(path)
    argv = ["export", "--plan", str(path), "--format", "k8s", "--out", str(tmp / "o"),
            "--engine", engine, "--heroserve-image", IMAGE, *extra]  # fmt: skip
    assert main(argv) == 0
    return [d for d in yaml.safe_load_all((tmp / "o" / "k8s.yaml").read_text()) if d]


def _refused(tmp: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    path = tmp / "plan.json"
    hand_plan().save(path)
    argv = ["export", "--plan", str(path), "--format", "k8s", "--out", str(tmp / "o"),
            "--engine", "vllm", *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not (tmp / "o" / "k8s.yaml").exists()
    return err


def _engines(docs: list[dict]) -> list[dict]:
    return [
        t["spec"]
        for d in docs
        if "heroserve.io/instance" in d["metadata"]["labels"]
        for t in pod_templates(d)
    ]


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_profile_images_are_pinned_releases_in_range(engine: str) -> None:
    p = PROFILES[engine]
    tag = IMAGE_REF.fullmatch(check_image("--image", p.image))["tag"]
    assert Version(tag.removeprefix("v")) in SpecifierSet(p.versions)
    router = check_image("--router-image", p.router_image)
    assert "router" in router.split(":")[0]  # the router's own image, not the engine's


@pytest.mark.parametrize(
    "ref",
    ["vllm/vllm-openai", "vllm/vllm-openai:latest", "vllm/vllm-openai:v1 ", "a:b\nc",
     "Vllm/x:1", "x:1@sha256:12", "", "reg.example:5000//x:1"],
)  # fmt: skip
def test_an_image_reference_must_be_one_and_pinned(ref: str) -> None:
    with pytest.raises(InputError):
        check_image("--image", ref)


def test_image_references_that_are(tmp_path: Path) -> None:
    for ref in ("reg.example:5000/team/heroserve:0.1.0", "heroserve:0.1", "x@sha256:" + "a" * 64):
        assert check_image("--image", ref) == ref


def test_k8s_options_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--heroserve-image" in _refused(tmp_path, capsys)
    hi = ("--heroserve-image", IMAGE)
    assert "pin a release" in _refused(tmp_path, capsys, *hi, "--image", "vllm/vllm-openai:latest")
    assert "--dev-shm" in _refused(tmp_path, capsys, *hi, "--dev-shm", "lots")
    assert "--model-path /models/" in _refused(tmp_path, capsys, *hi, "--model-volume", "pvc:w")
    assert "pvc:CLAIM" in _refused(tmp_path, capsys, *hi, "--model-volume", "nfs:/x")
    assert "--rdma-resource" in _refused(tmp_path, capsys, *hi, "--rdma-resource", "rdma hca")
    assert "--plugin-dir" in _refused(tmp_path, capsys, *hi, "--plugin-dir", "lib")


def test_engine_pods_get_shm_plugins_token_and_placement(tmp_path: Path) -> None:
    docs = _export(tmp_path)
    specs = _engines(docs)
    assert len(specs) == 4  # four one-server instances
    servers = []
    for spec in specs:
        (c,) = spec["containers"]
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["dshm"]["hostPath"]["path"] == "/dev/shm"  # shared with the GPU agent
        assert vols["heroserve-lib"]["hostPath"]["path"] == "/opt/heroserve/lib"
        env = {e["name"]: e for e in c["env"]}
        assert env["NCCL_TUNER_PLUGIN"]["value"] == "/opt/heroserve/lib/libnccl-tuner-heroserve.so"
        ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "heroserve-hf-token", "key": "token", "optional": True}
        assert "securityContext" not in c and list(c["resources"]["limits"]) == ["nvidia.com/gpu"]
        node = spec["affinity"]["nodeAffinity"]
        required = node["requiredDuringSchedulingIgnoredDuringExecution"]
        (term,) = required["nodeSelectorTerms"]
        (expr,) = term["matchExpressions"]
        assert expr["key"] == SERVER_LABEL
        servers += expr["values"]
    assert servers == ["srv0", "srv1", "srv2", "srv3"]  # the plan's, one instance each


def test_options_give_emptydir_model_volume_and_rdma(tmp_path: Path) -> None:
    docs = _export(tmp_path, "--dev-shm", "64Gi", "--model-volume", "pvc:weights",
                   "--model-path", "/models/opt-13b", "--rdma-resource", "rdma/hca",
                   "--plugin-dir", "/var/lib/heroserve/lib")  # fmt: skip
    for spec in _engines(docs):
        (c,) = spec["containers"]
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
        assert vols["models"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
        assert "/models/opt-13b" in c["command"]
        assert c["resources"]["limits"] == {
            "nvidia.com/gpu": c["resources"]["limits"]["nvidia.com/gpu"],
            "rdma/hca": 1,
        }  # noqa: E501
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NCCL_TUNER_PLUGIN"] == "/var/lib/heroserve/lib/libnccl-tuner-heroserve.so"
    assert all(problems(d) == [] for d in docs)
    host = _export(tmp_path, "--model-volume", "hostpath:/data/w", "--model-path", "/models/x")
    (vol,) = [v for v in _engines(host)[0]["volumes"] if v["name"] == "models"]
    assert vol["hostPath"] == {"path": "/data/w", "type": "Directory"}


def test_plugin_libraries_are_the_ones_csrc_builds(tmp_path: Path) -> None:
    cmake = (ROOT / "csrc" / "CMakeLists.txt").read_text()
    built = {f"lib{t}.so" for t in re.findall(r"add_library\((nccl-[a-z-]+) SHARED", cmake)}
    assert set(PLUGIN_LIBS) == built
    docs = _export(tmp_path)
    (ds,) = [d for d in docs if d["metadata"]["name"] == "heroserve-gpu-agent-srv2"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {SERVER_LABEL: "srv2"}
    script = spec["initContainers"][0]["command"][2]
    assert all(f"/opt/heroserve/lib/{f}" in script for f in PLUGIN_LIBS)
    argv = spec["containers"][0]["command"]
    assert argv[:5] == ["heroserve-gpu-agent", "--controller", "heroserve-controller:50051",
                        "--node-id", "srv2"]  # fmt: skip
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--gpu"] == [
        f"srv2-gpu{i}:{i}" for i in range(4)
    ]
    assert "--tls-cert" in argv


def test_controller_plan_and_certificates(tmp_path: Path) -> None:
    docs = _export(tmp_path)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    cm = by["ConfigMap", "heroserve-plan"]
    assert cm["data"]["plan.json"] == hand_plan().to_json()
    pod = by["Deployment", "heroserve-controller"]["spec"]["template"]["spec"]
    argv = pod["containers"][0]["command"]
    assert argv[argv.index("--plan") + 1] == "/etc/heroserve/plan/plan.json"
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:50051"
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    secrets = [s["secret"]["name"] for s in tls["projected"]["sources"]]
    assert secrets == ["heroserve-ca", "heroserve-tls-controller"]
    assert ("Service", "heroserve-controller") in by
    assert {n for k, n in by if k == "Deployment" and "switch" in n} == {
        "heroserve-switch-s1",
        "heroserve-switch-s2",
    }


def test_switch_agent_reads_each_ports_line_as_one_flag(tmp_path: Path) -> None:
    """The switch agent's container script, run by bash with a stand-in agent that prints
    its arguments: each line of the operator's ports file is one --port value."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    docs = _export(tmp_path)
    (dep,) = [d for d in docs if d["metadata"]["name"] == "heroserve-switch-s1"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    script = c["command"][2].replace("/etc/heroserve/switch", str(tmp_path))
    (tmp_path / "ports").write_text("1=srv0-gpu0,mac=02:00:00:00:00:01\n\n2=srv1-gpu0")
    fake = tmp_path / "bin" / "heroserve-switch-agent"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "HEROSERVE_P4RUNTIME": "10.0.0.9:9559",
           "HEROSERVE_DEVICE_ID": "1"}  # fmt: skip
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout.splitlines()  # fmt: skip
    assert out[:4] == ["--switch", "10.0.0.9:9559", "--device-id", "1"]
    assert out[out.index("--node-id") + 1] == "s1"
    assert [out[i + 1] for i, a in enumerate(out) if a == "--port"] == [
        "1=srv0-gpu0,mac=02:00:00:00:00:01",
        "2=srv1-gpu0",
    ]


def test_a_broken_manifest_fails_the_check(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert main(["plan", "--planner", "heroserve", "--quiet", "--engine", "sglang",
                 "--json", str(plan)]) == 0  # fmt: skip
    docs = _export(tmp_path, plan=load_plan(plan), engine="sglang")
    assert all(problems(d) == [] for d in docs)
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2  # a field the CRD does not have
    assert "'sizee' was unexpected" in problems(bad)[0]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["size"] = "2"
    assert "is not of type 'integer'" in problems(bad)[0]
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "imagePullPolcy"
    ] = 1  # noqa: E501
    assert problems(bad)
    dep = copy.deepcopy(next(d for d in docs if d["kind"] == "DaemonSet"))
    dep["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["typo"] = "x"
    assert problems(dep)


def test_ina_servers_get_the_net_plugin_and_the_agents_group_file(tmp_path: Path) -> None:
    """hand_plan's prefill/0 (flat INA on srv0) and decode/0 (hierarchical, srv2) name the
    CollNet plugin by its path in --plugin-dir and read the file their node's GPU agent
    writes; the ring instances name neither, and their nodes' agents write no file."""
    docs = _export(tmp_path)
    by_server = {}
    for spec in _engines(docs):
        (c,) = spec["containers"]
        (expr,) = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"]
        by_server[expr["values"][0]] = (c, {v["name"]: v for v in spec["volumes"]})
    for server in ("srv0", "srv2"):
        c, vols = by_server[server]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NCCL_NET_PLUGIN"] == "/opt/heroserve/lib/libnccl-net-heroserve.so"
        assert env["HEROSERVE_INA_CONFIG"] == "/run/heroserve/ina-config.json"
        assert vols["ina-config"]["hostPath"]["path"] == "/run/heroserve"
        assert {"name": "ina-config", "mountPath": "/run/heroserve", "readOnly": True} in c[
            "volumeMounts"
        ]
    for server in ("srv1", "srv3"):
        c, vols = by_server[server]
        assert "ina-config" not in vols
        assert "NCCL_NET_PLUGIN" not in {e["name"] for e in c["env"]}
    agents = {
        d["spec"]["template"]["spec"]["nodeSelector"][SERVER_LABEL]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "DaemonSet"
    }
    for server, writes in (("srv0", True), ("srv1", False), ("srv2", True), ("srv3", False)):
        (agent,) = agents[server]["containers"]
        argv = agent["command"]
        assert ("--ina-config" in argv) == writes
        if writes:
            assert argv[argv.index("--ina-config") + 1] == "/run/heroserve/ina-config.json"
            assert {"name": "ina-config", "mountPath": "/run/heroserve"} in agent["volumeMounts"]
    assert all(problems(d) == [] for d in docs)
