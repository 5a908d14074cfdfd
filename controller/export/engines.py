"""What the vLLM and SGLang exports share (docs/export.md): the ``Command`` a server runs, the
checkpoint an engine loads (``model_path``), the address a server's processes bind and the one
others reach it at (``own_address``, ``reach``, ``url``), an instance's request limit
(``request_limit``), the router per pool (``routers``), and the check that the chosen engine
can run the plan at all (``check_engine``, by its profile in ``controller/models/engines.py``).

The engines' own commands are in ``vllm.py`` and ``sglang.py``; ``script.py`` renders them
as a start script per server and as JSON.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

import networkx as nx

from controller.errors import InputError
from controller.export.layout import InstanceView, Options, pools
from controller.models.engines import EngineProfile, engine_profile, in_flight, plan_problem
from controller.plan import Plan
from controller.topology.graph import gpus

# Public checkpoints of the models in controller/models/specs.py (their configs are the
# specs' source). OPT-175B has none: the operator gives --model-path.
CHECKPOINTS = {
    "OPT-125M": "facebook/opt-125m",
    "OPT-13B": "facebook/opt-13b",
    "OPT-66B": "facebook/opt-66b",
    "LLaMA-2-70B": "meta-llama/Llama-2-70b-hf",
    "LLaMA-3-8B": "meta-llama/Meta-Llama-3-8B",
    "LLaMA-3-70B": "meta-llama/Meta-Llama-3-70B",
}
# A server's own address where --address does not give it: the start script resolves the
# server's name (getent) into this variable before it starts anything, because the NIXL
# side channel and Ray bind to an address, not to a host name.
ADDR = "${ADDR}"
# A folder the start script makes for this run (``mktemp -d``: new, the serving user's own,
# mode 0700) for files a process reads by path (vLLM's VLLM_CONFIG_ROOT): never a fixed name
# in a shared folder, where another user could plant the folder or a symlink inside it first.
RUN = "${RUN}"
# The script's own names: "router" is the host the routers run on (``bash vllm.sh router``).
ROUTER_HOST = "router"
# A server the scripts resolve by its name (no --address) is written as a host name: letters,
# digits, '-', '.', '_', not starting with '-' (getent would read it as an option).
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
# Where each instance's Ray ports start when an instance spans servers: instance k takes
# RAY_BLOCK_BASE + k * RAY_BLOCK .. + RAY_BLOCK - 1 (Ray's own defaults, 6379, 8265, 10001,
# 52365, ..., would collide between two instances sharing a server).
RAY_BLOCK_BASE = 20000
RAY_BLOCK = 1000


class Command:
    """One process on one server: its argv and environment, what it is (``what``), when it
    starts (``stage``: 0 Ray heads, 1 Ray workers, 2 engines, 3 routers), the ``host:port``
    it waits for first (``after``), and the URL whose /health says it is up (``health``)."""

    def __init__(
        self,
        server: str,
        instance: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        what: str = "engine",
        stage: int = 2,
        after: str = "",
        health: str = "",
    ) -> None:
        self.server, self.instance, self.argv = server, instance, argv
        self.env = dict(env or {})
        self.what, self.stage, self.after, self.health = what, stage, after, health

    def to_dict(self) -> dict:
        return {
            "server": self.server,
            "instance": self.instance,
            "what": self.what,
            "stage": self.stage,
            "after": self.after,
            "health": self.health,
            "argv": self.argv,
            "env": self.env,
        }


def model_path(model: str, opts: Options) -> str:
    """What the engines load: ``--model-path``, else the model's public checkpoint; a model
    with none (OPT-175B) needs ``--model-path``."""
    if opts.model_path:
        return opts.model_path
    if model not in CHECKPOINTS:
        raise InputError(
            f"{model} has no public checkpoint: pass --model-path (a local folder or a "
            "Hugging Face name every server can load)"
        )
    return CHECKPOINTS[model]


def own_address(server: str, opts: Options) -> str:
    """What ``server``'s processes bind: ``--address``, else resolved at start (``ADDR``)."""
    return opts.addresses.get(server, ADDR)


def reach(server: str, opts: Options) -> str:
    """How other hosts reach ``server``, as the host of a URL or ``HOST:PORT``: ``--address``
    (an IPv6 one in brackets, ``[fd00::2]``), else its name."""
    ip = opts.addresses.get(server)
    if ip is None:
        return server
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


def check_servers(servers: list[str], opts: Options) -> None:
    """InputError naming the first server the scripts cannot write: one named like the
    routers' host, or one to be resolved by a name that is not a host name."""
    for s in servers:
        if s == ROUTER_HOST:
            raise InputError(
                f"server {s!r}: the start scripts keep that name for the routers' host; "
                "rename the server in the topology"
            )
        if s not in opts.addresses and not HOST_NAME.fullmatch(s):
            raise InputError(
                f"server {s!r} is not a host name the scripts can resolve: give --address SERVER=IP"
            )


def checked_port(port: int, what: str) -> int:
    """``port`` when it is one (1..65535); InputError naming ``what`` otherwise."""
    if not 1 <= port <= 65535:
        raise InputError(
            f"{what}: port {port} is not in 1..65535 (too many instances for the port "
            "layout of docs/export.md)"
        )
    return port


def url(server: str, port: int, opts: Options) -> str:
    return f"http://{reach(server, opts)}:{checked_port(port, f'{server} HTTP')}"


def request_limit(v: InstanceView, profile: EngineProfile, flag: str) -> int:
    """The requests ``v`` keeps in flight (``flag``'s value): its batch, raised to what the
    engine needs to pipeline (``in_flight``), with a note on ``v`` when raised."""
    limit = in_flight(profile, v.role, v.pp, v.batch)
    if limit != v.batch:
        v.notes.append(
            f"{flag} {limit}, not the batch {v.batch}: a prefill's batches (at most PP={v.pp} "
            "in flight) must fill, or its queue outgrows it (models.engines.InFlight)"
        )
    return limit


# the router's rule for both phases: the less loaded of two instances drawn at random, the
# rule the simulator routes by among many instances (docs/planner.md, "KV pairing"); both
# routers take it, and their default, cache_aware, routes by prompt prefix, which no planner
# here models
ROUTER_POLICY = "power_of_two"


def routers(
    views: list[InstanceView],
    opts: Options,
    profile: EngineProfile,
    head: list[str],
    prefill_extra: Callable[[InstanceView], list[str]] = lambda v: [],
) -> list[Command]:
    """One router per pool (``layout.pools``: one, over every instance): ``head`` (the
    router's command and its P/D mode flag), the routing rule, each prefill instance's URL
    (and ``prefill_extra`` of it), each decode instance's URL; pool j listens on the
    profile's router port + j."""
    out = []
    for k, (pre, dec) in enumerate(pools(views)):
        argv = [*head, "--policy", ROUTER_POLICY]
        for v in pre:
            argv += ["--prefill", url(v.head.server, v.port, opts), *prefill_extra(v)]
        for v in dec:
            argv += ["--decode", url(v.head.server, v.port, opts)]
        port = checked_port(profile.ports.router + k, "router")
        argv += ["--host", "0.0.0.0", "--port", str(port)]
        health = f"http://127.0.0.1:{port}"
        out.append(Command(ROUTER_HOST, f"pool/{k}", argv, {}, "router", 3, health=health))
    return out


def check_engine(plan: Plan, g: nx.Graph, engine: str) -> EngineProfile:
    """The profile of ``engine``, after checking that it can run ``plan`` on ``g``; else
    :class:`InputError` naming the rule the plan breaks."""
    profile = engine_profile(engine)
    server_of = {x: str(g.nodes[x].get("server", x)) for x in gpus(g)}
    bad = plan_problem(profile, plan, server_of)
    if bad is not None:
        raise InputError(f"{engine} cannot run this plan: {bad}; plan with --engine {engine}")
    return profile
