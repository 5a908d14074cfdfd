"""HeroServe's predictions against a real engine (docs/engine-profile.md, "Checked against vLLM"):
plan a one-server CPU "cluster" (this machine, two engine slots) with an engine profile, start
the exported prefill/decode pool with vLLM's CPU build (OPT-125M's shape, dummy weights) and
``vllm-router`` (as tools/engine_e2e.py does), drive it with Poisson arrivals at several rates,
and print predicted against measured: TTFT p90, TPOT p90, SLA attainment, and the largest rate
meeting the SLA at 90% attainment.

    python benchmarks/engine_vs_prediction.py --profile P.json [--rates 0.5,1,2] [...]

The predicted figures at a rate are the simulator's (``heroserve simulate --profile``, the
cost model the planner uses) on the very requests sent to the engine (the same workload,
seed and rate give the same arrival times and lengths); the predicted largest rate is the
plan's H. The measured largest rate is where attainment crosses 90% between the two measured
rates around it (linear in the rate); none when no measured rate crosses. A benchmark, not a
test: its figures depend on the machine and its load, which it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from engine_check import DEFAULT_ENGINES, heroserve, is_engine  # noqa: E402
from engine_e2e import engine_argv, router_argv, topology, wait_healthy, with_router_ports  # noqa: E402
from engine_ports import check_ports, needed_ports  # noqa: E402

from controller.models import model_spec  # noqa: E402
from controller.models.hfconfig import write_model_config  # noqa: E402
from controller.sim import request_arrays  # noqa: E402
from controller.workload import resolve_workload  # noqa: E402

MODEL = "OPT-125M"
# tools/engine_e2e.py's one-server topology with each slot's memory set to what a CPU engine
# holds: its KV cache (VLLM_CPU_KVCACHE_SPACE=1 GiB, engine_e2e's CPU_ENV) and OPT-125M's
# weights (0.25 GB in 16 bits), over the planner's R_frac of 0.9: 1.47 GB
SLOT_GB = (1 * 2**30 / 1e9 + 0.25) / 0.9
CPU_TOPOLOGY = topology(2).replace("role: any}", f"role: any, memory_gb: {SLOT_GB:.3f}}}")
# the requests: short chat turns that fit the CPU engines' --max-model-len 256 (the
# export's CPU additions, tools/engine_e2e.py), lengths drawn uniformly
PROMPTS, OUTPUTS = (32, 128), (8, 32)


def write_trace(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = ["input_tokens,output_tokens"]
    for _ in range(n):
        rows.append(
            f"{rng.integers(*PROMPTS, endpoint=True)},{rng.integers(*OUTPUTS, endpoint=True)}"
        )
    path.write_text("\n".join(rows) + "\n")


def hs(*args: str) -> str:
    r = heroserve(*args)
    if r.returncode:
        raise SystemExit(f"engine_vs_prediction: heroserve {args[0]} failed: {r.stderr.strip()}")
    return r.stdout


def predicted(work: Path, a: argparse.Namespace, rate: float) -> dict:
    out = work / f"sim-{rate:g}.json"
    hs("simulate", "--plan", str(work / "plan.json"), "--topology", str(work / "topology.yaml"),
       "--workload", str(work / "trace.csv"), "--profile", str(a.profile), "--rate", str(rate),
       "--requests", str(a.requests), "--seed", str(a.seed), "--json", str(out))  # fmt: skip
    d = json.loads(out.read_text())
    return {"ttft_p90": d["ttft_s"]["p90"], "tpot_p90": d["tpot_s"]["p90"],
            "attainment": d["attainment"]}  # fmt: skip


def one_request(url: str, model: str, prompt: list[int], out_tokens: int, rec: dict) -> None:
    """Streams one completion; records TTFT and TPOT from the chunks' arrival times."""
    body = {"model": model, "prompt": prompt, "max_tokens": out_tokens, "min_tokens": out_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    t0 = time.perf_counter()
    times = []
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    times.append(time.perf_counter())
    except OSError as e:
        rec["error"] = str(e)
        return
    if times:
        rec["ttft"] = times[0] - t0
        rec["tpot"] = (times[-1] - times[0]) / max(1, out_tokens - 1)


def measured(router: str, model: str, a: argparse.Namespace, rate: float, sla: dict) -> dict:
    """The same requests the simulator priced (the workload's arrays at ``rate``), sent at
    their arrival times."""
    w = resolve_workload(str(a.work / "trace.csv"), seed=a.seed)
    arrivals, inputs, outputs = request_arrays(w, rate, a.requests, a.seed, 1.0)
    recs: list[dict] = [{} for _ in arrivals]
    threads = []
    start = time.perf_counter()
    for k, (t, n_in, n_out) in enumerate(zip(arrivals, inputs, outputs, strict=True)):
        delay = start + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prompt = [3 + (k * 7919 + j) % 50000 for j in range(int(n_in))]  # no shared prefixes
        th = threading.Thread(target=one_request, args=(router, model, prompt, int(n_out), recs[k]))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    ok = [r for r in recs if "ttft" in r]
    ttft = np.array([r["ttft"] for r in ok])
    tpot = np.array([r["tpot"] for r in ok])
    met = sum(1 for r in ok if r["ttft"] <= sla["ttft_s"] and r["tpot"] <= sla["tpot_s"])
    return {"ttft_p90": float(np.percentile(ttft, 90)) if ok else float("nan"),
            "tpot_p90": float(np.percentile(tpot, 90)) if ok else float("nan"),
            "attainment": met / len(recs), "failed": len(recs) - len(ok)}  # fmt: skip


def crossing(rates: list[float], att: list[float], goal: float) -> float | None:
    """The rate where attainment falls through ``goal``, linear between measured rates."""
    for k in range(len(rates) - 1):
        (r0, a0), (r1, a1) = (rates[k], att[k]), (rates[k + 1], att[k + 1])
        if a0 >= goal > a1:
            return r0 + (a0 - goal) / (a0 - a1) * (r1 - r0)
    return None


def start_pool(work: Path, venv: Path, timeout: float) -> tuple[list[subprocess.Popen], str]:
    doc = json.loads((work / "vllm.json").read_text())
    cmds = [c for c in doc["commands"] if is_engine("vllm", c["argv"])]
    runs = [(c["instance"], *engine_argv(c, venv, doc.get("addresses", {}).get(c["server"])))
            for c in cmds]  # fmt: skip
    rargv = with_router_ports(router_argv(doc, venv), None)
    held = check_ports(needed_ports([*runs, ("the router", rargv, {})]))
    if held:
        raise SystemExit(f"engine_vs_prediction: {held}")
    procs = []
    deadline = time.monotonic() + timeout
    for name, argv, env in runs:
        log = open(work / f"{name.replace('/', '-')}.log", "w")
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
    urls = {i["name"]: i["url"] for i in doc["instances"]}
    for c in cmds:
        wait_healthy(urls[c["instance"]] + "/health", procs, deadline)
    log = open(work / "router.log", "w")
    procs.append(subprocess.Popen(rargv, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True))  # fmt: skip
    router = f"http://127.0.0.1:{rargv[rargv.index('--port') + 1]}"
    wait_healthy(router + "/health", procs, deadline)
    return procs, router


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", type=Path, required=True, help="heroserve profile's output")
    p.add_argument("--engines", type=Path, default=DEFAULT_ENGINES)
    p.add_argument("--work", type=Path, default=Path("engine-vs-prediction"))
    p.add_argument("--rates", default=None, help="req/s, comma-separated (default: 0.5, 0.8, "
                   "1.0 and 1.3 x the plan's predicted rate)")  # fmt: skip
    p.add_argument("--requests", type=int, default=60, help="requests per rate")
    p.add_argument("--sla-ttft", type=float, default=1.0, help="s")
    p.add_argument("--sla-tpot", type=float, default=0.1, help="s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900, help="s to start the pool")
    a = p.parse_args(argv)
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    venv = a.engines / "vllm"
    if not (venv / "bin" / "vllm-router").exists():
        print(f"engine_vs_prediction: no vllm environment in {a.engines}", file=sys.stderr)
        return 2
    (a.work / "topology.yaml").write_text(CPU_TOPOLOGY)
    write_trace(a.work / "trace.csv", 1000, a.seed)
    model = write_model_config(model_spec(MODEL), a.work / "opt-125m")
    topo, trace = str(a.work / "topology.yaml"), str(a.work / "trace.csv")
    hs("plan", "--planner", "heroserve", "--topology", topo, "--model", MODEL, "--workload",
       trace, "--prefill-par", "1x1", "--decode-par", "1x1", "--engine", "vllm", "--profile",
       str(a.profile), "--sla-ttft", str(a.sla_ttft), "--sla-tpot", str(a.sla_tpot), "--quiet",
       "--json", str(a.work / "plan.json"))  # fmt: skip
    plan = json.loads((a.work / "plan.json").read_text())
    hs("export", "--plan", str(a.work / "plan.json"), "--topology", topo, "--format", "vllm",
       "--out", str(a.work), "--model-path", str(model))  # fmt: skip
    h = plan["predicted"]["rate"]
    rates = (
        [float(x) for x in a.rates.split(",")] if a.rates else [f * h for f in (0.5, 0.8, 1.0, 1.3)]
    )
    sla = {"ttft_s": a.sla_ttft, "tpot_s": a.sla_tpot}
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()} at start; plan "
          f"H = {h:.3f} req/s; SLA TTFT {a.sla_ttft} s, TPOT {a.sla_tpot} s")  # fmt: skip
    procs, router = start_pool(a.work, venv, a.timeout)
    rows = []
    try:
        measured(
            router, str(model), argparse.Namespace(**{**vars(a), "requests": 4}), 0.5, sla
        )  # warm-up
        for r in rates:
            pr = predicted(a.work, a, r)
            me = measured(router, str(model), a, r, sla)
            rows.append((r, pr, me, os.getloadavg()[0]))
            print(f"rate {r:.3f}: predicted {pr} measured {me}", flush=True)
    finally:
        stop(procs)
    head = (f"{'rate r/s':>9} | {'TTFT p90 pred/meas (ms)':>24} | "
            f"{'TPOT p90 pred/meas (ms)':>24} | {'attain pred/meas':>17} | load")  # fmt: skip
    print("\n" + head + "\n" + "-" * len(head))
    for r, pr, me, load in rows:
        print(f"{r:9.3f} | {pr['ttft_p90'] * 1e3:10.1f} / {me['ttft_p90'] * 1e3:10.1f} | "
              f"{pr['tpot_p90'] * 1e3:10.1f} / {me['tpot_p90'] * 1e3:10.1f} | "
              f"{pr['attainment']:7.0%} / {me['attainment']:7.0%} | {load:.1f}")  # fmt: skip
    rs = [r for r, *_ in rows]
    meas_max = crossing(rs, [me["attainment"] for _, _, me, _ in rows], 0.9)
    sim_max = crossing(rs, [pr["attainment"] for _, pr, _, _ in rows], 0.9)
    print(f"\nmax rate at 90% attainment: predicted (plan H) {h:.3f} req/s, simulated "
          f"{'-' if sim_max is None else f'{sim_max:.3f}'}, measured "
          f"{'none crossed' if meas_max is None else f'{meas_max:.3f}'} req/s")  # fmt: skip
    res = {"rates": rs, "rows": rows, "plan_rate": h, "measured_max": meas_max}
    (a.work / "result.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
