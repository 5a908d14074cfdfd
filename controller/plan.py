"""The `Plan` every planner returns: plain data, serialisable to JSON (DESIGN.md §6).

A plan holds, for prefill and for decode, the parallelism (TP = ``tp``, PP = ``pp``), the
instances with the GPU ids of each pipeline stage, and one :class:`Group` per stage (the
tensor-parallel group whose all-reduces the network carries): its scheme (``ina`` or
``ring``), the aggregation switch and its aggregator slot range, and the path of every
member (Table II of the paper). It also holds the KV-cache transfer pairs and the
predicted TTFT, TPOT, KV-transfer time and per-GPU rate.

Units: seconds, bytes, requests/s. GPU and switch ids are the node names of the cluster
graph (``controller.topology``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Scheme = Literal["ina", "ring"]
Role = Literal["prefill", "decode"]


@dataclass
class SlotRange:
    """Aggregator slots ``[start, start + count)`` on the group's aggregation switch."""

    start: int
    count: int


@dataclass
class Group:
    """One tensor-parallel group: the GPUs of one pipeline stage of one instance.

    ``paths`` maps each member to the node list its all-reduce data takes: for INA, from
    the GPU to the aggregation switch (results come back the same way); for ring, from
    the GPU to its successor in the ring order.
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


@dataclass
class Instance:
    """One model replica: ``stages[i]`` is the list of GPU ids of pipeline stage ``i``."""

    stages: list[list[str]]


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
    rate: float  # requests/s of the whole deployment
    rate_per_gpu: float  # requests/s per GPU used (the paper's scalability metric)
    gpus_used: int


@dataclass
class Plan:
    planner: str
    topology: str
    model: str
    workload: str
    sla: dict[str, float]
    prefill: PhasePlan
    decode: PhasePlan
    kv_transfer: list[KVTransfer]
    predicted: Predicted
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def all_gpus(self) -> list[str]:
        return [
            g
            for phase in (self.prefill, self.decode)
            for i in phase.instances
            for s in i.stages
            for g in s
        ]

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Plan:
        def phase(p: dict[str, Any]) -> PhasePlan:
            groups = [
                Group(**{**g, "slots": SlotRange(**g["slots"]) if g.get("slots") else None})
                for g in p["groups"]
            ]
            instances = [Instance(**i) for i in p["instances"]]
            return PhasePlan(**{**p, "groups": groups, "instances": instances})

        return Plan(
            planner=d["planner"],
            topology=d["topology"],
            model=d["model"],
            workload=d["workload"],
            sla=dict(d["sla"]),
            prefill=phase(d["prefill"]),
            decode=phase(d["decode"]),
            kv_transfer=[KVTransfer(**k) for k in d["kv_transfer"]],
            predicted=Predicted(**d["predicted"]),
            notes=list(d.get("notes", [])),
        )

    @staticmethod
    def load(path: str | Path) -> Plan:
        return Plan.from_dict(json.loads(Path(path).read_text()))
