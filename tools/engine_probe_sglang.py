"""Runs inside an SGLang environment (tools/engines.sh makes one): feeds each command of a
``heroserve export --format sglang`` through SGLang's own code, as far as it runs without a
GPU, and prints one JSON line per command.

Server commands (``python -m sglang.launch_server``), in the order SGLang runs them:

1. ``parse``: ``prepare_server_args`` (the launcher's parser);
2. ``config``: ``ServerArgs.resolve_once`` through ``create_context``, SGLang's resolution
   and checks of the arguments (needs the model's ``config.json``, never its weights);
(``--device cuda`` is added where the command has no ``--device``: the export's servers have
CUDA GPUs, and SGLang's device detection stops on a machine without one.)
3. ``placement``: the launcher's own rank layout (``_calculate_rank_ranges``, PP ranks split
   evenly over ``--nnodes``) and ``compute_local_gpu_id``, against the GPUs the command's
   ``CUDA_VISIBLE_DEVICES`` gives the node: a rank whose local GPU id is not visible fails
   when its scheduler process sets its device, and visible GPUs no rank takes stay idle.

Router commands (``python -m sglang_router.launch_router``): the router's own parser.

Usage: ``python engine_probe_sglang.py COMMANDS.json`` (a list of ``{"id", "argv", "env"}``).
Not imported by the project: it runs under the engine's Python.
"""

from __future__ import annotations

import json
import sys
import traceback


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename.split('site-packages/')[-1]}:{tb[-1].lineno}" if tb else "?"


def _placement(cmd: dict) -> tuple[dict, str | None]:
    from sglang.srt import runtime_context as rc
    from sglang.srt.entrypoints.engine import _calculate_rank_ranges
    from sglang.srt.weight_cache.protocol import compute_local_gpu_id

    par, dev = rc.get_parallel(), rc.get_device()
    pp_ranks, tp_ranks, pp_per_node, tp_per_node = _calculate_rank_ranges(par.node_rank)
    ids = sorted(
        compute_local_gpu_id(
            p, t, pp_per_node, tp_per_node,
            base_gpu_id=dev.base_gpu_id, gpu_id_step=dev.gpu_id_step,
        )
        for p in pp_ranks
        for t in tp_ranks
    )  # fmt: skip
    visible = [g for g in cmd.get("env", {}).get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    facts = {
        "tp": par.tp_size,
        "pp": par.pp_size,
        "nnodes": par.nnodes,
        "node_rank": par.node_rank,
        "pp_ranks": [pp_ranks.start, pp_ranks.stop],
        "local_gpu_ids": ids,
        "visible_gpus": len(visible),
    }
    if visible and max(ids) >= len(visible):
        return facts, (
            f"node {par.node_rank} runs PP ranks {pp_ranks.start}-{pp_ranks.stop - 1} on local "
            f"GPUs {ids[0]}-{ids[-1]} but CUDA_VISIBLE_DEVICES gives it {len(visible)}"
        )
    if visible and len(ids) < len(visible):
        return facts, (
            f"node {par.node_rank} uses {len(ids)} of the {len(visible)} GPUs "
            "CUDA_VISIBLE_DEVICES gives it: SGLang splits PP ranks evenly over --nnodes"
        )
    return facts, None


def _server(cmd: dict, out: dict) -> None:
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import prepare_server_args

    stage = "parse"
    try:
        argv = cmd["argv"][3:]
        # the export's servers have CUDA GPUs; SGLang detects the device when --device is
        # absent, which on a machine without one stops before any check of the arguments
        args = prepare_server_args(argv if "--device" in argv else [*argv, "--device", "cuda"])
        stage = "config"
        ctx = rc.create_context(args, role="test")
        stage = "placement"
        with rc.use_context(ctx):
            facts, problem = _placement(cmd)
        facts.update(
            mode=args.disaggregation_mode,
            transfer_backend=args.disaggregation_transfer_backend,
            max_running_requests=args.max_running_requests,
        )
        out["facts"] = facts
        if problem:
            out.update(stage=stage, error=problem, where="sglang/srt/entrypoints/engine.py")
        else:
            out["ok"] = True
    except SystemExit as e:
        out.update(stage=stage, error=f"argument parser exited {e.code}")
    except Exception as e:  # noqa: BLE001 - every refusal is reported, not raised
        out.update(stage=stage, error=f"{type(e).__name__}: {e}", where=_where(e))


def _router(cmd: dict, out: dict) -> None:
    from sglang_router.launch_router import parse_router_args

    try:
        ra = parse_router_args(cmd["argv"][3:])
        out["facts"] = {
            "pd": ra.pd_disaggregation,
            "prefill": [list(p) for p in ra.prefill_urls],
            "decode": list(ra.decode_urls),
        }
        out["ok"] = True
    except SystemExit as e:
        out.update(stage="parse", error=f"argument parser exited {e.code}")
    except Exception as e:  # noqa: BLE001
        out.update(stage="parse", error=f"{type(e).__name__}: {e}", where=_where(e))


def main() -> None:
    import importlib.metadata as md

    cmds = json.load(open(sys.argv[1]))
    versions = {"version": md.version("sglang"), "router": md.version("sglang-router")}
    print(json.dumps({"engine": "sglang", **versions}), flush=True)
    for cmd in cmds:
        out = {"id": cmd["id"], "ok": False}
        if cmd["argv"][:3] == ["python", "-m", "sglang.launch_server"]:
            _server(cmd, out)
        else:
            _router(cmd, out)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
