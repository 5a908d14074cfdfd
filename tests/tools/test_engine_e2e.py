"""tools/engine_e2e.py: the exported vLLM commands as this CPU runs them, and (marker
``engines``) one completion through vllm-router over a prefill and a decode instance of vLLM's
CPU build, the decode instance taking the prompt's KV cache from the NIXL connector."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import engine_e2e as e2e  # noqa: E402


def test_exported_command_gets_the_cpu_additions_and_keeps_the_plan() -> None:
    cmd = {
        "server": "localhost",
        "argv": ["vllm", "serve", "/m", "--port", "8101", "--tensor-parallel-size", "1"],
        "env": {"CUDA_VISIBLE_DEVICES": "1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601"},
    }
    argv, env = e2e.engine_argv(cmd, Path("/venv"))
    assert argv[0] == "/venv/bin/vllm"
    assert argv[1:7] == cmd["argv"][1:]  # the export's own arguments, unchanged and first
    assert argv[7:] == [*e2e.CPU_FLAGS, "--host", "127.0.0.1"]
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "localhost"  # the server the export names
    cmd["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "10.0.0.7"
    assert e2e.engine_argv(cmd, Path("/venv"))[1]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    # the export's "${ADDR}": the address it was given, else the server's name resolved here
    cmd["env"]["VLLM_HOST_IP"] = cmd["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "${ADDR}"
    env = e2e.engine_argv(cmd, Path("/venv"), "10.0.0.9")[1]
    assert env["VLLM_HOST_IP"] == env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.9"
    assert e2e.engine_argv(cmd, Path("/venv"))[1]["VLLM_HOST_IP"] == "127.0.0.1"


def test_router_covers_the_pool_the_export_names() -> None:
    doc = {
        "instances": [
            {"name": "prefill/0", "url": "http://localhost:8100"},
            {"name": "decode/0", "url": "http://localhost:8101"},
        ],
        "pools": [{"prefill": ["prefill/0"], "decode": ["decode/0"]}],
        "commands": [],
    }
    argv = e2e.router_argv(doc, Path("/venv"))
    assert argv[:2] == ["/venv/bin/vllm-router", "--vllm-pd-disaggregation"]
    assert argv[2:6] == ["--prefill", "http://localhost:8100", "--decode", "http://localhost:8101"]
    doc["commands"] = [{"argv": ["vllm-router", "--port", "9"], "env": {}}]
    assert e2e.router_argv(doc, Path("/venv")) == ["/venv/bin/vllm-router", "--port", "9"]


def test_metric_sums_a_counter_over_its_label_sets() -> None:
    text = (
        "# HELP vllm:prompt_tokens_total x\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 64.0\n'
        'vllm:prompt_tokens_total{engine="1",model_name="m"} 3.0\n'
        'vllm:prompt_tokens_created{engine="0"} 1.7e9\n'
    )
    assert e2e.metric(text, "vllm:prompt_tokens_total") == 67.0


@pytest.mark.engines
@pytest.mark.timeout(2700)  # the run's own limit is 2400 s: two engines start on two cores
def test_one_request_end_to_end_on_the_cpu(engines_dir: Path, tmp_path: Path) -> None:
    res = e2e.run(engines_dir, tmp_path, timeout=2400)
    assert len(res["token_ids"]) == e2e.MAX_TOKENS, res
    # the router sent the whole prompt to both instances; the decode instance loaded the KV
    # cache of every prompt token through the connector (NIXL's decode side asks for all of
    # them unless the model needs some recomputed: Mamba layers or multi-token prediction,
    # neither of which OPT has) instead of computing it
    assert res["prefill_prompt_tokens"] == len(e2e.PROMPT), res
    assert res["decode_prompt_tokens"] == len(e2e.PROMPT), res
    assert res["decode_external_prefix_cache_hits"] == len(e2e.PROMPT), res
