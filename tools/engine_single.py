"""One exported instance alone on this machine's CPU: the multi-rank layout of an export (TP
ranks in one instance) started by the engine itself, without the KV transfer between a prefill
and a decode instance (docs/engine-check.md, "One instance with two ranks").

    python tools/engine_single.py [--engine sglang|vllm] [--par 2x1] [--engines DIR]
                                  [--work DIR] [--base-port P] [--timeout S]

It plans and exports as tools/engine_e2e.py does (prefill forced to ``--par``, decode 1x1),
takes the export's prefill command, drops its ``--disaggregation-*`` flags (SGLang) or its
``--kv-transfer-config`` (vLLM) so that the instance serves requests by itself, adds the same
CPU additions, waits on ``/health`` and sends one request of 64 token ids straight to it.
Prints the command, the token ids returned and the log lines naming each rank; exit status 0
when the request returned its tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from engine_check import DEFAULT_ENGINES, is_engine  # noqa: E402
from engine_e2e import (  # noqa: E402
    DEFAULT_BASE_PORT,
    MAX_TOKENS,
    engine_argv,
    prepare,
    request,
    start,
    wait_healthy,
)
from engine_ports import check_ports, needed_ports  # noqa: E402

# the flags of a disaggregated instance, with the number of values each takes
DISAGG_FLAGS = {"--kv-transfer-config": 1}
DISAGG_PREFIX = "--disaggregation-"  # SGLang's: each takes one value
RANK_LINE = re.compile(r"TP\d|tp_rank|Worker_TP|rank \d", re.IGNORECASE)


def alone(argv: list[str]) -> list[str]:
    """``argv`` without the flags that tie an instance to a prefill/decode pair."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        if a in DISAGG_FLAGS or a.startswith(DISAGG_PREFIX):
            skip = DISAGG_FLAGS.get(a, 1)
            continue
        out.append(a)
    return out


def run(engines: Path, work: Path, timeout: float, engine: str, par: str, base_port: int) -> dict:
    doc, model = prepare(work, engine, par, "1x1", base_port)
    cmd = next(
        c for c in doc["commands"] if is_engine(engine, c["argv"]) and c["instance"] == "prefill/0"
    )
    argv, env = engine_argv(
        cmd, engines / engine, doc.get("addresses", {}).get(cmd["server"]), engine
    )
    argv = alone(argv)
    env.pop("VLLM_NIXL_SIDE_CHANNEL_PORT", None)
    held = check_ports(needed_ports([(cmd["instance"], argv, {})]))
    if held:
        raise SystemExit(f"engine_single: {held}")
    result: dict = {"engine": engine, "par": par, "command": " ".join(argv)}
    log = work / "instance.log"
    proc = start(argv, log, env)
    try:
        deadline = time.monotonic() + timeout
        url = next(i["url"] for i in doc["instances"] if i["name"] == cmd["instance"])
        url = url.replace("localhost", "127.0.0.1")
        wait_healthy(url + "/health", [proc], deadline)
        result["token_ids"] = request(engine, url, model, max(deadline - time.monotonic(), 30))
    except RuntimeError as e:
        result["error"] = str(e)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - still running: kill its group
            os.killpg(proc.pid, signal.SIGKILL)
        lines = open(log, errors="replace").read().splitlines()
        result["rank_lines"] = [x.strip()[:200] for x in lines if RANK_LINE.search(x)][:8]
        result["log_tail"] = [x.strip()[:300] for x in lines[-6:]]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["sglang", "vllm"], default="sglang")
    p.add_argument("--par", default="2x1", help="the instance's TPxPP")
    p.add_argument("--engines", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--work", type=Path, default=Path("engine-single"))
    p.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    p.add_argument("--timeout", type=float, default=1500, help="seconds for the whole run")
    a = p.parse_args(argv)
    if not re.fullmatch(r"[1-9]\d?x[1-9]\d?", a.par):
        print(f"engine_single: parallelism {a.par!r} is not TPxPP", file=sys.stderr)
        return 2
    if not (a.engines / a.engine / "bin" / "python").exists():
        print(f"engine_single: no {a.engine} environment in {a.engines}", file=sys.stderr)
        return 2
    res = run(a.engines, a.work.resolve(), a.timeout, a.engine, a.par, a.base_port)
    print(json.dumps(res, indent=1))
    return 0 if res.get("token_ids") and len(res["token_ids"]) == MAX_TOKENS else 1


if __name__ == "__main__":
    sys.exit(main())
