"""``--format sglang``: per instance ``python -m sglang.launch_server`` in its disaggregation
mode with the NIXL transfer backend (one process per server, ``--nnodes``/``--node-rank``
across servers), and one ``sglang_router`` per pool (docs/export.md, "SGLang").

Every flag's source: TP/PP from the plan; ``--max-running-requests`` the instance's batch, at
least PP for a pipelined prefill; ``--disaggregation-bootstrap-port`` (prefill) from SGLang's
default 8998, one per instance; ``--dist-init-addr`` from its multi-node example's 5000, ten
ports per instance (SGLang takes the ports after it for its own sockets);
``SGLANG_HOST_IP`` the server's address (what SGLang's NIXL agents advertise);
``--disable-custom-all-reduce`` for TP > 1 (the tuner plugin applies the plan's scheme only
to NCCL's all-reduces).
"""

from __future__ import annotations

from controller.export.engines import (
    Command,
    checked_port,
    model_path,
    own_address,
    reach,
    request_limit,
    routers,
    url,
)
from controller.export.layout import InstanceView, Options
from controller.models.engines import SGLANG

DIST_PORTS_PER_INSTANCE = 10


def bootstrap_port(v: InstanceView, opts: Options) -> int:
    k = v.port - opts.base_port
    return checked_port(SGLANG.ports.kv_side_channel + k, f"{v.name} bootstrap")


def _instance(v: InstanceView, model: str, opts: Options) -> list[Command]:
    k = v.port - opts.base_port
    seqs = request_limit(v, SGLANG, "--max-running-requests")
    base = [
        "python", "-m", "sglang.launch_server",
        "--model-path", model_path(model, opts),
        "--host", "0.0.0.0",
        "--port", str(v.port),
        "--disaggregation-mode", v.role,
        "--disaggregation-transfer-backend", SGLANG.kv_connector,
        "--tp-size", str(v.tp),
        "--pp-size", str(v.pp),
        "--max-running-requests", str(seqs),
    ]  # fmt: skip
    if v.role == "prefill":
        base += ["--disaggregation-bootstrap-port", str(bootstrap_port(v, opts))]
    if v.tp > 1:
        base.append("--disable-custom-all-reduce")
    health = url(v.head.server, v.port, opts)

    def env(server: str, part_env: dict) -> dict:
        return {**part_env, SGLANG.side_channel_host_env: own_address(server, opts)}

    if len(v.servers) == 1:
        return [Command(v.head.server, v.name, base, env(v.head.server, v.head.env), health=health)]
    assert SGLANG.ports.dist_init is not None
    first = SGLANG.ports.dist_init + DIST_PORTS_PER_INSTANCE * k
    # SGLang takes the ports after it for its own sockets
    checked_port(first + DIST_PORTS_PER_INSTANCE - 1, f"{v.name} --dist-init-addr")
    dist = f"{reach(v.head.server, opts)}:{first}"
    n = len(v.servers)
    return [
        Command(
            part.server,
            v.name,
            base + ["--dist-init-addr", dist, "--nnodes", str(n), "--node-rank", str(r)],
            env(part.server, part.env),
            f"engine, node {r} of {n}",
            health=health if r == 0 else "",  # node 0 serves HTTP; the others join it
        )
        for r, part in enumerate(v.servers)
    ]


def sglang_commands(views: list[InstanceView], model: str, opts: Options) -> list[Command]:
    """Every instance's processes, then one router per pool (``layout.pools``)."""
    out = [c for v in views for c in _instance(v, model, opts)]
    head = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    return out + routers(views, opts, SGLANG, head, lambda v: [str(bootstrap_port(v, opts))])
