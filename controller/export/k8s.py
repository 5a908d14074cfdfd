"""``--format k8s``: the vLLM or SGLang deployment of ``vllm.py`` / ``sglang.py`` as Kubernetes
manifests (docs/export.md, "Kubernetes"): per instance a Deployment (one server) or a
LeaderWorkerSet (several servers, the leader on the instance's first server), a Service per
instance, and per pool the router as a Deployment with its Service.

The engines' commands are the same argv as the start scripts', rewritten for pods: the
server's address is the pod's IP (``$(POD_IP)``, from the downward API), the head of a
multi-server instance is the LeaderWorkerSet's leader (``$(LWS_LEADER_ADDRESS)``, which LWS
sets in every pod of a group) and its node rank the pod's worker index, instances reach each
other by Service name. A pod asks for its GPUs as ``nvidia.com/gpu``: the device plugin,
not the plan, picks which GPUs of a server, so ``CUDA_VISIBLE_DEVICES`` is not set; pods are
pinned to the plan's servers by node name (``kubernetes.io/hostname``).
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from controller.errors import InputError
from controller.export.engines import ADDR, Command, reach
from controller.export.layout import InstanceView, Options
from controller.models.engines import EngineProfile

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
HOSTNAME = "kubernetes.io/hostname"
POD_IP = "$(POD_IP)"
LEADER = "$(LWS_LEADER_ADDRESS)"
# The start scripts' env that a pod does not take: the device plugin chooses the GPUs, and a
# leader pod holds one Ray cluster only (vLLM finds it; LWS_LEADER_ADDRESS, which the script's
# RAY_ADDRESS would need, is not expanded in env values that precede it).
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")

HEADER = """\
# HeroServe {engine} deployment for Kubernetes (heroserve export --format k8s; docs/export.md).
# Needs: the NVIDIA device plugin (nvidia.com/gpu), the LeaderWorkerSet controller for
# instances over several servers, nodes named as the plan's servers, and an image with
# {installs}. Apply with `kubectl apply -f k8s.yaml`.
"""


def _name(instance: str) -> str:
    return "heroserve-" + instance.replace("/", "-")


def _pod(
    profile: EngineProfile,
    opts: Options,
    argv: list[str],
    env: dict[str, str],
    gpus: int,
    servers: list[str],
    labels: dict[str, str],
    port: int | None,
) -> dict[str, Any]:
    """A pod template running ``argv`` with ``gpus`` GPUs on one of ``servers``."""
    container: dict[str, Any] = {
        "name": "engine",
        "image": opts.image or profile.image,
        "command": argv,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        + [{"name": k, "value": v} for k, v in env.items() if k not in DROPPED_ENV],
        "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {},
    }
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 360,  # a large model loads for minutes
        }
    spec: dict[str, Any] = {"containers": [container]}
    if servers:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME, "operator": "In", "values": servers}
                            ]
                        }
                    ]
                }
            }
        }
    return {"metadata": {"labels": labels}, "spec": spec}


def _pod_argv(c: Command, head: str, opts: Options) -> list[str]:
    """``c``'s argv for a pod: its own address the pod's IP, the instance's head the leader."""
    at = f"{reach(head, opts)}:"
    return [t.replace(ADDR, POD_IP).replace(at, f"{LEADER}:") for t in c.argv]


def _pod_env(c: Command, head: str, opts: Options) -> dict[str, str]:
    at = f"{reach(head, opts)}:"
    return {k: v.replace(ADDR, POD_IP).replace(at, f"{LEADER}:") for k, v in c.env.items()}


def _shell(*lines: list[str]) -> list[str]:
    """Several argv run one after the other in one container (Kubernetes expands ``$(VAR)``
    before the shell sees the line, quoted or not)."""
    return ["bash", "-c", " && ".join(shlex.join(a) for a in lines)]


def _deployment(name: str, labels: dict, pod: dict) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod},
    }


def _service(name: str, selector: dict, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": selector,
            "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()],
        },
    }


def _instance(
    v: InstanceView, cmds: list[Command], profile: EngineProfile, opts: Options
) -> list[dict]:
    name, head = _name(v.name), v.head.server
    labels = {"app.kubernetes.io/part-of": "heroserve", "heroserve/instance": name}
    mine = [c for c in cmds if c.instance == v.name]
    ports = {"http": v.port}
    bootstrap = next((c.argv for c in mine if "--disaggregation-bootstrap-port" in c.argv), None)
    if bootstrap is not None:
        ports["bootstrap"] = int(bootstrap[bootstrap.index("--disaggregation-bootstrap-port") + 1])
    if len(v.servers) == 1:
        (c,) = mine
        pod = _pod(profile, opts, _pod_argv(c, head, opts), _pod_env(c, head, opts),
                   len(v.head.cuda), [head], labels, v.port)  # fmt: skip
        return [_deployment(name, labels, pod), _service(name, labels, ports)]
    sizes = {len(p.cuda) for p in v.servers[1:]}
    if len(sizes) > 1:
        held = "+".join(str(len(p.cuda)) for p in v.servers[1:])
        raise InputError(
            f"--format k8s: {v.name}'s workers hold {held} GPUs; a LeaderWorkerSet gives "
            "every worker the same"
        )
    servers = [p.server for p in v.servers]
    lead = [c for c in mine if c.server == head]
    work = next(c for c in mine if c.server == v.servers[1].server)
    if profile.placement.launcher == "ray":
        lead_argv = _shell(*(_pod_argv(c, head, opts) for c in lead))
        work_argv = _pod_argv(work, head, opts) + ["--block"]  # the pod lives while Ray does
    else:  # every node runs the engine; its rank is its index in the group
        lead_argv = _pod_argv(lead[0], head, opts)
        work_argv = _pod_argv(work, head, opts)
        work_argv[work_argv.index("--node-rank") + 1] = "$(LWS_WORKER_INDEX)"
    lead_env = {k: v for c in lead for k, v in _pod_env(c, head, opts).items()}
    leader = _pod(profile, opts, lead_argv, lead_env, len(v.head.cuda), servers, labels, v.port)
    worker = _pod(profile, opts, work_argv, _pod_env(work, head, opts), sizes.pop(), servers,
                  labels, None)  # fmt: skip
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": len(v.servers),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }
    return [lws, _service(name, {LWS_NAME_LABEL: name, LWS_INDEX_LABEL: "0"}, ports)]


def render_k8s(
    profile: EngineProfile, commands: list[Command], views: list[InstanceView], opts: Options
) -> str:
    docs: list[dict] = []
    for v in views:
        docs += _instance(v, commands, profile, opts)
    by_url = {f"http://{reach(v.head.server, opts)}:{v.port}": v for v in views}
    for c in (c for c in commands if c.what == "router"):
        name = _name(c.instance)
        argv = [
            f"http://{_name(by_url[t].name)}:{by_url[t].port}" if t in by_url else t for t in c.argv
        ]
        port = int(argv[argv.index("--port") + 1])
        labels = {"app.kubernetes.io/part-of": "heroserve", "heroserve/router": name}
        pod = _pod(profile, opts, argv, {}, 0, [], labels, port)
        pod["spec"]["containers"][0]["image"] = opts.router_image or profile.router_image
        docs += [_deployment(name, labels, pod), _service(name, labels, {"http": port})]
    head = HEADER.format(engine=profile.name, installs=", ".join(profile.installs))
    return head + yaml.dump_all(docs, Dumper=_Plain, sort_keys=False, width=100)


class _Plain(yaml.SafeDumper):
    """No anchors and aliases: each manifest reads on its own (kubectl and people)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
