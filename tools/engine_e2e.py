"""One real request end to end on this machine's CPU: a ``heroserve export --format vllm`` or
``--format sglang`` of a plan for a one-server "cluster" (``localhost`` with as many GPU slots as
the pair needs) started with the engine's CPU backend, a tiny OPT-shaped model with dummy
weights, the engine's KV transfer (NIXL) and its router in front (docs/engine-check.md).

    python tools/engine_e2e.py [--engine vllm|sglang] [--prefill-par 1x1] [--decode-par 1x1]
                               [--engines DIR] [--work DIR] [--base-port P] [--router-port P]
                               [--timeout S]

Steps: plan (OPT-13B, ``--engine``, the forced prefill and decode parallelisms, on the topology
written here), export, then run the export's engine commands with the model path swapped for a
folder holding only a tiny OPT ``config.json`` and the CPU additions below, wait on each
``/health``, start the export's router, send one request with token ids as its prompt (no
tokenizer is fetched), and read both instances' ``/metrics`` for the evidence that decode
received the prompt's KV cache instead of computing it:

* vLLM: ``vllm:external_prefix_cache_hits_total`` on decode counts the prompt tokens whose KV
  came through the connector;
* SGLang: ``sglang:realtime_tokens_total{mode="prefill_compute"}`` counts the prompt tokens an
  instance computed (the prompt on prefill, none on decode), and prefill's
  ``sglang:kv_transfer_total_mb`` the transfers it sent.

CPU additions to each exported command (what a GPU server does not need), ``CPU[engine]``:
vLLM ``--load-format dummy --skip-tokenizer-init --max-model-len 256 --enforce-eager``
(eager: compiling the model's graph takes minutes on two cores) and ``VLLM_CPU_KVCACHE_SPACE=1``
(GiB of KV cache; the default sizes it from the machine), ``VLLM_CPU_OMP_THREADS_BIND=nobind``
(two engines share the cores); SGLang ``--device cpu --load-format dummy
--skip-tokenizer-init --context-length 256 --max-total-tokens 8192 --disable-cuda-graph
--enable-metrics --disaggregation-decode-retraction-backup cpu_tensor``; both
``--host 127.0.0.1``, and the side-channel address variable (``VLLM_NIXL_SIDE_CHANNEL_HOST``,
``SGLANG_HOST_IP``) = the server name where the export does not set it; ``${ADDR}`` in a value
becomes the server's address, as the export's start script resolves it. The export's argv[0]
(``vllm``, ``vllm-router``, ``python``) becomes the environment's own. Prints the commands,
the token ids returned and the evidence; exit status 0 when the request returned tokens and the
evidence shows the KV transferred.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from engine_ports import check_ports, free_port, needed_ports  # noqa: E402

from controller.export.engines import ADDR  # noqa: E402
from controller.models.engines import PROFILES  # noqa: E402

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
# SGLang's CPU backend (--device cpu); no CUDA graphs there; a KV pool of 8192 tokens (on the
# CPU SGLang sizes it as --mem-fraction-static of the machine's memory: 17 GB here, per
# instance); metrics for the evidence;
# instance); decode's retraction backup in plain CPU tensors: its default there, host_pool
# (sglang/srt/mem_cache/kv_cache_builder.py), pins a host pool with cudaHostRegister
# (mem_cache/pool_host/common.py, _cuda_host_register), which needs an NVIDIA driver
SGLANG_CPU_FLAGS = ["--device", "cpu", "--load-format", "dummy", "--skip-tokenizer-init",
    "--context-length", "256", "--max-total-tokens", "8192", "--disable-cuda-graph",
    "--enable-metrics", "--disaggregation-decode-retraction-backup", "cpu_tensor"]  # fmt: skip
# SGLANG_NCCL_SO_PATH naming no file: SGLang builds an NCCL communicator for every TP group off
# NPU/XPU (sglang/srt/distributed/parallel_state.py:2185), which stops a CPU TP group in
# torch.cuda.device (device_communicators/pynccl.py:116) unless loading NCCL fails (pynccl.py:73)
SGLANG_CPU_ENV = {"PYTHONFAULTHANDLER": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2"}
CPU = {"vllm": (CPU_FLAGS, CPU_ENV), "sglang": (SGLANG_CPU_FLAGS, SGLANG_CPU_ENV)}
# --sglang-backend mooncake: SGLang's NIXL backend cannot register a CPU KV cache (it declares
# its KV buffers VRAM, sglang/srt/disaggregation/decode.py "kv_data_mem_kinds", and NIXL's UCX
# backend then fails with NIXL_ERR_BACKEND, nixl/conn.py register_buffer_to_engine); Mooncake's
# transfer engine over TCP moves host memory (MOONCAKE_PROTOCOL, default rdma)
SGLANG_MOONCAKE = (["--disaggregation-transfer-backend", "mooncake"], {"MOONCAKE_PROTOCOL": "tcp"})
PROMPT = list(range(10, 74))  # 64 token ids: four 16-token KV blocks
MAX_TOKENS = 8  # ignore_eos: dummy weights may pick the end token at any step
ROUTER_PORT = 8090
DEFAULT_BASE_PORT = 8100  # heroserve export's --base-port default


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


def topology(gpus: int) -> str:
    """One server, ``localhost``, with ``gpus`` GPU slots on one access switch."""
    links = "".join(f"  - {{a: localhost-gpu{i}, b: s1, gbps: 100}}\n" for i in range(gpus))
    return (
        "name: cpu-localhost\nservers:\n"
        f"  - {{id: localhost, gpu_type: H100, gpus: {gpus}, role: any}}\n"
        "switches:\n  - {id: s1, tier: access}\nlinks:\n" + links
    )


def gpus_of(par: str) -> int:
    """GPUs of a ``TPxPP`` parallelism."""
    tp, pp = par.split("x")
    return int(tp) * int(pp)


def prepare(
    work: Path, engine: str = "vllm", prefill: str = "1x1", decode: str = "1x1",
    base_port: int = 8100,
) -> tuple[dict, Path]:  # fmt: skip
    """Plan (for ``engine``, with the given parallelisms) and export for the one-server
    cluster; the tiny model's folder."""
    work.mkdir(parents=True, exist_ok=True)
    topo = work / "topology.yaml"
    topo.write_text(topology(gpus_of(prefill) + gpus_of(decode)))
    model = work / "tiny-opt"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_OPT, indent=1) + "\n")
    plan = work / "plan.json"
    r = heroserve("plan", "--planner", "heroserve", "--topology", str(topo), "--model",
                  "OPT-13B", "--prefill-par", prefill, "--decode-par", decode, "--engine",
                  engine, "--quiet", "--json", str(plan))  # fmt: skip
    if r.returncode:
        raise SystemExit(f"engine_e2e: plan failed: {r.stderr.strip()}")
    r = heroserve("export", "--plan", str(plan), "--topology", str(topo), "--format", engine,
                  "--out", str(work), "--model-path", str(model), "--base-port",
                  str(base_port))  # fmt: skip
    if r.returncode:
        raise SystemExit(f"engine_e2e: export failed: {r.stderr.strip()}")
    return json.loads((work / f"{engine}.json").read_text()), model


def engine_argv(
    cmd: dict, venv: Path, address: str | None = None, engine: str = "vllm"
) -> tuple[list[str], dict[str, str]]:
    """The exported command as this machine runs it (the CPU additions above), with
    ``${ADDR}`` (the export's "the server's address", docs/export.md) replaced by ``address``
    as its start script does: the address the export was given, else the server's name
    resolved here."""
    if address is None:
        address = socket.gethostbyname(cmd["server"])
    flags, cpu_env = CPU[engine]
    argv = [str(venv / "bin" / cmd["argv"][0]), *cmd["argv"][1:], *flags, "--host", "127.0.0.1"]
    argv = [a.replace(ADDR, address) for a in argv]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {k: v.replace(ADDR, address) for k, v in cmd["env"].items() if k != "CUDA_VISIBLE_DEVICES"}
    )
    env.setdefault(PROFILES[engine].side_channel_host_env, cmd["server"])
    env.update(cpu_env)
    if engine == "sglang" and "--tp-size" in argv:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_binding(int(argv[argv.index("--tp-size") + 1]))
    return argv, env


def cpu_binding(ranks: int, cpus: int | None = None) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND: one core list per rank, ``|`` between ranks, round robin over
    the cores. Without it SGLang refuses more ranks than NUMA nodes (AssertionError in
    sglang/srt/utils/numa_utils.py, init_threads_binding)."""
    cpus = cpus or os.cpu_count() or 1
    return "|".join(str(r % cpus) for r in range(ranks))


BOOTSTRAP_FLAG = "--disaggregation-bootstrap-port"


def shift_bootstrap(argv: list[str], shift: int) -> list[str]:
    """SGLang's bootstrap ports moved by ``shift``: the export numbers them from 8998 whatever
    its ``--base-port``, so two runs side by side would share them. In an engine command the
    value after ``--disaggregation-bootstrap-port``, in a router's the one after ``--prefill
    URL``."""
    out = list(argv)
    for i, a in enumerate(argv):
        j = i + 1 if a == BOOTSTRAP_FLAG else i + 2 if a == "--prefill" else None
        if j is not None and j < len(argv) and argv[j].isdigit():
            out[j] = str(int(argv[j]) + shift)
    return out


def with_backend(
    argv: list[str], env: dict[str, str], backend: str
) -> tuple[list[str], dict[str, str]]:
    """An SGLang command with ``backend`` as its KV transfer: the export's (nixl) unchanged,
    or Mooncake over TCP (SGLang's parser takes the last ``--disaggregation-transfer-backend``)."""
    if backend == "nixl":
        return argv, env
    flags, extra = SGLANG_MOONCAKE
    return [*argv, *flags], {**env, **extra}


def is_router(argv: list[str]) -> bool:
    return Path(argv[0]).name == "vllm-router" or "sglang_router.launch_router" in argv


def router_argv(doc: dict, venv: Path) -> list[str]:
    """The export's router command with the environment's executable; for an export without
    one, ``vllm-router`` over the export's first pool."""
    for c in doc["commands"]:
        if is_router(c["argv"]):
            return [str(venv / "bin" / c["argv"][0]), *c["argv"][1:]]
    urls = {i["name"]: i["url"] for i in doc["instances"]}
    pool = doc["pools"][0]
    argv = [str(venv / "bin" / "vllm-router"), "--vllm-pd-disaggregation"]
    for name in pool["prefill"]:
        argv += ["--prefill", urls[name]]
    for name in pool["decode"]:
        argv += ["--decode", urls[name]]
    return argv + ["--host", "127.0.0.1", "--port", str(ROUTER_PORT)]


class PortHeld(RuntimeError):
    """A port the run needs is held by another process (the message names both)."""


def with_router_ports(argv: list[str], router_port: int | None) -> list[str]:
    """The router's command with ``router_port`` (beside another run on this machine) in
    place of the export's, and its Prometheus exporter on a free port the tool chooses where
    the export names none: both routers default to 29000, which any router still running from
    an earlier run holds."""
    out = list(argv)
    if router_port is not None:
        out[out.index("--port") + 1] = str(router_port)
    if "--prometheus-port" not in out:
        out += ["--prometheus-port", str(free_port())]
    return out


def metric_mode(text: str, name: str, mode: str) -> float:
    """Sum of a counter's samples whose ``mode`` label is ``mode``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'mode="{mode}"' in line
    )


def request(engine: str, router: str, model: Path, timeout: float) -> list[int] | None:
    """One request of ``PROMPT`` through the router; the token ids it returned. vLLM: an
    OpenAI completion; SGLang: its native ``/generate`` with ``input_ids`` (its completion
    endpoint detokenizes, and there is no tokenizer here)."""
    if engine == "vllm":
        path = "/v1/completions"
        body = {"model": str(model), "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    else:
        path = "/generate"
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True}}  # fmt: skip
    req = urllib.request.Request(router + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as r:
        answer = json.loads(r.read())
    if engine == "vllm":
        return answer["choices"][0].get("token_ids")
    return answer.get("output_ids")


def request_when_ready(engine: str, router: str, model: Path, deadline: float) -> list[int] | None:
    """``request``, again while the router answers 503: sglang-router answers /health before
    it has registered its workers ("No prefill workers available")."""
    while True:
        try:
            return request(engine, router, model, max(deadline - time.monotonic(), 30))
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(2)


def evidence(engine: str, dm: str, pm: str) -> dict:
    """What the decode (``dm``) and prefill (``pm``) metrics say about the KV transfer."""
    if engine == "vllm":
        return {
            "decode_external_prefix_cache_hits": metric(
                dm, "vllm:external_prefix_cache_hits_total"
            ),
            "decode_prompt_tokens": metric(dm, "vllm:prompt_tokens_total"),
            "prefill_prompt_tokens": metric(pm, "vllm:prompt_tokens_total"),
        }
    rt = "sglang:realtime_tokens_total"
    return {
        "prefill_computed_prompt_tokens": metric_mode(pm, rt, "prefill_compute"),
        "decode_computed_prompt_tokens": metric_mode(dm, rt, "prefill_compute"),
        "decode_generated_tokens": metric_mode(dm, rt, "decode"),
        "prefill_kv_transfers": metric(pm, "sglang:kv_transfer_total_mb_count"),
        "prefill_kv_transfer_mb": metric(pm, "sglang:kv_transfer_total_mb_sum"),
        "decode_prompt_tokens": metric(dm, "sglang:prompt_tokens_total"),
        "transfer_failed": metric(pm, "sglang:num_transfer_failed_reqs_total")
        + metric(dm, "sglang:num_transfer_failed_reqs_total"),
    }


def transferred(engine: str, res: dict) -> bool:
    """The evidence says decode took the prompt's KV from prefill."""
    if engine == "vllm":
        return res.get("decode_external_prefix_cache_hits", 0) > 0
    return (
        res.get("prefill_computed_prompt_tokens", 0) >= len(PROMPT)
        and res.get("decode_computed_prompt_tokens", 1) == 0
        and res.get("prefill_kv_transfers", 0) > 0
    )


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``argv`` in its own session (to stop it with its children), its output in ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def run(
    engines: Path, work: Path, timeout: float, engine: str = "vllm", prefill: str = "1x1",
    decode: str = "1x1", base_port: int = DEFAULT_BASE_PORT, router_port: int | None = None,
    sglang_backend: str = "nixl",
) -> dict:  # fmt: skip
    venv = engines / engine
    doc, model = prepare(work, engine, prefill, decode, base_port)
    engines_cmds = [c for c in doc["commands"] if is_engine(engine, c["argv"])]
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout
    result: dict = {"engine": engine, "prefill": prefill, "decode": decode, "commands": []}
    if engine == "sglang":
        result["kv_backend"] = sglang_backend
    logs = [work / f"{c['instance'].replace('/', '-')}.log" for c in engines_cmds]
    runs = []
    for c in engines_cmds:
        argv, env = engine_argv(c, venv, doc.get("addresses", {}).get(c["server"]), engine)
        argv = shift_bootstrap(argv, base_port - DEFAULT_BASE_PORT)
        if engine == "sglang":
            argv, env = with_backend(argv, env, sglang_backend)
        runs.append((c["instance"], argv, env))
    rargv = with_router_ports(
        shift_bootstrap(router_argv(doc, venv), base_port - DEFAULT_BASE_PORT), router_port
    )
    held = check_ports(needed_ports([*runs, ("the router", rargv, {})]))
    if held:  # before anything starts, not when an engine dies minutes later
        raise PortHeld(held)
    try:
        for (_, argv, env), path in zip(runs, logs, strict=True):
            result["commands"].append(" ".join(argv))
            procs.append(start(argv, path, env))
        urls = {i["name"]: i["url"] for i in doc["instances"]}
        for c in engines_cmds:
            wait_healthy(urls[c["instance"]] + "/health", procs, deadline)
        result["commands"].append(" ".join(rargv))
        procs.append(start(rargv, work / "router.log"))
        port = rargv[rargv.index("--port") + 1]
        router = f"http://127.0.0.1:{port}"
        wait_healthy(router + "/health", procs, deadline)
        result["token_ids"] = request_when_ready(engine, router, model, deadline)
        decode_i = next(i for i in doc["instances"] if i["role"] == "decode")
        prefill_i = next(i for i in doc["instances"] if i["role"] == "prefill")
        dm, pm = get(decode_i["url"] + "/metrics"), get(prefill_i["url"] + "/metrics")
        result.update(evidence(engine, dm, pm))
        words = ("handshake", "xfer", "initializing nixl", "bootstrap", "kv transfer")
        result["kv_log_lines"] = [
            line.strip()[:300]
            for path in logs
            for line in open(path, errors="replace")
            if any(w in line.lower() for w in words)
            and "non-default args" not in line  # the argument dump names every flag
            and "server_args=" not in line
        ][:8]
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
    p.add_argument("--engine", choices=sorted(CPU), default="vllm")
    p.add_argument("--prefill-par", default="1x1", help="prefill TPxPP the plan is forced to")
    p.add_argument("--decode-par", default="1x1", help="decode TPxPP the plan is forced to")
    p.add_argument("--engines", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--work", type=Path, default=Path("engine-e2e"))
    p.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                   help="the export's --base-port (SGLang's bootstrap ports follow)")  # fmt: skip
    p.add_argument("--router-port", type=int, help="in place of the export's router port")
    p.add_argument("--sglang-backend", choices=["nixl", "mooncake"], default="nixl",
                   help="SGLang's KV transfer: the export's, or mooncake over TCP")  # fmt: skip
    p.add_argument("--timeout", type=float, default=1500, help="seconds for the whole run")
    a = p.parse_args(argv)
    need = {"vllm": "vllm/bin/vllm-router", "sglang": "sglang/bin/python"}[a.engine]
    if not (a.engines / need).exists():
        print(f"engine_e2e: no {a.engine} environment in {a.engines} (tools/engines.sh)",
              file=sys.stderr)  # fmt: skip
        return 2
    for par in (a.prefill_par, a.decode_par):
        if not re.fullmatch(r"[1-9]\d?x[1-9]\d?", par):
            print(f"engine_e2e: parallelism {par!r} is not TPxPP", file=sys.stderr)
            return 2
    try:
        res = run(a.engines, a.work.resolve(), a.timeout, a.engine, a.prefill_par,
                  a.decode_par, a.base_port, a.router_port, a.sglang_backend)  # fmt: skip
    except PortHeld as e:
        print(f"engine_e2e: {e} (stop it, or move the run: --base-port, --router-port)",
              file=sys.stderr)  # fmt: skip
        return 2
    print(json.dumps(res, indent=1))
    return 0 if res.get("token_ids") and transferred(a.engine, res) else 1


if __name__ == "__main__":
    sys.exit(main())
