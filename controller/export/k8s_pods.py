"""The pod templates of ``--format k8s`` (docs/export.md, "k8s.yaml"): :func:`engine_pod`,
an engine's pod (GPUs, ``/dev/shm``, the model volume, the HF token, the NCCL plugins from the
node, RDMA and ``IPC_LOCK``, placement on the plan's servers by node label), and the pieces the
other objects share: :func:`node_affinity`, :func:`tls_volume`, :func:`host_dir`,
:func:`workload`, :func:`service`."""

from __future__ import annotations

import posixpath
from typing import Any

from controller.export.k8s_names import (
    CA_SECRET,
    MODELS,
    PART_OF,
    PLUGIN_LIBS,
    SERVER_LABEL,
    TLS_DIR,
    model_volume,
    server_label,
)
from controller.export.options import Options

POD_IP = "$(POD_IP)"
# NCCL variables naming a plugin library: a bare file name there is found on the loader's
# path in a start script; in a pod it becomes the file in --plugin-dir, which is mounted
# NCCL's plugin variables and the library file NCCL makes of a bare name (NCCL's
# plugin_open.cc: NCCL_NET_PLUGIN=heroserve loads libnccl-net-heroserve.so)
PLUGIN_ENV = {"NCCL_TUNER_PLUGIN": "libnccl-tuner-{}.so", "NCCL_NET_PLUGIN": "libnccl-net-{}.so"}
# How long an engine pod waits for the GPU agent's DaemonSet to put the plugins on its node
# before it fails (and is restarted): image pulls of a few GB take minutes.
PLUGIN_WAIT_S = 900


def node_affinity(servers: list[str]) -> dict[str, Any]:
    """Required placement on the nodes labelled with one of ``servers``."""
    values = [server_label(s) for s in servers]
    term = {"matchExpressions": [{"key": SERVER_LABEL, "operator": "In", "values": values}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }  # noqa: E501
    }


def tls_volume(identity_secret: str) -> dict[str, Any]:
    """The CA's certificate and one identity's key pair in one folder (``TLS_DIR``)."""
    return {
        "name": "tls",
        "projected": {
            "defaultMode": 0o400,
            "sources": [
                {"secret": {"name": CA_SECRET, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "secret": {
                        "name": identity_secret,
                        "items": [{"key": k, "path": k} for k in ("tls.crt", "tls.key")],
                    }
                },  # fmt: skip
            ],
        },
    }


TLS_MOUNT = {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}


def host_dir(name: str, path: str, create: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "hostPath": {"path": path, "type": "DirectoryOrCreate" if create else "Directory"},
    }  # noqa: E501


def _plugin_env(name: str, value: str, opts: Options) -> str:
    """The plugin's path in the pod where it is one of the libraries the GPU agent's DaemonSet
    puts in ``--plugin-dir`` (named by file or by NCCL's short name); else as given."""
    for file in (value, PLUGIN_ENV[name].format(value)):
        if file in PLUGIN_LIBS:
            return posixpath.join(opts.plugin_dir, file)
    return value


def engine_pod(
    image: str,
    opts: Options,
    argv: list[str],
    env: dict[str, str],
    gpus: int,
    servers: list[str],
    labels: dict[str, str],
    port: int | None,
) -> dict[str, Any]:
    """A pod template running ``argv`` with ``gpus`` GPUs on one of ``servers``."""
    env_list: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    if opts.hf_token_secret:  # optional: a pod starts without it (public checkpoints)
        ref = {"name": opts.hf_token_secret, "key": "token", "optional": True}
        env_list.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    env_list += [
        {"name": k, "value": _plugin_env(k, v, opts) if k in PLUGIN_ENV else v}
        for k, v in env.items()
    ]
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    container: dict[str, Any] = {"name": "engine", "image": image, "command": argv, "env": env_list}
    if opts.rdma_resource:  # NIXL (UCX) registers the KV cache with the NIC: locked memory
        limits[opts.rdma_resource] = 1
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    container["resources"] = {"limits": limits}
    if opts.dev_shm == "host":  # the node's tmpfs, where the GPU agent publishes the tables
        shm = host_dir("dshm", "/dev/shm")
    else:  # the pod's own: NCCL and the engine get room, the tuner finds no tables
        shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.dev_shm}}
    volumes = [shm, host_dir("heroserve-lib", opts.plugin_dir)]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "heroserve-lib", "mountPath": opts.plugin_dir, "readOnly": True},
    ]
    if "HEROSERVE_INA_CONFIG" in env:  # written on the node by the GPU agent's DaemonSet
        ina_dir = posixpath.dirname(env["HEROSERVE_INA_CONFIG"])
        volumes.append(host_dir("ina-config", ina_dir, create=True))
        mounts.append({"name": "ina-config", "mountPath": ina_dir, "readOnly": True})
    if (mv := model_volume(opts)) is not None:
        kind, where = mv
        src = {"persistentVolumeClaim": {"claimName": where, "readOnly": True}} if kind == "pvc" \
            else {"hostPath": {"path": where, "type": "Directory"}}  # fmt: skip
        volumes.append({"name": "models", **src})
        mounts.append({"name": "models", "mountPath": MODELS, "readOnly": True})
    container["volumeMounts"] = mounts
    if port is not None:
        container["ports"] = [{"name": "http", "containerPort": port}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 360,  # a large model loads for minutes
        }
    files = " ".join(posixpath.join(opts.plugin_dir, f) for f in PLUGIN_LIBS)
    wait = {
        "name": "wait-plugins",
        "image": image,
        # no "$(" in the line: the kubelet would take it for a variable reference
        "command": ["bash", "-c", f"for i in {{1..{PLUGIN_WAIT_S // 5}}}; do ls {files} >/dev/null "
                    "2>&1 && exit 0; sleep 5; done; echo 'no NCCL plugins in the node folder: is "
                    "the heroserve-gpu-agent DaemonSet running here?' >&2; exit 1"],
        "volumeMounts": [mounts[1]],
    }  # fmt: skip
    spec = {
        "affinity": node_affinity(servers),
        "initContainers": [wait],
        "containers": [container],
        "volumes": volumes,
    }
    return {"metadata": {"labels": labels}, "spec": spec}


def router_pod(image: str, argv: list[str], labels: dict[str, str], port: int) -> dict[str, Any]:
    container = {
        "name": "router",
        "image": image,
        "command": argv,
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 10},
    }
    return {"metadata": {"labels": labels}, "spec": {"containers": [container]}}


def workload(kind: str, name: str, labels: dict, pod: dict, **spec: Any) -> dict[str, Any]:
    """A Deployment or DaemonSet of ``pod``, selected by ``labels``."""
    body: dict[str, Any] = {"selector": {"matchLabels": labels}, "template": pod, **spec}
    if kind == "Deployment":
        body = {"replicas": 1, **body}
    meta = {"name": name, "labels": labels}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta, "spec": body}


def service(name: str, selector: dict, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(PART_OF)},
        "spec": {
            "selector": selector,
            "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports.items()],
        },
    }
