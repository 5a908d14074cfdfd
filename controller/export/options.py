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
    image: str = option(
        "", help="--format k8s: the engines' container image", default_help="the engine's own"
    )
    router_image: str = option(
        "", help="--format k8s: the routers' image", default_help="the engine's default"
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
        if not self.tuner_plugin:
            raise InputError("--tuner-plugin '': NCCL_TUNER_PLUGIN needs a path or a library")
        for server, ip in self.addresses.items():
            if why := address_problem(ip):
                raise InputError(f"--address {server}={ip!r}: {why}")
        if not 1 <= self.base_port <= 65535 - 1024:
            raise InputError(f"--base-port {self.base_port} is not in 1..64511")
