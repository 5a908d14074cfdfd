"""tools/engine_e2e.py: the exported vLLM and SGLang commands as this CPU runs them, the
evidence read from their metrics, and (marker ``engines``) one request through each engine's
router over a prefill and a decode instance on the CPU, decode taking the prompt's KV cache
from prefill over NIXL, with TP 1 and with TP 2 instances."""

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


def test_sglang_command_runs_in_its_environment_on_the_cpu() -> None:
    cmd = {
        "server": "localhost",
        "argv": ["python", "-m", "sglang.launch_server", "--port", "8100", "--tp-size", "2"],
        "env": {"CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_HOST_IP": "${ADDR}"},
    }
    argv, env = e2e.engine_argv(cmd, Path("/venv"), "10.0.0.9", "sglang")
    assert argv[:7] == ["/venv/bin/python", *cmd["argv"][1:]]
    assert argv[7:] == [*e2e.SGLANG_CPU_FLAGS, "--host", "127.0.0.1"]
    assert env["SGLANG_HOST_IP"] == "10.0.0.9" and "CUDA_VISIBLE_DEVICES" not in env
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # vLLM's additions stay vLLM's
    del cmd["env"]["SGLANG_HOST_IP"]
    assert e2e.engine_argv(cmd, Path("/venv"), None, "sglang")[1]["SGLANG_HOST_IP"] == "localhost"
    router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--port", "8"]
    doc = {"commands": [{"argv": cmd["argv"], "env": {}}, {"argv": router, "env": {}}]}
    assert e2e.router_argv(doc, Path("/venv")) == ["/venv/bin/python", *router[1:]]


def test_bootstrap_ports_move_with_the_base_port_in_engine_and_router() -> None:
    engine = ["python", "--port", "18200", "--disaggregation-bootstrap-port", "8998"]
    router = ["python", "--prefill", "http://h:18200", "8998", "--decode", "http://h:18201",
              "--port", "8000"]  # fmt: skip
    assert e2e.shift_bootstrap(engine, 10100)[-1] == "19098"
    moved = e2e.shift_bootstrap(router, 10100)
    assert moved[3] == "19098" and moved[1:3] + moved[4:] == router[1:3] + router[4:]
    assert e2e.shift_bootstrap(router, 0) == router


def test_mooncake_replaces_the_exports_transfer_backend_last() -> None:
    argv = ["python", "--disaggregation-transfer-backend", "nixl", "--device", "cpu"]
    assert e2e.with_backend(argv, {"A": "1"}, "nixl") == (argv, {"A": "1"})
    new, env = e2e.with_backend(argv, {"A": "1"}, "mooncake")
    assert new[: len(argv)] == argv and new[-2:] == [
        "--disaggregation-transfer-backend",
        "mooncake",
    ]
    assert env == {"A": "1", "MOONCAKE_PROTOCOL": "tcp"}


def test_sglang_ranks_get_a_core_each() -> None:
    assert e2e.cpu_binding(2, 2) == "0|1" and e2e.cpu_binding(4, 2) == "0|1|0|1"
    cmd = {"server": "localhost", "env": {},
           "argv": ["python", "-m", "sglang.launch_server", "--tp-size", "2"]}  # fmt: skip
    env = e2e.engine_argv(cmd, Path("/venv"), "127.0.0.1", "sglang")[1]
    assert len(env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 2


def test_topology_has_the_slots_of_both_instances() -> None:
    assert e2e.gpus_of("2x1") + e2e.gpus_of("1x3") == 5
    text = e2e.topology(4)
    assert "gpus: 4," in text and "localhost-gpu3" in text and "localhost-gpu4" not in text


def test_sglang_evidence_needs_prefill_to_compute_and_decode_not_to() -> None:
    rt = "sglang:realtime_tokens_total"
    pm = (
        f'{rt}{{model_name="m",mode="prefill_compute"}} 64.0\n'
        f'{rt}{{model_name="m",mode="decode"}} 1.0\n'
        'sglang:kv_transfer_total_mb_count{model_name="m"} 1.0\n'
    )
    dm = (
        f'{rt}{{model_name="m",mode="prefill_compute"}} 0.0\n'
        f'{rt}{{model_name="m",mode="decode"}} 8.0\n'
    )
    res = e2e.evidence("sglang", dm, pm)
    assert res["prefill_computed_prompt_tokens"] == 64
    assert res["decode_computed_prompt_tokens"] == 0 and res["decode_generated_tokens"] == 8
    assert res["prefill_kv_transfers"] == 1
    assert e2e.transferred("sglang", res)
    # decode recomputing the prompt (no transfer) is not evidence
    recomputed = e2e.evidence("sglang", dm.replace("} 0.0", "} 64.0"), pm)
    assert not e2e.transferred("sglang", recomputed)
    assert not e2e.transferred("sglang", e2e.evidence("sglang", dm, pm.replace("count", "x")))


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


@pytest.mark.engines
@pytest.mark.timeout(2700)
@pytest.mark.xfail(
    strict=True,
    reason="SGLang 0.5.23 on a CPU: NIXL refuses its KV buffers (declared VRAM) and the Mooncake "
    "send path pins memory and records CUDA events (disaggregation/prefill.py _send_kv_chunk); "
    "docs/engine-check.md",
)
@pytest.mark.parametrize("par", ["1x1", "2x1"])
def test_sglang_end_to_end_on_the_cpu(engines_dir: Path, tmp_path: Path, par: str) -> None:
    # Mooncake over TCP: SGLang's NIXL backend cannot register a CPU KV cache (engine-check.md)
    res = e2e.run(engines_dir, tmp_path, 2400, "sglang", par, par, sglang_backend="mooncake")
    assert len(res["token_ids"]) == e2e.MAX_TOKENS, res
    # prefill computed the whole prompt; decode computed none of it and took the KV instead
    assert res["prefill_computed_prompt_tokens"] == len(e2e.PROMPT), res
    assert res["decode_computed_prompt_tokens"] == 0, res
    assert res["prefill_kv_transfers"] >= 1 and res["transfer_failed"] == 0, res


@pytest.mark.engines
@pytest.mark.timeout(2700)
def test_vllm_tp2_end_to_end_on_the_cpu(engines_dir: Path, tmp_path: Path) -> None:
    res = e2e.run(engines_dir, tmp_path, 2400, "vllm", "2x1", "2x1")
    assert len(res["token_ids"]) == e2e.MAX_TOKENS, res
    assert res["decode_external_prefix_cache_hits"] == len(e2e.PROMPT), res
