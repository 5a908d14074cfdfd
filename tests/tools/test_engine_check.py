"""tools/engine_check.py: the model configs it writes carry the specs' numbers, the broken
commands it makes differ from the export in exactly the broken setting, the cross-check
catches an engine that took other TP/PP/batch than the export; and (marker ``engines``, run
where tools/engines.sh made the environments) the engines accept the testbed's exported
commands and refuse both broken ones, each in its own code."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from controller.models.specs import model_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import engine_check as ec  # noqa: E402


def _vllm_doc() -> dict:
    kv = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    serve = ["vllm", "serve", "/m", "--port", "8100", "--tensor-parallel-size", "4",
             "--pipeline-parallel-size", "1", "--max-num-seqs", "8",
             "--kv-transfer-config"]  # fmt: skip
    return {
        "instances": [{"name": "prefill/0", "tp": 4, "pp": 1, "batch": 8}],
        "commands": [
            {"server": "a", "instance": "prefill/0", "argv": [*serve, kv % "kv_producer"],
             "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
            {"server": "b", "instance": "decode/0", "argv": [*serve, kv % "kv_consumer"],
             "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
        ],
    }  # fmt: skip


def test_model_config_carries_the_spec() -> None:
    folder = Path(ec.write_model_config(model_spec("OPT-66B"), Path("/tmp/hs-ec-test/opt")))
    cfg = json.loads((folder / "config.json").read_text())
    # OPT-66B's published config: 64 layers of width 9216, 72 heads, FFN 36864, vocab 50272
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (
        64, 9216, 72)  # fmt: skip
    assert (cfg["ffn_dim"], cfg["vocab_size"], cfg["model_type"]) == (36864, 50272, "opt")
    folder = ec.write_model_config(model_spec("LLaMA-3-70B"), Path("/tmp/hs-ec-test/llama"))
    cfg = json.loads((folder / "config.json").read_text())
    # grouped-query attention: 64 query heads share 8 KV heads; 8192 positions
    assert (cfg["num_key_value_heads"], cfg["num_attention_heads"]) == (8, 64)
    assert (cfg["intermediate_size"], cfg["max_position_embeddings"]) == (28672, 8192)


def test_broken_vllm_is_the_decode_command_with_pp_2() -> None:
    doc = _vllm_doc()
    b = ec.broken_vllm(doc)
    decode = doc["commands"][1]["argv"]
    assert b is not None and len(b["argv"]) == len(decode)
    diff = [(x, y) for x, y in zip(decode, b["argv"], strict=True) if x != y]
    assert diff == [("1", "2")]
    assert b["argv"][b["argv"].index("--pipeline-parallel-size") + 1] == "2"
    doc["commands"].pop(1)
    assert ec.broken_vllm(doc) is None  # no decode instance: nothing to break


def test_broken_sglang_is_a_12_stage_prefill_on_a_4_gpu_node() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "4",
            "--pp-size", "2", "--disaggregation-mode", "prefill", "--dist-init-addr", "x:1",
            "--nnodes", "3", "--node-rank", "0", "--disable-custom-all-reduce"]  # fmt: skip
    doc = {"commands": [{"server": "a", "instance": "prefill/0", "argv": argv,
                         "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}}]}  # fmt: skip
    b = ec.broken_sglang(doc)
    assert b is not None
    got = {k: b["argv"][b["argv"].index(k) + 1] for k in
           ("--tp-size", "--pp-size", "--nnodes", "--node-rank")}  # fmt: skip
    assert got == {"--tp-size": "1", "--pp-size": "12", "--nnodes": "2", "--node-rank": "1"}
    assert all(b["argv"].count(k) == 1 for k in ("--nnodes", "--node-rank", "--dist-init-addr"))
    assert b["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_cross_check_names_what_the_engine_took_otherwise() -> None:
    doc = _vllm_doc()
    inst = {i["name"]: i for i in doc["instances"]}
    cmd = doc["commands"][0]
    same = {"ok": True, "facts": {"tp": 4, "pp": 1, "max_num_seqs": 8}}
    assert ec.cross_check("vllm", cmd, same, inst) == []
    other = {"ok": True, "facts": {"tp": 4, "pp": 2, "max_num_seqs": 256}}
    assert ec.cross_check("vllm", cmd, other, inst) == [
        "pp: export 1, engine 2",
        "batch: export 8, engine 256",
    ]


@pytest.mark.engines
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engines_accept_the_export_and_refuse_the_broken_ones(
    engine: str, engines_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--quick", "--engine", engine, "--engines", str(engines_dir), "--work", str(tmp_path)]
    rc = ec.main(args)
    out = capsys.readouterr().out
    m = re.search(rf"^{engine}: (\d+) commands, (\d+) accepted, (\d+) problems", out, re.M)
    assert m, out
    n, accepted, problems = map(int, m.groups())
    assert n > 0 and (accepted, problems) == (n, 0), out
    assert "broken export refused" in out and "NOT refused" not in out, out
    assert rc == 0
