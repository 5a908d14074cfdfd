"""`heroserve export --format k8s`: the deployment and its control plane as Kubernetes manifests,
validated offline (``k8s_validate``: kubernetes-validate --strict, and LeaderWorkerSets against
the LeaderWorkerSet project's own CRD): a Deployment or a LeaderWorkerSet per instance, a
Service per instance and per router, the router's Deployment with its pool's Service URLs, the
controller, a GPU agent DaemonSet per server and a switch agent per INA switch; GPUs asked of
the device plugin, side channel on the pod's IP, pods placed by node label."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.cli import main
from tests.controller.export.test_export import hand_plan

pytest.importorskip("kubernetes_validate")
pytest.importorskip("jsonschema")
from tests.controller.export.k8s_validate import pod_templates, problems  # noqa: E402

IMAGE = "registry.example/heroserve:0.1.0"


def _manifests(plan: Path, tmp: Path, *extra: str) -> list[dict]:
    out = tmp / "k8s"
    argv = ["export", "--plan", str(plan), "--format", "k8s", "--out", str(out),
            "--heroserve-image", IMAGE, *extra]  # fmt: skip
    assert main(argv) == 0
    return [d for d in yaml.safe_load_all((out / "k8s.yaml").read_text()) if d]


def check(docs: list[dict], instances: dict[str, int]) -> None:
    """``instances``: instance name (``prefill-0``) -> the servers it spans."""
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        assert problems(d) == []
    kept = [d for d in docs if d["kind"] not in ("Service", "ConfigMap")]
    workloads = {d["metadata"]["name"]: d for d in kept}
    services = {d["metadata"]["name"]: d for d in by_kind["Service"]}
    for inst, n in instances.items():
        w = workloads[f"heroserve-{inst}"]
        assert w["kind"] == ("LeaderWorkerSet" if n > 1 else "Deployment")
        if n > 1:
            assert w["spec"]["leaderWorkerTemplate"]["size"] == n
        assert f"heroserve-{inst}" in services  # a Service per instance
        for t in pod_templates(w):
            (c,) = t["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert "CUDA_VISIBLE_DEVICES" not in env and c["resources"]["limits"]["nvidia.com/gpu"]
            host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or env.get("SGLANG_HOST_IP")
            assert host == "$(POD_IP)"
    routers = [d for n, d in workloads.items() if n.startswith("heroserve-pool-")]
    assert "kubernetes.io/hostname" not in yaml.safe_dump_all(docs)  # placed by label only
    assert routers and all(f"heroserve-pool-{k}" in services for k in range(len(routers)))
    for r in routers:
        args = r["spec"]["template"]["spec"]["containers"][0]["command"]
        for flag in ("--prefill", "--decode"):
            url = args[args.index(flag) + 1]
            name, port = url.removeprefix("http://").split(":")
            assert name in services and int(port) == services[name]["spec"]["ports"][0]["port"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_testbed_plan_for_each_engine_validates(engine: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    argv = ["plan", "--planner", "heroserve", "--quiet", "--engine", engine, "--json", str(plan)]
    assert main(argv) == 0
    docs = _manifests(plan, tmp_path)
    # the testbed's plans for either engine: prefill 1x8 over two servers, decode over two
    check(docs, {"prefill-0": 2, "decode-0": 2})


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_hand_plan_validates(engine: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    hand_plan().save(plan)
    docs = _manifests(plan, tmp_path, "--engine", engine)
    check(docs, {"prefill-0": 1, "prefill-1": 1, "decode-0": 1, "decode-1": 1})
    # one router (a Deployment and its Service) over all four instances
    routers = [d for d in docs if d["metadata"]["name"].startswith("heroserve-pool-")]
    assert [(d["kind"], d["metadata"]["name"]) for d in routers] == [
        ("Deployment", "heroserve-pool-0"),
        ("Service", "heroserve-pool-0"),
    ]
    args = routers[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert [
        args[i + 1].split(":")[1] for i, x in enumerate(args) if x in ("--prefill", "--decode")
    ] == [
        "//heroserve-prefill-0",
        "//heroserve-prefill-1",
        "//heroserve-decode-0",
        "//heroserve-decode-1",
    ]


def test_k8s_needs_an_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    hand_plan().save(plan)  # made for no engine
    rc = main(["export", "--plan", str(plan), "--format", "k8s", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "--format k8s: pass --engine vllm|sglang" in err


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_2tracks_plan_validates(engine: str, tmp_path: Path) -> None:
    """A plan of the first 12 servers of 2tracks (OPT-175B; planning all 1,200 takes minutes),
    exported against the whole 2tracks cluster: instances over several servers throughout."""
    from controller.models import model_spec
    from controller.planner import PlannerOptions, plan
    from controller.topology.generators import two_tracks
    from controller.workload import chatbot, default_sla

    p = plan(
        two_tracks(12), model_spec("OPT-175B"), chatbot(), default_sla("chatbot", "large"),
        PlannerOptions(engine=engine),
    )  # fmt: skip
    path = tmp_path / "plan.json"
    p.save(path)
    docs = _manifests(path, tmp_path, "--model-path", "/models/opt-175b")
    spans = {}
    for ph in (p.prefill, p.decode):
        for i, inst in enumerate(ph.instances):
            servers = {x.split("-gpu")[0] for st in inst.stages for x in st}
            spans[f"{ph.role}-{i}"] = len(servers)
    assert max(spans.values()) > 1
    check(docs, spans)
