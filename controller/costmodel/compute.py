"""Computation latency (paper Eqs. 12-13), per transformer layer on one GPU of a TP group.

The coefficients C1..C6 come per GPU type from a roofline derivation (``default_coefficients``):
the datasheet figures with the efficiency factors and per-layer overheads below, whose
sources (or the measurement that would replace them) are in docs/costmodel.md.

Eq. 12 (prefill, K tokens in the batch, K2 = sum of squared input lengths):
    t = C1 / TP * W * K  +  C2 / (b * TP) * 3 h K2  +  C3
Eq. 13 (decode step, batch of B requests holding K context tokens):
    t = max(C4 * W, C1 * W * B) / TP  +  C5 / TP * 3 h_kv K  +  C6
where W is the layer's weight count (4h^2 + 2hm for OPT; the model's own count for
grouped-query attention and gated FFNs) and h_kv the K/V width (h for OPT). Two deliberate
departures from the paper's text, both documented in docs/costmodel.md: the per-layer form
(a request crosses all L layers; pipeline stages split them), and the ``max`` in Eq. 13, the
roofline: a decode step reads every weight once (memory-bound, C4) but at large batch the
GEMMs become compute-bound (C1), which Eq. 13 alone would miss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from controller.models.gpus import gpu_spec
from controller.models.specs import ModelSpec

# Efficiency factors of the roofline defaults: fraction of the datasheet peak a serving
# engine reaches (FasterTransformer/vLLM-class kernels on large GEMMs and attention). All five
# values below are assumptions, not fits (the efficiencies lie within published measurements):
# docs/costmodel.md ("Every parameter and its source") gives them and what to measure instead.
GEMM_EFFICIENCY = 0.6
ATTENTION_EFFICIENCY = 0.4
MEMORY_EFFICIENCY = 0.7
PREFILL_LAYER_OVERHEAD_S = 30e-6  # ~10 kernel launches per layer
DECODE_LAYER_OVERHEAD_S = 20e-6
ATTENTION_BLOCK = 128  # b in Eq. 12


@dataclass(frozen=True)
class ComputeCoefficients:
    c1: float  # s per multiply-accumulate of the GEMMs
    c2: float  # s per unit of 3h*K2/b (attention)
    c3: float  # s per prefill layer, fixed
    c4: float  # s per weight read in a decode step
    c5: float  # s per unit of 3 h_kv K (KV-cache read)
    c6: float  # s per decode layer, fixed
    block: int = ATTENTION_BLOCK
    # s per multiply-accumulate of a decode step's GEMMs; None: C1 (the roofline's one peak).
    # A fit to an engine profile gives decode its own (costmodel/profiled.py): a step's
    # matrix-vector GEMMs do not run at a prefill's matrix-matrix speed
    c1d: float | None = None

    @property
    def decode_c1(self) -> float:
        """The decode GEMMs' C1 (``c1d``, else ``c1``)."""
        return self.c1 if self.c1d is None else self.c1d

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def default_coefficients(gpu_type: str, dtype_bytes: int = 2) -> ComputeCoefficients:
    """Roofline coefficients from the datasheet (``controller.models.gpus``):
    C1 = 2 FLOP per MAC / (peak * GEMM_EFFICIENCY); C2 so that C2 * 3h K2 / b equals the
    attention's 4 h K2 FLOPs at ATTENTION_EFFICIENCY; C4 = dtype bytes / (HBM * MEMORY_EFF);
    C5 so that C5 * 3 h_kv K equals reading K tokens of K and V (2 h_kv dtype bytes each)."""
    s = gpu_spec(gpu_type)
    flops = s.fp16_flops
    mem = s.mem_bw * MEMORY_EFFICIENCY
    return ComputeCoefficients(
        c1=2.0 / (flops * GEMM_EFFICIENCY),
        c2=4.0 * ATTENTION_BLOCK / (3.0 * flops * ATTENTION_EFFICIENCY),
        c3=PREFILL_LAYER_OVERHEAD_S,
        c4=dtype_bytes / mem,
        c5=2.0 * dtype_bytes / (3.0 * mem),
        c6=DECODE_LAYER_OVERHEAD_S,
    )


def layer_weights(model: ModelSpec) -> float:
    """W: weights per layer (4h^2 + 2hm for OPT)."""
    h = model.hidden
    attn = 2 * h * h + 2 * h * model.kv_dim
    ffn = (3 if model.gated_ffn else 2) * h * model.ffn
    return float(attn + ffn)


def prefill_layer_time(
    co: ComputeCoefficients, model: ModelSpec, tp: int, k_in: float, k_in2: float
) -> float:
    """Eq. 12: one prefill layer for a batch of ``k_in`` tokens (``k_in2`` = sum l_i^2), s."""
    w = layer_weights(model)
    return co.c1 / tp * w * k_in + co.c2 / (co.block * tp) * 3 * model.hidden * k_in2 + co.c3


def decode_layer_time(
    co: ComputeCoefficients, model: ModelSpec, tp: int, batch: float, k_ctx: float
) -> float:
    """Eq. 13 (with the roofline max): one decode step of one layer for ``batch`` requests
    holding ``k_ctx`` context tokens in total, s."""
    w = layer_weights(model)
    return (
        max(co.c4 * w, co.decode_c1 * w * batch) / tp
        + co.c5 / tp * 3 * model.kv_dim * k_ctx
        + co.c6
    )
