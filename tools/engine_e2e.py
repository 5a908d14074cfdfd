"""One real request end to end on this machine's CPU: a ``heroserve export --format vllm`` of a
plan for a one-server "cluster" (``localhost`` with two GPU slots) started with vLLM's CPU build,
a tiny OPT-shaped model with dummy weights, the NIXL KV connector, and ``vllm-router`` in
front (docs/engine-check.md).

    python tools/engine_e2e.py [--engines DIR] [--work DIR] [--timeout S]

Steps: plan (OPT-13B, 1x1 prefill and 1x1 decode, on the topology written here), export, then
run the export's ``vllm serve`` commands with the model path swapped for a folder holding
only a tiny OPT ``config.json`` and the CPU additions below, wait on each ``/health``, start
the router on the pool the export names, send one completion with token ids as its prompt
(``--skip-tokenizer-init``: no tokenizer is fetched), and read the decode instance's
``/metrics``: ``vllm:external_prefix_cache_hits_total`` counts the prompt tokens whose KV
cache came through the connector instead of being computed.

CPU additions to each exported command (what a GPU server does not need):
``--load-format dummy --skip-tokenizer-init --max-model-len 256 --enforce-eager --host
127.0.0.1`` (eager: compiling the model's graph takes minutes on two cores), and the
environment ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache; the default sizes it from the
machine), ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (two engines share the cores) and
``VLLM_NIXL_SIDE_CHANNEL_HOST`` = the server name when the export does not set it; ``${ADDR}``
in a value becomes the server's address, as the export's start script resolves it.
Prints the token ids returned and the evidence of the KV transfer; exit status 0 when the
request returned tokens and the decode instance loaded the prompt's KV cache.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from engine_check import DEFAULT_ENGINES, heroserve, is_engine, opt_config  # noqa: E402

from controller.export.engines import ADDR  # noqa: E402

TOPOLOGY = """name: cpu-localhost
servers:
  - {id: localhost, gpu_type: H100, gpus: 2, role: any}
switches:
  - {id: s1, tier: access}
links:
  - {a: localhost-gpu0, b: s1, gbps: 100}
  - {a: localhost-gpu1, b: s1, gbps: 100}
"""
# OPT's architecture at toy size, so that dummy weights start in seconds: 2 layers of width 128
# in 2 heads of 64, a head size vLLM's CPU attention kernels support (16 is refused)
TINY_OPT = opt_config(hidden=128, layers=2, heads=2, ffn=512, vocab=1024, context=512)
TINY_OPT["torch_dtype"] = "bfloat16"
CPU_FLAGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "256",
             "--enforce-eager"]  # fmt: skip
# PYTHONFAULTHANDLER: a kernel that dies on this CPU (SIGILL, SIGSEGV) leaves its stack in the log
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "PYTHONFAULTHANDLER": "1",
}
PROMPT = list(range(10, 74))  # 64 token ids: four 16-token KV blocks
MAX_TOKENS = 8  # ignore_eos: dummy weights may pick the end token at any step
ROUTER_PORT = 8090


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_healthy(url: str, procs: list[subprocess.Popen], deadline: float) -> None:
    """Polls ``url`` until it answers 200; stops when a process has died or time is up."""
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].args[0]} exited {dead[0].returncode} before {url}")
        try:
            get(url)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    raise RuntimeError(f"{url} not healthy in time")


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus counter's samples (all label sets)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def prepare(work: Path) -> tuple[dict, Path]:
    """Plan and export for the one-server cluster; the tiny model's folder."""
    work.mkdir(parents=True, exist_ok=True)
    topo = work / "topology.yaml"
    topo.write_text(TOPOLOGY)
    model = work / "tiny-opt"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_OPT, indent=1) + "\n")
    plan = work / "plan.json"
    r = heroserve("plan", "--planner", "heroserve", "--topology", str(topo), "--model",
                  "OPT-13B", "--prefill-par", "1x1", "--decode-par", "1x1", "--quiet",
                  "--json", str(plan))  # fmt: skip
    if r.returncode:
        raise SystemExit(f"engine_e2e: plan failed: {r.stderr.strip()}")
    r = heroserve("export", "--plan", str(plan), "--topology", str(topo), "--format", "vllm",
                  "--out", str(work), "--model-path", str(model))  # fmt: skip
    if r.returncode:
        raise SystemExit(f"engine_e2e: export failed: {r.stderr.strip()}")
    return json.loads((work / "vllm.json").read_text()), model


def engine_argv(
    cmd: dict, venv: Path, address: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """The exported command as this machine runs it (the CPU additions above), with
    ``${ADDR}`` (the export's "the server's address", docs/export.md) replaced by ``address``
    as its start script does: the address the export was given, else the server's name
    resolved here."""
    if address is None:
        address = socket.gethostbyname(cmd["server"])
    argv = [str(venv / "bin" / "vllm"), *cmd["argv"][1:], *CPU_FLAGS, "--host", "127.0.0.1"]
    argv = [a.replace(ADDR, address) for a in argv]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {k: v.replace(ADDR, address) for k, v in cmd["env"].items() if k != "CUDA_VISIBLE_DEVICES"}
    )
    env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", cmd["server"])
    env.update(CPU_ENV)
    return argv, env


def router_argv(doc: dict, venv: Path) -> list[str]:
    """``vllm-router`` over the export's first pool (the export's own router command when it
    writes one)."""
    for c in doc["commands"]:
        if Path(c["argv"][0]).name == "vllm-router":
            return [str(venv / "bin" / "vllm-router"), *c["argv"][1:]]
    urls = {i["name"]: i["url"] for i in doc["instances"]}
    pool = doc["pools"][0]
    argv = [str(venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for name in pool["prefill"]:
        argv += ["--prefill", urls[name]]
    for name in pool["decode"]:
        argv += ["--decode", urls[name]]
    return argv + ["--host", "127.0.0.1", "--port", str(ROUTER_PORT)]


def run(engines: Path, work: Path, timeout: float) -> dict:
    venv = engines / "vllm"
    doc, model = prepare(work)
    engines_cmds = [c for c in doc["commands"] if is_engine("vllm", c["argv"])]
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout
    result: dict = {"commands": []}
    try:
        for c in engines_cmds:
            argv, env = engine_argv(c, venv, doc.get("addresses", {}).get(c["server"]))
            log = open(work / f"{c['instance'].replace('/', '-')}.log", "w")
            result["commands"].append(" ".join(argv))
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
        urls = {i["name"]: i["url"] for i in doc["instances"]}
        for c in engines_cmds:
            wait_healthy(urls[c["instance"]] + "/health", procs, deadline)
        rargv = router_argv(doc, venv)
        result["commands"].append(" ".join(rargv))
        log = open(work / "router.log", "w")
        procs.append(subprocess.Popen(rargv, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
        port = rargv[rargv.index("--port") + 1]
        router = f"http://127.0.0.1:{port}"
        wait_healthy(router + "/health", procs, deadline)
        body = {"model": str(model), "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        req = urllib.request.Request(router + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=max(deadline - time.monotonic(), 30)) as r:
            answer = json.loads(r.read())
        result["token_ids"] = answer["choices"][0].get("token_ids")
        decode = next(i for i in doc["instances"] if i["role"] == "decode")
        prefill = next(i for i in doc["instances"] if i["role"] == "prefill")
        dm, pm = get(decode["url"] + "/metrics"), get(prefill["url"] + "/metrics")
        result["decode_external_prefix_cache_hits"] = metric(
            dm, "vllm:external_prefix_cache_hits_total"
        )
        result["decode_prompt_tokens"] = metric(dm, "vllm:prompt_tokens_total")
        result["prefill_prompt_tokens"] = metric(pm, "vllm:prompt_tokens_total")
        result["kv_log_lines"] = [
            line.strip()
            for c in engines_cmds
            for line in open(work / f"{c['instance'].replace('/', '-')}.log", errors="replace")
            if "nixl" in line.lower() and ("handshake" in line.lower() or "xfer" in line.lower())
        ][:6]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--work", type=Path, default=Path("engine-e2e"))
    p.add_argument("--timeout", type=float, default=1500, help="seconds for the whole run")
    a = p.parse_args(argv)
    if not (a.engines / "vllm" / "bin" / "vllm-router").exists():
        print(f"engine_e2e: no vllm environment in {a.engines} (tools/engines.sh)",
              file=sys.stderr)  # fmt: skip
        return 2
    res = run(a.engines, a.work.resolve(), a.timeout)
    print(json.dumps(res, indent=1))
    ok = bool(res.get("token_ids")) and res.get("decode_external_prefix_cache_hits", 0) > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
