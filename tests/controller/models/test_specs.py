"""Model specs against their published configurations: LLaMA-2-7B and -13B's parameter counts
worked by hand from the Hugging Face config.json figures, and against the published totals
(which also count the RMSNorm weights that R leaves out)."""

from __future__ import annotations

from controller.models.specs import model_spec


def test_llama2_7b_parameter_count_by_hand() -> None:
    """h = 4096, m = 11008, L = 32, vocab 32000, 32 KV heads (no GQA), untied head:
    per layer 4h^2 = 67,108,864 (Q, K, V, O) + 3hm = 135,266,304 (SwiGLU) = 202,375,168;
    x 32 = 6,476,005,376; embeddings and LM head 2 x 32000 x 4096 = 262,144,000."""
    m = model_spec("LLaMA-2-7B")
    assert m.params == 6_738_149_376
    assert m.param_bytes == 2 * 6_738_149_376
    # the published 6,738,415,616 adds the norms: 2h per layer and the final h
    assert m.params + 2 * 4096 * 32 + 4096 == 6_738_415_616
    # KV per token: 2 (K, V) x 4096 x 2 bytes x 32 layers = 512 KiB
    assert m.kv_bytes_per_token() == 524_288


def test_llama2_13b_parameter_count_by_hand() -> None:
    """h = 5120, m = 13824, L = 40, vocab 32000, 40 KV heads: per layer 4h^2 = 104,857,600
    + 3hm = 212,336,640 = 317,194,240; x 40 = 12,687,769,600; embeddings and LM head
    2 x 32000 x 5120 = 327,680,000."""
    m = model_spec("LLaMA-2-13B")
    assert m.params == 13_015_449_600
    assert m.params + 2 * 5120 * 40 + 5120 == 13_015_864_320
    assert m.head_dim == 128 and m.kv_dim == 5120
    # KV per token: 2 x 5120 x 2 bytes x 40 layers = 800 KiB
    assert m.kv_bytes_per_token() == 819_200
