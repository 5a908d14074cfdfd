"""The `Plan` every planner returns: plain data, serialisable to JSON (docs/design.md §6).

A plan holds, for prefill and for decode, the parallelism (TP = ``tp``, PP = ``pp``), the
instances with the GPU ids of each pipeline stage, and one :class:`Group` per stage (the
tensor-parallel group whose all-reduces the network carries): its scheme, the aggregation
switch and its aggregator slot range, and the path of every member (Table II of the paper).
It also holds the KV-cache transfer pairs, the predicted TTFT, TPOT, KV-transfer time, total
rate H and per-GPU rate, and the cost-model options the plan was priced with (``options``),
so that the simulator and the controller price it the same way.

Schemes:
  ``ring``  NCCL ring all-reduce over the group's links (Eq. 11).
  ``ina``   flat in-network aggregation: every member streams its whole vector to one switch
            (``switch``, ``slots``), which multicasts the sum back (Eqs. 8-10).
  ``hier``  hierarchical INA, as NCCL's CollNet does with SHARP: reduce-scatter inside each
            server over NVLink, then per rail one INA group of one member per server
            aggregating one shard on the rail's switch (``rails``), then all-gather over
            NVLink. ``switch`` and ``slots`` are unset; each :class:`Rail` has its own.

Units: seconds, bytes, requests/s. GPU and switch ids are the node names of the cluster
graph (``controller.topology``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from controller.errors import InputError

Scheme = Literal["ina", "ring", "hier"]
Role = Literal["prefill", "decode"]
Layout = Literal["disaggregated", "colocated"]


@dataclass
class SlotRange:
    """Aggregator slots ``[start, start + count)`` on the group's aggregation switch."""

    start: int
    count: int


@dataclass
class Rail:
    """One rail of a hierarchical-INA group: the members (one per server) that hold shard
    ``shard`` of ``shards`` after the intra-server reduce-scatter, and the switch that
    aggregates that shard for them. ``paths`` maps each of these members to its route to the
    switch (results return the same way). The controller installs each rail as its own
    aggregation group on its switch."""

    switch: str
    shard: int
    shards: int
    members: list[str]
    slots: SlotRange | None
    paths: dict[str, list[str]]


@dataclass
class Group:
    """One tensor-parallel group: the GPUs of one pipeline stage of one instance.

    ``paths`` maps each member to the node list its all-reduce data takes: for INA, from
    the GPU to the aggregation switch (results come back the same way); for ring, from
    the GPU to its successor in the ring order; for hier, from the GPU to its rail's switch
    (the NVLink steps inside a server are implied).
    """

    instance: int
    stage: int
    gpus: list[str]
    scheme: Scheme
    switch: str | None
    slots: SlotRange | None
    paths: dict[str, list[str]]
    allreduce_s: float  # predicted time of one all-reduce of the phase's message size
    ina_s: float | None  # what INA would cost (None: no INA switch reachable / allowed)
    ring_s: float  # what ring would cost
    reason: str  # why this scheme was chosen, for people reading the plan
    rails: list[Rail] = field(default_factory=list)  # hier only: one per shard
    hier_s: float | None = None  # what hierarchical INA would cost (None: not possible)


@dataclass
class Instance:
    """One model replica: ``stages[i]`` is the list of GPU ids of pipeline stage ``i``; its
    TP is ``len(stages[0])`` and its PP ``len(stages)``. ``batch`` is a decode instance's
    continuous-batching limit per micro-batch (0: the phase's ``batch_size``); instances of
    one phase may hold different GPU types and so different batches. ``rate`` is what the
    planner predicts it sustains within the SLA, requests/s (0: not predicted)."""

    stages: list[list[str]]
    batch: int = 0
    rate: float = 0.0


@dataclass
class PhasePlan:
    """Prefill or decode side of a plan."""

    role: Role
    tp: int
    pp: int
    gpu_type: str
    instances: list[Instance]
    groups: list[Group]
    comm_s: float  # T_n of one iteration (all-reduces of every stage + pipeline hops)
    compute_s: float  # T_c of one iteration
    batch_size: int  # prefill: requests per batch; decode: continuous-batching size
    rate_per_instance: float  # requests/s one instance sustains within the SLA


@dataclass
class KVTransfer:
    """KV cache of one prefill GPU (its layers and tensor shard) to one decode GPU."""

    src: str
    dst: str
    bytes: float
    path: list[str]
    time_s: float


@dataclass
class Predicted:
    ttft_s: float
    tpot_s: float
    kv_transfer_s: float
    rate: float  # H of Eq. 1: SLA-meeting requests/s of the whole deployment
    rate_per_gpu: float  # H / GPUs used (the evaluation's per-GPU metric)
    gpus_used: int


@dataclass
class IdleGPUs:
    """GPUs of the cluster a plan leaves unused, for one reason (docs/planner.md, "GPUs left
    idle"). ``role`` is the pool they belong to (prefill, decode, or any where the plan has
    no pools); ``gpus`` how many; ``reason`` why the planner left them out."""

    role: str
    gpus: int
    reason: str


@dataclass
class ColocatedNode:
    """A compute node of a colocated plan (the seed planners, docs/related-planners.md): a
    tensor-parallel group of GPUs inside one server that runs prefill and decode iterations of
    layers ``[start, end)`` on the same GPUs, with continuous batching. ``tokens_per_s`` is the
    planner's model of the tokens it processes per second at this layer count (Helix's T_j)."""

    name: str
    gpus: list[str]
    start: int
    end: int
    tokens_per_s: float = 0.0


@dataclass
class FlowEdge:
    """Helix: one valid connection of the max-flow solution, tokens/s. ``source`` and ``sink``
    stand for the coordinator; the flows are the IWRR scheduler's weights."""

    src: str
    dst: str
    flow: float
    capacity: float


@dataclass
class Replica:
    """A fixed pipeline: node names in layer order; a request mapped to it runs every stage.
    ``rate`` is the planner's predicted requests/s; ``share`` the fraction of each workload
    class assigned to it (the cost-efficiency planner's x_{c,w} per copy)."""

    nodes: list[str]
    rate: float = 0.0
    share: dict[str, float] = field(default_factory=dict)


@dataclass
class ColocatedPlan:
    """Serving without disaggregation: prefill and decode of a request run on the same nodes.

    Requests follow either per-request pipelines through ``flows`` (Helix's max flow, picked
    by its IWRR scheduler or a baseline's) or one of the fixed ``replicas`` (picked by a
    request mapper). ``scheduler`` names the policy (docs/related-planners.md); ``objective``
    says what the planner optimised; ``solver`` holds the solver's status, objective, bound
    and time; ``params`` the scheduler's parameters."""

    scheduler: str
    nodes: list[ColocatedNode]
    flows: list[FlowEdge] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    partial_inference: bool = False
    tokens_per_s: float = 0.0
    objective: str = ""
    solver: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SLA:
    """Service-level agreement: TTFT and TPOT bounds (s) and the attainment percentile."""

    ttft_s: float
    tpot_s: float
    attainment: float = 0.9  # fraction of requests that must meet both bounds

    def __post_init__(self) -> None:
        if not (0 < self.ttft_s < math.inf and 0 < self.tpot_s < math.inf):  # NaN fails too
            raise InputError(
                f"SLA bounds must be positive and finite (ttft={self.ttft_s}, tpot={self.tpot_s})"
            )
        if not 0 < self.attainment <= 1:  # NaN fails too
            raise InputError(f"SLA attainment must be in (0, 1], got {self.attainment}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class Plan:
    planner: str
    topology: str
    model: str
    workload: str
    sla: SLA
    prefill: PhasePlan
    decode: PhasePlan
    kv_transfer: list[KVTransfer]
    predicted: Predicted
    notes: list[str] = field(default_factory=list)
    # cost-model options the plan was priced with (cost mode, INA lanes, TPOT mode, ...):
    # plain JSON values, read back by the simulator and the controller
    options: dict[str, Any] = field(default_factory=dict)
    # "colocated": the plan serves prefill and decode on the same GPUs (``colocated``); its
    # prefill and decode phases are then empty
    layout: Layout = "disaggregated"
    colocated: ColocatedPlan | None = None
    # the GPUs the plan leaves unused, grouped by why; their sum is the cluster's GPUs less
    # ``predicted.gpus_used``
    idle: list[IdleGPUs] = field(default_factory=list)
    # the planner stopped at its time limit: the plan is the best it had found by then
    time_limit_reached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def all_gpus(self) -> list[str]:
        out = [
            g
            for phase in (self.prefill, self.decode)
            for i in phase.instances
            for s in i.stages
            for g in s
        ]
        if self.colocated is not None:
            out += [g for n in self.colocated.nodes for g in n.gpus]
        return out
