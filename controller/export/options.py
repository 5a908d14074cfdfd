"""What ``heroserve export`` writes into the files beside the plan (docs/export.md): the formats
and :class:`Options`, whose fields declared with ``option`` are also the command's flags
(``controller/inputs/flags.py``). Light: nothing of the plan or its cluster imported."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from agents.cliutil import UsageError, split_address
from controller.errors import InputError
from controller.inputs.flags import option

Format = Literal["deployment", "vllm", "sglang", "k8s"]
FORMATS: tuple[str, ...] = ("deployment", "vllm", "sglang", "k8s")
# NCCL reads NCCL_TUNER_PLUGIN and dlopen()s it: a full path or a library on the loader's path.
DEFAULT_TUNER = "libnccl-tuner-heroserve.so"
# NCCL_NET_PLUGIN: NCCL dlopen()s a bare name X as libnccl-net-X.so (every release with
# CollNet v8, 2.20 on; newer ones also try the value as given), or a path (csrc/README.md,
# "What NCCL's loader requires").
DEFAULT_NET_PLUGIN = "heroserve"
# Where each server's GPU agent writes its INA groups (its --ina-config) and the engines'
# CollNet plugin reads them (HEROSERVE_INA_CONFIG, csrc/ina/group_config.h).
DEFAULT_INA_CONFIG = "/run/heroserve/ina-config.json"
# A plugin or file path that goes unquoted into environments: letters, digits, '.', '_',
# '+', '-' and '/', no '..' component, 255 at most (PATH_MAX is far above; NAME_MAX 255).
SAFE_PATH = re.compile(r"[A-Za-z0-9._+/-]{1,255}")
# HEROSERVE_SHM_PREFIX goes into a /dev/shm name: letters, digits, '.', '_', '-' (no path
# separator, no '..'), 64 at most, so segment names stay far below NAME_MAX (255).
SHM_PREFIX = re.compile(r"[A-Za-z0-9._-]{0,64}")
# What the start scripts expand themselves (controller/export/engines.py: ADDR, RUN): a value
# from the command line holding one would be expanded too, so it is refused.
SCRIPT_VARS = ("${ADDR}", "${RUN}")


def address_problem(ip: str) -> str | None:
    """Why ``ip`` cannot be a server's ``--address`` (None when it can): it must be one
    unicast IPv4 or IPv6 address other hosts reach it at. A scope id (``fe80::1%eth0``) names
    an interface of one host only, so the other servers could not use it (and its text would
    reach the scripts); the unspecified, broadcast and multicast addresses name no server."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IPv4 or IPv6 address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        return "a scope id names an interface of one host, not an address others reach"
    if addr.is_unspecified or addr.is_multicast or ip == "255.255.255.255":
        return "the unspecified, broadcast or a multicast address names no server"
    return None


@dataclass
class Options:
    tuner_plugin: str = option(
        DEFAULT_TUNER, help="NCCL_TUNER_PLUGIN value: the plugin's path on the servers"
    )
    net_plugin: str = option(
        DEFAULT_NET_PLUGIN,
        help="NCCL_NET_PLUGIN value on servers with INA groups: the CollNet plugin (a name X "
        "for libnccl-net-X.so on the loader's path, or the library's path)",
    )
    ina_config: str = option(
        DEFAULT_INA_CONFIG,
        help="HEROSERVE_INA_CONFIG on servers with INA groups: the absolute path where that "
        "server's GPU agent writes them (its --ina-config)",
    )
    controller: str = option(
        "127.0.0.1:50051", help="controller address the GPU agents dial (their --controller)"
    )
    shm_prefix: str = option(
        "", help="HEROSERVE_SHM_PREFIX of agents and engines", default_help="none"
    )
    model_path: str = option(
        "", help="checkpoint the engines load", default_help="the plan's model's public checkpoint"
    )
    # HTTP port of instance k is base_port + k on its head server
    base_port: int = option(8100, help="HTTP port of the first instance (+1 each)")
    # server -> the address its processes bind and others reach it at (--address); a server
    # not named here resolves its own name when its start script runs
    addresses: dict[str, str] = field(default_factory=dict)
    # --format k8s (controller/export/k8s_names.py checks these; docs/export.md, "k8s.yaml")
    image: str = option(
        "", help="--format k8s: the engines' image", default_help="the engine's pinned release"
    )
    router_image: str = option(
        "", help="--format k8s: the router's image", default_help="the router's pinned release"
    )
    heroserve_image: str = option(
        "",
        help="--format k8s: the image with the controller, the agents and the NCCL plugins "
        "(required: HeroServe publishes none; docs/export.md says what it holds)",
        default_help="none",
    )
    dev_shm: str = option(
        "host",
        help="--format k8s: engine pods' /dev/shm: 'host' (the node's, where the GPU agent "
        "publishes the tuner's tables) or a size for a memory-backed emptyDir (e.g. 64Gi)",
    )
    model_volume: str = option(
        "",
        help="--format k8s: weights mounted read-only at /models: pvc:CLAIM or hostpath:/DIR",
        default_help="none: the engines download --model-path",
    )
    hf_token_secret: str = option(
        "heroserve-hf-token",
        help="--format k8s: Secret whose key 'token' becomes HF_TOKEN (optional: absent is no "
        "token)",
    )
    rdma_resource: str = option(
        "",
        help="--format k8s: device-plugin resource of an RDMA NIC (e.g. rdma/hca), one per "
        "engine pod, with IPC_LOCK for NIXL's registered memory",
        default_help="none: KV over the pod network",
    )
    plugin_dir: str = option(
        "/opt/heroserve/lib",
        help="--format k8s: node directory where the GPU agent's DaemonSet puts the NCCL "
        "plugins, mounted read-only at the same path in engine pods",
    )

    def check(self) -> None:
        """InputError naming the first option an exported file cannot carry."""
        try:
            split_address(self.controller, "--controller")
        except UsageError as e:
            raise InputError(str(e)) from None
        if not SHM_PREFIX.fullmatch(self.shm_prefix) or ".." in self.shm_prefix:
            raise InputError(
                f"--shm-prefix {self.shm_prefix!r}: up to 64 letters, digits, '.', '_' or '-', "
                "without '..' (it names files in /dev/shm)"
            )
        for flag, value in (
            ("--tuner-plugin", self.tuner_plugin),
            ("--model-path", self.model_path),
        ):
            if not value.isprintable():
                raise InputError(f"{flag} {value!r}: control characters")
            if any(v in value for v in SCRIPT_VARS):
                raise InputError(f"{flag} {value!r}: the start scripts expand {SCRIPT_VARS}")
        for flag, value in (("--net-plugin", self.net_plugin), ("--ina-config", self.ina_config)):
            if not SAFE_PATH.fullmatch(value) or ".." in value.split("/"):
                raise InputError(
                    f"{flag} {value[:80]!r}: up to 255 letters, digits, '.', '_', '+', '-' or "
                    "'/', without a '..' component"
                )
        if not self.ina_config.startswith("/"):
            raise InputError(f"--ina-config {self.ina_config!r}: an absolute path")
        if not self.tuner_plugin:
            raise InputError("--tuner-plugin '': NCCL_TUNER_PLUGIN needs a path or a library")
        for server, ip in self.addresses.items():
            if why := address_problem(ip):
                raise InputError(f"--address {server}={ip!r}: {why}")
        if not 1 <= self.base_port <= 65535 - 1024:
            raise InputError(f"--base-port {self.base_port} is not in 1..64511")
