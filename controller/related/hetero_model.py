"""The memory and throughput model of the heterogeneous high-throughput paper (``003_...``,
§3), an instance being a tensor-parallel group inside one machine.

The seed text lost its formulas; they are rebuilt from its prose (docs/related-planners.md):

- Eq. 1, KV memory of an instance of t accelerators of memory m:
  ``M_kv = eta t m - t M_static - P b`` with eta the engine's memory fraction (0.9, vLLM's
  gpu_memory_utilization as the paper sets it), M_static the memory the engine keeps for
  static resources (3 GB per GPU: the paper measures 1-3 GB of CUDA graphs) and P b the
  model's parameter bytes;
- Eq. 2, a valid configuration holds one longest request: ``M_kv >= (L_in + L_out) kv``;
- Eq. 3, a prefill batch of b requests whose longest prompt is l: ``a1 b l + a2 b + a3``;
- Eq. 4, the decode iteration making the j-th token of a batch of b requests, each holding
  l + j tokens of KV: ``a4 b (l + j) + a5 b + a6``;
- a1..a6 fitted by least squares to profiled timings (the *instance profiler*). Here the
  "hardware" profiled is the project's cost model (``perf.PerfModel``): prefill and decode
  iterations at batch sizes 1..256 and lengths 64..2048.
- Alg. 1: requests grouped in order into static batches as large as the KV memory holds at
  the batch's longest lengths; each batch costs Eq. 3 plus the sum of Eq. 4 over its longest
  output; an instance's throughput is the tokens (prompt and output) of the batches over
  their time, and the system's the sum over instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.models.specs import ModelSpec
from controller.related.perf import NodeHW, PerfModel
from controller.units import GB

ENGINE_MEMORY_FRACTION = 0.9  # vLLM gpu_memory_utilization, as the paper sets it
STATIC_BYTES_PER_GPU = 3 * GB  # the paper: vLLM keeps 1-3 GB of CUDA graphs per GPU
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROFILE_LENGTHS = (64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class InstanceModel:
    """One instance: its KV memory (Eq. 1), KV bytes per token and fitted a1..a6."""

    kv_bytes: float
    kv_per_token: float
    alpha: tuple[float, float, float, float, float, float]

    def prefill_s(self, b: float, l_in: float) -> float:
        """Eq. 3."""
        a1, a2, a3 = self.alpha[:3]
        return a1 * b * l_in + a2 * b + a3

    def decode_s(self, b: float, l_in: float, l_out: float) -> float:
        """Sum of Eq. 4 over j = 1..l_out: a4 b (l_out l_in + l_out (l_out + 1) / 2) +
        l_out (a5 b + a6)."""
        a4, a5, a6 = self.alpha[3:]
        return a4 * b * (l_out * l_in + l_out * (l_out + 1) / 2) + l_out * (a5 * b + a6)

    def batch_s(self, b: float, l_in: float, l_out: float) -> float:
        return self.prefill_s(b, l_in) + self.decode_s(b, l_in, l_out)

    def ideal_batch(self, l_in: float, l_out: float) -> int:
        """Eq. 5: identical requests until the KV memory is full (at least 1)."""
        return max(1, int(self.kv_bytes // max(1.0, (l_in + l_out) * self.kv_per_token)))

    def to_params(self) -> dict:
        return {"kv_bytes": self.kv_bytes, "kv_per_token": self.kv_per_token,
                "alpha": list(self.alpha)}  # fmt: skip

    @classmethod
    def from_params(cls, d: dict) -> InstanceModel:
        a = tuple(float(x) for x in d["alpha"])
        if len(a) != 6:
            raise ValueError("an instance model has six constants a1..a6")
        return cls(float(d["kv_bytes"]), float(d["kv_per_token"]), a)  # type: ignore[arg-type]


def kv_memory(node: NodeHW, model: ModelSpec) -> float:
    """Eq. 1, bytes (negative when the weights do not fit)."""
    t = node.tp
    return (
        ENGINE_MEMORY_FRACTION * t * node.memory_bytes
        - t * STATIC_BYTES_PER_GPU
        - model.param_bytes
    )


def fit(perf: PerfModel, node: NodeHW) -> tuple[float, float, float, float, float, float]:
    """The instance profiler: a1..a6 by least squares on the cost model's timings."""
    L = perf.model.layers
    rows_p, y_p, rows_d, y_d = [], [], [], []
    for b in PROFILE_BATCHES:
        for length in PROFILE_LENGTHS:
            rows_p.append((b * length, b, 1.0))
            y_p.append(perf.step_time(node, L, b * length, float(b) * length * length))
            rows_d.append((b * length, b, 1.0))
            y_d.append(perf.step_time(node, L, 0.0, 0.0, b, float(b) * length))
    ap = np.linalg.lstsq(np.asarray(rows_p, float), np.asarray(y_p), rcond=None)[0]
    ad = np.linalg.lstsq(np.asarray(rows_d, float), np.asarray(y_d), rcond=None)[0]
    return tuple(float(x) for x in (*ap, *ad))  # type: ignore[return-value]


def instance_model(perf: PerfModel, node: NodeHW) -> InstanceModel:
    return InstanceModel(
        kv_memory(node, perf.model), perf.kv_bytes_per_token(perf.model.layers), fit(perf, node)
    )


def instance_throughput(im: InstanceModel, inputs: Sequence[int], outputs: Sequence[int]) -> float:
    """Alg. 1: tokens/s of one instance on these requests, static batches in order."""
    total_tokens = 0.0
    total_s = 0.0
    i, n = 0, len(inputs)
    while i < n:
        b, max_in, max_out = 0, 0, 0
        while i + b < n:
            li, lo = max(max_in, inputs[i + b]), max(max_out, outputs[i + b])
            if b and (b + 1) * (li + lo) * im.kv_per_token > im.kv_bytes:
                break
            b, max_in, max_out = b + 1, li, lo
        total_s += im.batch_s(b, max_in, max_out)
        total_tokens += sum(inputs[i : i + b]) + sum(outputs[i : i + b])
        i += b
    return total_tokens / total_s if total_s > 0 else 0.0
