"""Transformer model specs, Table I of the paper, from the models' published configs.

R (parameter bytes) is computed from the architecture rather than rounded marketing sizes:
per layer 4h^2 attention projections (with grouped-query attention the K and V projections
shrink to h * kv_heads * head_dim each) plus the FFN (2hm for OPT's two matrices, 3hm for
LLaMA's gated three), plus embeddings (vocab x h, and an untied LM head for LLaMA)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int  # L
    hidden: int  # h
    heads: int  # A
    kv_heads: int  # grouped-query attention; == heads for OPT
    ffn: int  # m
    vocab: int
    gated_ffn: bool  # LLaMA's SwiGLU has three FFN matrices
    tied_embeddings: bool
    dtype_bytes: int = 2  # FP16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (or V) per token: kv_heads * h / A."""
        return self.kv_heads * self.hidden // self.heads

    @property
    def params(self) -> float:
        h, m = self.hidden, self.ffn
        attn = 2 * h * h + 2 * h * self.kv_dim
        ffn = (3 if self.gated_ffn else 2) * h * m
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + ffn) + emb

    @property
    def param_bytes(self) -> float:
        """R of Table I, bytes."""
        return self.params * self.dtype_bytes

    def kv_bytes_per_token(self) -> float:
        """KV cache of one token over all layers: 2 (K and V) * kv_dim * dtype * L."""
        return 2 * self.kv_dim * self.dtype_bytes * self.layers


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # OPT-125M (facebook/opt-125m config.json): the shape small enough to serve on a CPU,
        # for checking predictions against an engine (docs/engine-profile.md)
        ModelSpec("OPT-125M", 12, 768, 12, 12, 3072, 50272, False, True),
        ModelSpec("OPT-13B", 40, 5120, 40, 40, 20480, 50272, False, True),
        ModelSpec("OPT-66B", 64, 9216, 72, 72, 36864, 50272, False, True),
        ModelSpec("OPT-175B", 96, 12288, 96, 96, 49152, 50272, False, True),
        # LLaMA-2-7B and -13B (meta-llama/Llama-2-7b-hf and -13b-hf config.json on Hugging
        # Face): full multi-head attention, SwiGLU FFN of 11008 / 13824, untied LM head.
        # Published sizes 6,738,415,616 and 13,015,864,320 parameters: these counts plus
        # the RMSNorm weights (2h per layer and a final h), which R leaves out.
        ModelSpec("LLaMA-2-7B", 32, 4096, 32, 32, 11008, 32000, True, False),
        ModelSpec("LLaMA-2-13B", 40, 5120, 40, 40, 13824, 32000, True, False),
        ModelSpec("LLaMA-2-70B", 80, 8192, 64, 8, 28672, 32000, True, False),
        ModelSpec("LLaMA-3-8B", 32, 4096, 32, 8, 14336, 128256, True, False),
        ModelSpec("LLaMA-3-70B", 80, 8192, 64, 8, 28672, 128256, True, False),
    ]
}


def model_spec(name: str) -> ModelSpec:
    for key, spec in MODELS.items():
        if key.lower() == name.lower():
            return spec
    raise InputError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
