"""The control plane of ``--format k8s`` (docs/export.md, "k8s.yaml"): the controller (a
Deployment with its Service, the plan, and the topology when it is not a built-in, in
ConfigMaps), per server a GPU agent DaemonSet that also puts the NCCL plugins on the node for
the engine pods, and per INA switch a switch agent Deployment. Certificates come from Secrets
the operator makes with ``heroserve pki`` (docs/control-plane.md); a switch's P4Runtime
address, device id and port map from a ConfigMap the operator writes (the topology has no
port numbers)."""

from __future__ import annotations

import json
import posixpath
import shlex
from typing import Any

import networkx as nx

from controller.errors import InputError
from controller.export.deployment import gpu_agents
from controller.export.k8s_names import (
    CONTROLLER_PORT,
    CONTROLLER_SERVICE,
    IMAGE_LIB,
    METRICS_PORT,
    PART_OF,
    PLUGIN_LIBS,
    SERVER_LABEL,
    TLS_FLAGS,
    object_name,
    server_label,
)
from controller.export.k8s_pods import TLS_MOUNT, host_dir, service, tls_volume, workload
from controller.export.layout import InstanceView, Options
from controller.plan import Plan

# A ConfigMap holds at most 1 MiB of data (the API server's limit on the object).
CONFIGMAP_BYTES = 1024 * 1024
CONTROLLER = f"{CONTROLLER_SERVICE}:{CONTROLLER_PORT}"
PLAN_DIR, TOPOLOGY_DIR = "/etc/heroserve/plan", "/etc/heroserve/topology"
DB_DIR = "/var/lib/heroserve"
SWITCH_DIR = "/etc/heroserve/switch"


def tls_secret(identity: str) -> str:
    """The kubernetes.io/tls Secret of a ``heroserve pki`` identity (node or ``controller``)."""
    return object_name("tls", identity)


def _configmap(name: str, key: str, text: str, what: str) -> dict[str, Any]:
    if len(text.encode()) >= CONFIGMAP_BYTES:
        raise InputError(
            f"--format k8s: the {what} is {len(text.encode()):,} bytes, over a ConfigMap's "
            f"1 MiB: give the controller the {what} another way (docs/export.md)"
        )
    meta = {"name": name, "labels": dict(PART_OF)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {key: text}}


def controller(plan: Plan, g: nx.Graph, opts: Options) -> list[dict[str, Any]]:
    """The controller's ConfigMaps, Deployment and Service."""
    from controller.topology.generators import BUILTIN

    name = CONTROLLER_SERVICE
    labels = {**PART_OF, "heroserve.io/component": "controller"}
    docs = [_configmap(object_name("plan"), "plan.json", plan.to_json(), "plan")]
    volumes = [{"name": "plan", "configMap": {"name": object_name("plan")}}]
    mounts = [{"name": "plan", "mountPath": PLAN_DIR, "readOnly": True}]
    topology = plan.topology
    if plan.topology not in BUILTIN:  # a plan made on a file: the controller needs the file
        from controller.topology.io import topology_to_dict

        text = json.dumps(topology_to_dict(g), separators=(",", ":"))
        docs.append(_configmap(object_name("topology"), "topology.json", text, "topology"))
        volumes.append({"name": "topology", "configMap": {"name": object_name("topology")}})
        mounts.append({"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True})
        topology = f"{TOPOLOGY_DIR}/topology.json"
    argv = [
        "heroserve", "controller", "--plan", f"{PLAN_DIR}/plan.json", "--topology", topology,
        "--listen", f"0.0.0.0:{CONTROLLER_PORT}", "--db", f"{DB_DIR}/controller.db", *TLS_FLAGS,
        "--metrics-port", str(METRICS_PORT), "--metrics-addr", "0.0.0.0",
    ]  # fmt: skip
    # The database lives as long as the pod: a new pod starts a new controller generation,
    # which the agents notice and resynchronise from (docs/control-plane.md, "Restart").
    volumes += [tls_volume(tls_secret("controller")), {"name": "db", "emptyDir": {}}]
    mounts += [TLS_MOUNT, {"name": "db", "mountPath": DB_DIR}]
    container = {
        "name": "controller",
        "image": opts.heroserve_image,
        "command": argv,
        "ports": [
            {"name": "grpc", "containerPort": CONTROLLER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "readinessProbe": {"tcpSocket": {"port": CONTROLLER_PORT}, "periodSeconds": 5},
        "volumeMounts": mounts,
    }
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [container], "volumes": volumes}}
    # one writer of the SQLite file: the old pod stops before the new one starts
    dep = workload("Deployment", name, labels, pod, strategy={"type": "Recreate"})
    ports = {"grpc": CONTROLLER_PORT, "metrics": METRICS_PORT}
    return docs + [dep, service(name, labels, ports)]


def gpu_agent_daemonsets(views: list[InstanceView], opts: Options) -> list[dict[str, Any]]:
    """Per server of the plan a DaemonSet on the node labelled with it: an init container
    copies the NCCL plugins into ``--plugin-dir`` on the node (a new file renamed over the old,
    so an engine that has one mapped keeps it), then ``heroserve-gpu-agent`` runs with the
    server's GPUs and publishes the policy tables in the node's ``/dev/shm``."""
    out = []
    host_lib = "/host-lib"
    copy = "; ".join(
        f"cp {posixpath.join(IMAGE_LIB, f)} {host_lib}/.{f}.new && mv -f {host_lib}/.{f}.new "
        f"{host_lib}/{f}"
        for f in PLUGIN_LIBS
    )
    for a in gpu_agents(views, opts):
        server = a["server"]
        name = object_name("gpu-agent", server)
        labels = {**PART_OF, "heroserve.io/component": "gpu-agent"}
        labels[SERVER_LABEL] = server_label(server)
        argv = ["heroserve-gpu-agent", "--controller", CONTROLLER, "--node-id", server]
        for gpu in a["gpus"]:
            argv += ["--gpu", gpu]
        argv += a["nvlink"]
        env = [  # NVML sees every GPU of the node without taking one from the device plugin
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ]
        if opts.shm_prefix:
            env.append({"name": "HEROSERVE_SHM_PREFIX", "value": opts.shm_prefix})
        init = {
            "name": "plugins",
            "image": opts.heroserve_image,
            "command": ["sh", "-c", f"set -e; {copy}"],
            "volumeMounts": [{"name": "heroserve-lib", "mountPath": host_lib}],
        }
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, TLS_MOUNT]
        volumes = [
            host_dir("heroserve-lib", opts.plugin_dir, create=True),
            host_dir("dshm", "/dev/shm"),
            tls_volume(tls_secret(server)),
        ]
        if a["ina_config"]:  # the CollNet plugin of this node's engines reads the groups there
            argv += ["--ina-config", opts.ina_config]
            ina_dir = posixpath.dirname(opts.ina_config)
            mounts.append({"name": "ina-config", "mountPath": ina_dir})
            volumes.append(host_dir("ina-config", ina_dir, create=True))
        agent = {
            "name": "gpu-agent",
            "image": opts.heroserve_image,
            "command": argv + TLS_FLAGS,
            "env": env,
            "volumeMounts": mounts,
        }
        spec = {
            "nodeSelector": {SERVER_LABEL: server},
            "initContainers": [init],
            "containers": [agent],
            "volumes": volumes,
        }
        pod = {"metadata": {"labels": labels}, "spec": spec}
        out.append(workload("DaemonSet", name, labels, pod))
    return out


def ina_switches(g: nx.Graph) -> list[str]:
    """The switches that run the HeroServe P4 program (``ina: true``), each with its agent."""
    return sorted(n for n, d in g.nodes(data=True) if d.get("kind") == "switch" and d.get("ina"))


def switch_agents(g: nx.Graph, opts: Options) -> list[dict[str, Any]]:
    """Per INA switch a Deployment of ``heroserve-switch-agent``; what the topology does not
    say (P4Runtime address, device id, which port reaches which peer) comes from the
    operator's ConfigMap ``heroserve-switch-NODE`` (keys ``p4runtime``, ``device-id``,
    ``ports``: one ``PORT=PEER[,mac=][,ip=][,gbps=]`` a line)."""
    out = []
    for sw in ina_switches(g):
        name = object_name("switch", sw)
        labels = {**PART_OF, "heroserve.io/component": "switch-agent", "heroserve.io/switch": sw}
        fixed = ["--controller", CONTROLLER, "--node-id", sw, *TLS_FLAGS]
        # each line of the ports file is one --port value: read into an array, never split
        script = (
            'set -eu; args=(); while IFS= read -r p || [ -n "$p" ]; do '
            '[ -n "$p" ] && args+=(--port "$p"); done < ' + f"{SWITCH_DIR}/ports; "
            'exec heroserve-switch-agent --switch "$HEROSERVE_P4RUNTIME" --device-id '
            '"$HEROSERVE_DEVICE_ID" ' + shlex.join(fixed) + ' "${args[@]}"'
        )
        env = [
            {"name": var, "valueFrom": {"configMapKeyRef": {"name": name, "key": key}}}
            for var, key in (
                ("HEROSERVE_P4RUNTIME", "p4runtime"),
                ("HEROSERVE_DEVICE_ID", "device-id"),
            )  # noqa: E501
        ]
        container = {
            "name": "switch-agent",
            "image": opts.heroserve_image,
            "command": ["bash", "-c", script],
            "env": env,
            "volumeMounts": [
                {"name": "switch", "mountPath": SWITCH_DIR, "readOnly": True},
                TLS_MOUNT,
            ],
        }
        volumes = [
            {
                "name": "switch",
                "configMap": {"name": name, "items": [{"key": "ports", "path": "ports"}]},
            },  # noqa: E501
            tls_volume(tls_secret(sw)),
        ]
        spec = {"containers": [container], "volumes": volumes}
        pod = {"metadata": {"labels": labels}, "spec": spec}
        out.append(workload("Deployment", name, labels, pod, strategy={"type": "Recreate"}))
    return out


def switch_peers(g: nx.Graph) -> dict[str, list[str]]:
    """Per INA switch its neighbours in the topology: the peers its ports file names."""
    return {sw: sorted(str(n) for n in g.neighbors(sw)) for sw in ina_switches(g)}
