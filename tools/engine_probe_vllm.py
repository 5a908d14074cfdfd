"""Runs inside a vLLM environment (tools/engines.sh makes one): feeds each ``vllm serve``
command of a ``heroserve export --format vllm`` through vLLM's own code, as far as it runs
without a GPU, and prints one JSON line per command.

Stages, in the order ``vllm serve`` runs them:

1. ``parse``: the ``vllm`` CLI's parser (``FlexibleArgumentParser`` with the ``serve``
   subcommand) and ``ServeSubcommand.validate``;
2. ``config``: ``AsyncEngineArgs.from_cli_args(...).create_engine_config()``, vLLM's checks of
   the parallel, scheduler, cache and KV-transfer configuration (needs the model's
   ``config.json`` at the model path, never its weights);
3. ``kv worker``: the KV connector's worker-side constructor, where vLLM refuses layouts its
   connector cannot move (NIXL: a consumer with pipeline_parallel_size > 1), run with the
   tensor-parallel rank a one-process probe has (0) in place of a started worker group, and
   the KV cache layout the engine core resolves for attention backends that declare none.

Usage: ``python engine_probe_vllm.py COMMANDS.json`` where the file holds a list of
``{"id", "argv", "env"}``. Not imported by the project: it runs under the engine's Python.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _where(exc: BaseException) -> str:
    """``file:line`` of the engine frame that raised, relative to site-packages."""
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    if frame is None:
        return "?"
    path = frame.filename.split("site-packages/")[-1]
    return f"{path}:{frame.lineno}"


def _kv_cache_config(cfg):  # noqa: ANN001, ANN202 - vLLM types, imported late
    """One full-attention group over the model's layers, as vLLM's KV cache manager makes for
    a decoder-only model without sliding windows (OPT, LLaMA)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    mc = cfg.model_config
    layers = [f"model.layers.{i}.attn" for i in range(mc.get_num_layers(cfg.parallel_config))]
    spec = FullAttentionSpec(
        block_size=cfg.cache_config.block_size,
        num_kv_heads=mc.get_num_kv_heads(cfg.parallel_config),
        head_size=mc.get_head_size(),
        dtype=mc.dtype,
    )
    return KVCacheConfig(
        num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layers, spec)]
    )


def _kv_worker(cfg) -> None:  # noqa: ANN001 - a VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        record_kv_cache_layout,
        resolve_kv_cache_layout,
    )

    kvt = cfg.kv_transfer_config
    if kvt is None or not kvt.is_kv_transfer_instance:
        return
    # the worker reads its TP rank from vLLM's process groups; a probe is rank 0 of 1
    import vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker as bw

    bw.get_tensor_model_parallel_rank = lambda: 0
    bw.get_tensor_model_parallel_world_size = lambda: 1
    kvc = _kv_cache_config(cfg)
    # the engine core resolves the KV cache layout from what the workers' attention backends
    # support before any connector starts; a probe has no backends, which is the case of
    # backends that declare nothing: vLLM's default preference
    names = [layout.name for layout in get_supported_kv_cache_layouts([])]
    specs = [g.kv_cache_spec for g in kvc.kv_cache_groups]
    layout = resolve_kv_cache_layout(cfg, [names], specs)
    record_kv_cache_layout(cfg.cache_config, layout.name)
    conn = KVConnectorFactory.create_connector(
        config=cfg, role=KVConnectorRole.WORKER, kv_cache_config=kvc
    )
    worker = getattr(conn, "connector_worker", None)
    if worker is not None and hasattr(worker, "shutdown"):
        worker.shutdown()


def probe(cmd: dict) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = {"id": cmd["id"], "ok": False}
    os.environ.update({k: v for k, v in cmd.get("env", {}).items() if k.startswith("VLLM_")})
    stage = "parse"
    try:
        parser = FlexibleArgumentParser(prog="vllm")
        sub = parser.add_subparsers(dest="subparser")
        serve = ServeSubcommand()
        serve.subparser_init(sub)
        args = parser.parse_args(cmd["argv"][1:])
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        serve.validate(args)
        stage = "config"
        cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config(
            UsageContext.OPENAI_API_SERVER
        )
        pc, kvt = cfg.parallel_config, cfg.kv_transfer_config
        out["facts"] = {
            "tp": pc.tensor_parallel_size,
            "pp": pc.pipeline_parallel_size,
            "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "backend": str(pc.distributed_executor_backend),
            "kv_role": kvt.kv_role if kvt else None,
            "kv_connector": kvt.kv_connector if kvt else None,
        }
        stage = "kv worker"
        _kv_worker(cfg)
        out["ok"] = True
    except SystemExit as e:  # argparse's way of refusing
        out.update(stage=stage, error=f"argument parser exited {e.code}")
    except Exception as e:  # noqa: BLE001 - every refusal is reported, not raised
        out.update(stage=stage, error=f"{type(e).__name__}: {e}", where=_where(e))
    return out


def main() -> None:
    import vllm

    cmds = json.load(open(sys.argv[1]))
    print(json.dumps({"engine": "vllm", "version": vllm.__version__}), flush=True)
    for cmd in cmds:
        print(json.dumps(probe(cmd)), flush=True)


if __name__ == "__main__":
    main()
