"""``--format k8s``: the vLLM or SGLang deployment of ``vllm.py`` / ``sglang.py`` and its control
plane as Kubernetes manifests (docs/export.md, "k8s.yaml"): per instance a Deployment (one
server) or a LeaderWorkerSet (several servers, the leader on the instance's first server) and
a Service, per pool the router as a Deployment with its Service, then the controller, the GPU
agents' DaemonSets and the switch agents (``k8s_control.py``).

The engines' commands are the same argv as the start scripts', rewritten for pods: the
server's address is the pod's IP (``$(POD_IP)``, from the downward API), the head of a
multi-server instance is the LeaderWorkerSet's leader (``$(LWS_LEADER_ADDRESS)``, which LWS
sets in every pod of a group) and its node rank the pod's worker index, instances reach each
other by Service name. A pod asks for its GPUs as ``nvidia.com/gpu``: the device plugin,
not the plan, picks which GPUs of a server, so ``CUDA_VISIBLE_DEVICES`` is not set; pods are
placed on the plan's servers by the node label ``heroserve.io/server`` (``k8s_pods.py``).
"""

from __future__ import annotations

import shlex
from typing import Any

import networkx as nx
import yaml

from controller.errors import InputError
from controller.export.engines import ADDR, Command, reach
from controller.export.k8s_control import (
    controller,
    gpu_agent_daemonsets,
    switch_agents,
    switch_peers,
    tls_secret,
)
from controller.export.k8s_names import (
    CA_SECRET,
    PART_OF,
    SERVER_LABEL,
    check_k8s,
    object_name,
)
from controller.export.k8s_pods import POD_IP, engine_pod, router_pod, service, workload
from controller.export.layout import InstanceView, Options
from controller.models.engines import EngineProfile
from controller.plan import Plan

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER = "$(LWS_LEADER_ADDRESS)"
# The start scripts' env that a pod does not take: the device plugin chooses the GPUs, and a
# leader pod holds one Ray cluster only (vLLM finds it; LWS_LEADER_ADDRESS, which the script's
# RAY_ADDRESS would need, is not expanded in env values that precede it).
DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")

HEADER = """\
# HeroServe {engine} deployment for Kubernetes (heroserve export --format k8s; docs/export.md).
# The cluster needs the NVIDIA device plugin (nvidia.com/gpu) and, for instances over several
# servers, the LeaderWorkerSet controller. The operator provides, before `kubectl apply -f`:
# - node labels: kubectl label node NODE {label}=SERVER, for the servers {servers}
# - Secrets from `heroserve pki` (docs/control-plane.md): {ca} (key ca.crt) and one
#   kubernetes.io/tls Secret per identity: {tls}
# - per INA switch a ConfigMap heroserve-switch-NODE with keys p4runtime (HOST:PORT),
#   device-id and ports (one PORT=PEER[,mac=][,ip=][,gbps=] a line), whose peers are:
{peers}{extra}"""


def _pod_argv(c: Command, head: str, opts: Options) -> list[str]:
    """``c``'s argv for a pod: its own address the pod's IP, the instance's head the leader."""
    at = f"{reach(head, opts)}:"
    return [t.replace(ADDR, POD_IP).replace(at, f"{LEADER}:") for t in c.argv]


def _pod_env(c: Command, head: str, opts: Options) -> dict[str, str]:
    at = f"{reach(head, opts)}:"
    return {
        k: v.replace(ADDR, POD_IP).replace(at, f"{LEADER}:")
        for k, v in c.env.items()
        if k not in DROPPED_ENV
    }


def _shell(*lines: list[str]) -> list[str]:
    """Several argv run one after the other in one container (Kubernetes expands ``$(VAR)``
    before the shell sees the line, quoted or not)."""
    return ["bash", "-c", " && ".join(shlex.join(a) for a in lines)]


def _instance(
    v: InstanceView, cmds: list[Command], profile: EngineProfile, opts: Options
) -> list[dict]:
    name, head = object_name(v.name), v.head.server
    labels = {**PART_OF, "heroserve.io/instance": name}
    image = opts.image or profile.image
    mine = [c for c in cmds if c.instance == v.name]
    ports = {"http": v.port}
    bootstrap = next((c.argv for c in mine if "--disaggregation-bootstrap-port" in c.argv), None)
    if bootstrap is not None:
        ports["bootstrap"] = int(bootstrap[bootstrap.index("--disaggregation-bootstrap-port") + 1])
    if len(v.servers) == 1:
        (c,) = mine
        pod = engine_pod(image, opts, _pod_argv(c, head, opts), _pod_env(c, head, opts),
                         len(v.head.cuda), [head], labels, v.port)  # fmt: skip
        return [workload("Deployment", name, labels, pod), service(name, labels, ports)]
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
    # the leader on the instance's first server (its Ray head or rank 0), the workers on the
    # others: the plan's split of the GPUs is per server
    leader = engine_pod(image, opts, lead_argv, lead_env, len(v.head.cuda), [head], labels,
                        v.port)  # fmt: skip
    worker = engine_pod(image, opts, work_argv, _pod_env(work, head, opts), sizes.pop(),
                        servers[1:], labels, None)  # fmt: skip
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
    return [lws, service(name, {LWS_NAME_LABEL: name, LWS_INDEX_LABEL: "0"}, ports)]


def render_k8s(
    profile: EngineProfile,
    commands: list[Command],
    views: list[InstanceView],
    opts: Options,
    plan: Plan,
    g: nx.Graph,
) -> str:
    """``k8s.yaml``: a header saying what the operator provides, then every object."""
    check_k8s(opts)
    docs: list[dict] = []
    for v in views:
        docs += _instance(v, commands, profile, opts)
    by_url = {f"http://{reach(v.head.server, opts)}:{v.port}": v for v in views}
    for c in (c for c in commands if c.what == "router"):
        name = object_name(c.instance)
        argv = [
            f"http://{object_name(by_url[t].name)}:{by_url[t].port}" if t in by_url else t
            for t in c.argv
        ]
        port = int(argv[argv.index("--port") + 1])
        labels = {**PART_OF, "heroserve.io/router": name}
        pod = router_pod(opts.router_image or profile.router_image, argv, labels, port)
        docs += [workload("Deployment", name, labels, pod), service(name, labels, {"http": port})]
    docs += controller(plan, g, opts)
    daemonsets = gpu_agent_daemonsets(views, opts)
    docs += daemonsets + switch_agents(g, opts)
    servers = [d["spec"]["template"]["spec"]["nodeSelector"][SERVER_LABEL] for d in daemonsets]
    identities = ["controller", *servers, *switch_peers(g)]
    peers = "".join(f"#     {sw}: {', '.join(ps)}\n" for sw, ps in switch_peers(g).items())
    extra = ""
    if opts.model_volume:
        extra += f"# - the model volume {opts.model_volume} holding {opts.model_path}\n"
    if opts.hf_token_secret:
        extra += f"# - optionally, Secret {opts.hf_token_secret} (key token) for gated models\n"
    head = HEADER.format(
        engine=profile.name, label=SERVER_LABEL, servers=", ".join(servers), ca=CA_SECRET,
        tls=", ".join(tls_secret(i) for i in identities), peers=peers, extra=extra,
    )  # fmt: skip
    return head + yaml.dump_all(docs, Dumper=_Plain, sort_keys=False, width=100)


class _Plain(yaml.SafeDumper):
    """No anchors and aliases: each manifest reads on its own (kubectl and people)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
