"""tools/engine_single.py: an exported instance run alone keeps its own flags (TP, PP, request
limit, CPU additions) and loses only those that pair it with another instance."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import engine_single as single  # noqa: E402


def test_sglang_instance_alone_keeps_its_ranks_and_drops_the_pairing() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--port", "8100", "--disaggregation-mode",
            "prefill", "--disaggregation-transfer-backend", "nixl", "--tp-size", "2",
            "--disaggregation-bootstrap-port", "8998", "--device", "cpu",
            "--disaggregation-decode-retraction-backup", "cpu_tensor"]  # fmt: skip
    assert single.alone(argv) == ["python", "-m", "sglang.launch_server", "--port", "8100",
                                  "--tp-size", "2", "--device", "cpu"]  # fmt: skip


def test_vllm_instance_alone_drops_its_kv_connector() -> None:
    kv = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
    argv = ["vllm", "serve", "/m", "--tensor-parallel-size", "2", "--kv-transfer-config", kv,
            "--enforce-eager"]  # fmt: skip
    assert single.alone(argv) == ["vllm", "serve", "/m", "--tensor-parallel-size", "2",
                                  "--enforce-eager"]  # fmt: skip
