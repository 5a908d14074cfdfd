"""Hugging Face ``config.json`` bodies for the models of ``specs.py``: all a serving engine
reads of a checkpoint before it loads weights, so an engine started with dummy weights
(``--load-format dummy``) runs the spec's exact shape. Used by ``heroserve profile`` and the
engine checks (tools/engine_check.py, tools/engine_e2e.py).

Holds ``CONTEXT`` (the families' context lengths), ``opt_config`` and ``write_model_config``.
"""

from __future__ import annotations

import json
from pathlib import Path

from controller.models.specs import ModelSpec

# max_position_embeddings of the models' published configs (the same sources as specs.py)
CONTEXT = {"OPT": 2048, "LLaMA-2": 4096, "LLaMA-3": 8192}


def opt_config(hidden: int, layers: int, heads: int, ffn: int, vocab: int, context: int) -> dict:
    """A Hugging Face ``config.json`` body of OPT's architecture at the given sizes."""
    return {
        "architectures": ["OPTForCausalLM"],
        "model_type": "opt",
        "hidden_size": hidden,
        "word_embed_proj_dim": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "ffn_dim": ffn,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "do_layer_norm_before": True,
        "activation_function": "relu",
        "enable_bias": True,
        "bos_token_id": 2,
        "eos_token_id": 2,
        "pad_token_id": 1,
    }


def write_model_config(spec: ModelSpec, folder: Path) -> Path:
    """A Hugging Face ``config.json`` with the spec's architecture: all the engines read of a
    checkpoint before they load weights."""
    folder.mkdir(parents=True, exist_ok=True)
    if spec.name.startswith("OPT"):
        cfg = opt_config(spec.hidden, spec.layers, spec.heads, spec.ffn, spec.vocab, CONTEXT["OPT"])
    else:
        family = "LLaMA-3" if spec.name.startswith("LLaMA-3") else "LLaMA-2"
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": spec.hidden,
            "intermediate_size": spec.ffn,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "vocab_size": spec.vocab,
            "max_position_embeddings": CONTEXT[family],
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": spec.tied_embeddings,
        }
    cfg["torch_dtype"] = "float16" if spec.dtype_bytes == 2 else "float32"
    (folder / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return folder
