"""``--format vllm`` and ``--format sglang``: launch commands for disaggregated prefill/decode.

Each format writes two files: ``<fmt>.sh``, a bash script with one function per server (run
``bash vllm.sh srv0`` on server srv0), and ``<fmt>.json``, the same commands as data (argv
and environment per server, each instance's KV peers, the router pools). docs/export.md
lists every flag and where it comes from; in short:

vLLM (``vllm serve``, its documented disaggregated-prefill setup with the NIXL connector):
``--tensor-parallel-size``/``--pipeline-parallel-size`` from the plan, ``--max-num-seqs`` the
instance's batch, ``--kv-transfer-config`` with ``kv_role`` ``kv_producer`` (prefill) or
``kv_consumer`` (decode), ``CUDA_VISIBLE_DEVICES`` per server, and for TP > 1
``--disable-custom-all-reduce`` plus ``VLLM_ALLREDUCE_USE_SYMM_MEM=0``: vLLM's own all-reduce
kernels bypass NCCL, and with them the tuner plugin that applies the plan's scheme. An
instance on several servers runs on a Ray cluster of those servers (``ray start``, then
``--distributed-executor-backend ray``), as vLLM documents multi-node serving.

SGLang (``python -m sglang.launch_server``): ``--disaggregation-mode prefill|decode``,
``--tp-size``/``--pp-size``, ``--max-running-requests`` the batch, ``--nnodes``/``--node-rank``/
``--dist-init-addr`` on several servers, ``--disable-custom-all-reduce`` for TP > 1, and one
``sglang_router`` per set of instances the plan pairs.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field

from controller.export.layout import InstanceView, Options, pools

# Public checkpoints of the models in controller/models/specs.py (their configs are the
# specs' source). OPT-175B has no public checkpoint: pass --model-path.
CHECKPOINTS = {
    "OPT-13B": "facebook/opt-13b",
    "OPT-66B": "facebook/opt-66b",
    "LLaMA-2-70B": "meta-llama/Llama-2-70b-hf",
    "LLaMA-3-8B": "meta-llama/Meta-Llama-3-8B",
    "LLaMA-3-70B": "meta-llama/Meta-Llama-3-70B",
}
NIXL_SIDE_CHANNEL_BASE = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
RAY_PORT_BASE = 6379  # Ray's default head port; instance k uses 6379 + k
SGLANG_BOOTSTRAP_BASE = 8998  # SGLang's default --disaggregation-bootstrap-port
SGLANG_DIST_PORT_BASE = 5000  # --dist-init-addr port of SGLang's multi-node example
ROUTER_PORT_BASE = 8000


@dataclass
class Command:
    server: str
    instance: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def model_path(model: str, opts: Options) -> str:
    return opts.model_path or CHECKPOINTS.get(model, model)


def _url(server: str, port: int) -> str:
    return f"http://{server}:{port}"


# -- vLLM ------------------------------------------------------------------------------------
def _vllm(v: InstanceView, model: str, opts: Options, side_channel: int) -> list[Command]:
    kv = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if v.role == "prefill" else "kv_consumer",
    }
    argv = [
        "vllm", "serve", model_path(model, opts),
        "--port", str(v.port),
        "--tensor-parallel-size", str(v.tp),
        "--pipeline-parallel-size", str(v.pp),
        "--max-num-seqs", str(v.batch),
        "--kv-transfer-config", json.dumps(kv, separators=(",", ":")),
    ]  # fmt: skip
    extra_env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel)}
    if v.tp > 1:
        argv.append("--disable-custom-all-reduce")
        extra_env["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
    if len(v.servers) == 1:
        return [Command(v.head.server, v.name, argv, {**v.head.env, **extra_env}, "engine")]
    ray_port = RAY_PORT_BASE + v.port - opts.base_port
    cmds = []
    for k, part in enumerate(v.servers):
        env = {**part.env, **extra_env}
        head = ["--head", "--port", str(ray_port)]
        join = ["--address", f"{v.head.server}:{ray_port}"]
        cmds.append(
            Command(
                part.server,
                v.name,
                ["ray", "start", *(head if k == 0 else join), "--num-gpus", str(len(part.cuda))],
                env,
                "ray head" if k == 0 else "ray worker",
            )
        )
    serve = argv + ["--distributed-executor-backend", "ray"]
    cmds.append(Command(v.head.server, v.name, serve, {**v.head.env, **extra_env}, "engine"))
    return cmds


def vllm_commands(views: list[InstanceView], model: str, opts: Options) -> list[Command]:
    out, port = [], NIXL_SIDE_CHANNEL_BASE
    for v in views:
        out += _vllm(v, model, opts, port)
        port += v.tp * v.pp  # one side-channel port per rank
    return out


# -- SGLang ----------------------------------------------------------------------------------
def _sglang(v: InstanceView, model: str, opts: Options) -> list[Command]:
    k = v.port - opts.base_port
    base = [
        "python", "-m", "sglang.launch_server",
        "--model-path", model_path(model, opts),
        "--host", "0.0.0.0",
        "--port", str(v.port),
        "--disaggregation-mode", v.role,
        "--disaggregation-transfer-backend", "nixl",
        "--tp-size", str(v.tp),
        "--pp-size", str(v.pp),
        "--max-running-requests", str(v.batch),
    ]  # fmt: skip
    if v.role == "prefill":
        base += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_BASE + k)]
    if v.tp > 1:
        base.append("--disable-custom-all-reduce")
    if len(v.servers) == 1:
        return [Command(v.head.server, v.name, base, dict(v.head.env), "engine")]
    dist = f"{v.head.server}:{SGLANG_DIST_PORT_BASE + k}"
    return [
        Command(
            part.server,
            v.name,
            base
            + ["--dist-init-addr", dist, "--nnodes", str(len(v.servers)), "--node-rank", str(r)],
            dict(part.env),
            f"engine, node {r} of {len(v.servers)}",
        )
        for r, part in enumerate(v.servers)
    ]


def sglang_commands(views: list[InstanceView], model: str, opts: Options) -> list[Command]:
    out = [c for v in views for c in _sglang(v, model, opts)]
    for k, (pre, dec) in enumerate(pools(views)):
        argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for v in pre:
            bootstrap = SGLANG_BOOTSTRAP_BASE + v.port - opts.base_port
            argv += ["--prefill", _url(v.head.server, v.port), str(bootstrap)]
        for v in dec:
            argv += ["--decode", _url(v.head.server, v.port)]
        argv += ["--host", "0.0.0.0", "--port", str(ROUTER_PORT_BASE + k)]
        out.append(Command("router", f"pool/{k}", argv, {}, "router"))
    return out


# -- rendering -------------------------------------------------------------------------------
def _function(server: str) -> str:
    """The shell function of ``server``: one name per server, distinct for distinct servers.
    Letters and digits stay; ``_`` becomes ``__`` and any other character ``_XX`` (its code
    in hex), so ``srv-0``, ``srv_0`` and ``srv.0`` give ``on_srv_2d0``, ``on_srv__0`` and
    ``on_srv_2e0`` (read left to right, the escapes decode one way only)."""

    def esc(c: str) -> str:
        if c.isascii() and c.isalnum():
            return c
        return "__" if c == "_" else f"_{ord(c):02x}"

    return "on_" + "".join(esc(c) for c in server)


def render_shell(fmt: str, commands: list[Command], views: list[InstanceView]) -> str:
    servers = list(dict.fromkeys(c.server for c in commands))
    lines = [
        "#!/usr/bin/env bash",
        f"# HeroServe {fmt} launch (heroserve export --format {fmt}; docs/export.md).",
        f"# Run `bash {fmt}.sh SERVER` on each server: {', '.join(servers)}.",
        "# Multi-server instances: start their workers first, then the server that heads them.",
        "set -euo pipefail",
        "",
    ]
    for v in views:
        peers = ", ".join(p.instance for p in v.kv_peers) or "any"
        lines.append(f"# {v.name}: TP={v.tp} PP={v.pp} batch={v.batch}, KV peers: {peers}")
        lines += [f"#   note: {n}" for n in v.notes]
    lines.append("")
    for s in servers:
        lines.append(f"{_function(s)}() {{")
        for c in (c for c in commands if c.server == s):
            lines.append(f"  # {c.instance}: {c.what}")
            # `ray start` returns once its node is up, which the engine after it needs
            lines.append(f"  {c.shell()}" + ("" if c.argv[0] == "ray" else " &"))
        lines += ["  wait", "}", ""]
    names = " ".join(servers)
    lines += [
        'case "${1:-}" in',
        *(f"  {shlex.quote(s)}) {_function(s)} ;;" for s in servers),
        f'  *) echo "usage: $0 SERVER (one of: {names})" >&2; exit 2 ;;',
        "esac",
        "",
    ]
    return "\n".join(lines)


def render_json(fmt: str, commands: list[Command], views: list[InstanceView]) -> str:
    doc = {
        "format": fmt,
        "instances": [
            {
                "name": v.name,
                "role": v.role,
                "tp": v.tp,
                "pp": v.pp,
                "batch": v.batch,
                "servers": [
                    {"server": p.server, "gpus": p.cuda, "gpu_ids": p.gpu_ids} for p in v.servers
                ],
                "url": _url(v.head.server, v.port),
                "kv_peers": [p.instance for p in v.kv_peers],
                "notes": v.notes,
            }
            for v in views
        ],
        "pools": [
            {"prefill": [v.name for v in pre], "decode": [v.name for v in dec]}
            for pre, dec in pools(views)
        ],
        "commands": [asdict(c) for c in commands],
    }
    return json.dumps(doc, indent=1) + "\n"
