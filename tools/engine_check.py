"""The engines as tests: every command ``heroserve export`` writes, fed through vLLM's and
SGLang's own argument parsers and configuration checks (docs/engine-check.md).

    python tools/engine_check.py [--engines DIR] [--work DIR] [--quick]

For each case (a plan of the testbed for chatbot and summarization, a 2tracks plan, and
plans forced into each parallelism the export must handle) it runs ``heroserve plan`` and
``heroserve export --format vllm|sglang`` with ``--model-path`` pointing at a folder that
holds only the model's ``config.json`` (written here from ``controller/models/specs.py``),
then hands all commands of one engine to that engine's probe (``engine_probe_vllm.py``,
``engine_probe_sglang.py``) run by the engine's own Python from ``DIR/vllm`` and
``DIR/sglang`` (``tools/engines.sh`` makes them). The probe reports, per command, whether the
engine accepts it and the TP, PP and batch limit the engine took from it, which must be the
export's. Last it feeds two deliberately broken commands, which the engines must refuse: a
vLLM decode instance with pipeline parallelism under NIXL, and an SGLang prefill whose PP
ranks split unevenly over two servers of 8 and 4 GPUs.

Prints ``vllm: N commands, N accepted, 0 problems`` (and the same for SGLang) with the
engine versions; exit status 0 when every command is accepted and both broken ones refused.
Holds: the cases, the model config writer, the broken commands, the cross-check of the
probes' facts against the export, and the report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.models.hfconfig import opt_config, write_model_config  # noqa: E402, F401
from controller.models.specs import model_spec  # noqa: E402

TOOLS = Path(__file__).resolve().parent
DEFAULT_ENGINES = Path(
    os.environ.get("HEROSERVE_ENGINES", Path.home() / ".cache" / "heroserve-engines")
)


@dataclass
class Case:
    name: str
    plan_args: list[str]
    topology: str = "testbed"


# Each forced pair puts one instance shape in front of the engines: PP across servers
# (prefill 1x8 on two 4-GPU servers), TP across servers (8x1 both), TP and PP both (4x2);
# the testbed has 4 servers of 4 GPUs (docs/topology.md), and OPT-66B needs 4 of them per
# instance (a pair the plan cannot honour is refused by `heroserve plan`, exit 2).
CASES = [
    Case("testbed-chatbot", ["--workload", "chatbot"]),
    Case("testbed-summarization", ["--workload", "summarization"]),
    Case("2tracks-chatbot", ["--workload", "chatbot", "--gpus", "32"], "2tracks"),
    Case("forced-1x8-4x1", ["--prefill-par", "1x8", "--decode-par", "4x1"]),
    Case("forced-8x1-8x1", ["--prefill-par", "8x1", "--decode-par", "8x1"]),
    Case("forced-4x2-4x1", ["--prefill-par", "4x2", "--decode-par", "4x1"]),
]
# --quick: one plan whose every instance both engines run today (decode without PP; prefill
# PP across two servers, TP on one), so a failure means the export or an engine changed
QUICK = [c for c in CASES if c.name == "forced-1x8-4x1"]


def heroserve(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip


def plan_supports_engine() -> bool:
    """``heroserve plan --engine`` exists once the planner knows the engines' profiles."""
    return "--engine" in heroserve("plan", "--help").stdout


@dataclass
class Export:
    case: str
    fmt: str
    doc: dict
    problems: list[str] = field(default_factory=list)


def export_case(case: Case, fmt: str, work: Path, engine_flag: bool) -> Export:
    folder = work / case.name
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / f"plan-{fmt}.json"
    extra = ["--engine", fmt] if engine_flag else []
    args = ["plan", "--planner", "heroserve", "--topology", case.topology, "--quiet"]
    r = heroserve(*args, *case.plan_args, *extra, "--json", str(plan))
    if r.returncode:
        return Export(case.name, fmt, {}, [f"{case.name}: plan failed: {r.stderr.strip()}"])
    model = json.loads(plan.read_text())["model"]
    mpath = write_model_config(model_spec(model), work / "models" / model)
    out = folder / fmt
    r = heroserve("export", "--plan", str(plan), "--format", fmt, "--out", str(out),
                  "--model-path", str(mpath))  # fmt: skip
    if r.returncode:
        return Export(case.name, fmt, {}, [f"{case.name}: export failed: {r.stderr.strip()}"])
    return Export(case.name, fmt, json.loads((out / f"{fmt}.json").read_text()))


def is_engine(fmt: str, argv: list[str]) -> bool:
    if fmt == "vllm":
        return argv[:2] == ["vllm", "serve"]
    return argv[:3] == ["python", "-m", "sglang.launch_server"]


def is_checked(fmt: str, argv: list[str]) -> bool:
    """The commands a probe runs: engines, and SGLang's router (vLLM's router is a Rust
    binary with no parser to call short of starting it: the end-to-end run starts it)."""
    router = argv[:3] == ["python", "-m", "sglang_router.launch_router"]
    return is_engine(fmt, argv) or (fmt == "sglang" and router)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def broken_vllm(doc: dict) -> dict | None:
    """The export's first decode ``vllm serve`` with ``--pipeline-parallel-size 2``: NIXL's
    consumer side refuses pipeline parallelism."""
    for c in doc.get("commands", []):
        kv = _flag(c["argv"], "--kv-transfer-config") or ""
        if is_engine("vllm", c["argv"]) and "kv_consumer" in kv:
            argv = list(c["argv"])
            argv[argv.index("--pipeline-parallel-size") + 1] = "2"
            return {"argv": argv, "env": c["env"], "what": "decode PP=2 under NIXL"}
    return None


def broken_sglang(doc: dict) -> dict | None:
    """The export's first prefill server command as node 1 of a 1x12 instance on servers of
    8 and 4 GPUs: SGLang gives each node 12 / 2 = 6 PP ranks."""
    for c in doc.get("commands", []):
        if is_engine("sglang", c["argv"]) and "prefill" in c["argv"]:
            argv = [a for a in c["argv"] if a != "--disable-custom-all-reduce"]
            for name, value in (("--tp-size", "1"), ("--pp-size", "12")):
                argv[argv.index(name) + 1] = value
            for name in ("--dist-init-addr", "--nnodes", "--node-rank"):
                if name in argv:
                    del argv[argv.index(name) : argv.index(name) + 2]
            argv += ["--dist-init-addr", "head:5000", "--nnodes", "2", "--node-rank", "1"]
            env = {**c["env"], "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
            return {"argv": argv, "env": env, "what": "SGLang 1x12 prefill split 8+4"}
    return None


def run_probe(engines: Path, fmt: str, cmds: list[dict], work: Path) -> tuple[dict, list[dict]]:
    """The probe's header line and one result per command, in order."""
    path = work / f"{fmt}-commands.json"
    path.write_text(json.dumps(cmds))
    py = engines / fmt / "bin" / "python"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run(
        [str(py), str(TOOLS / f"engine_probe_{fmt}.py"), str(path)],
        capture_output=True, text=True, env=env, cwd=work,
    )  # fmt: skip
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    if not lines or len(lines) != len(cmds) + 1:
        tail = r.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"engine_check: {fmt} probe stopped ({r.returncode}): {tail[0]}")
    return lines[0], lines[1:]


def cross_check(fmt: str, cmd: dict, res: dict, instances: dict[str, dict]) -> list[str]:
    """The engine must have taken the plan's TP, PP and request limit from the command (the
    export's ``in_flight``: the batch, raised for a pipelined prefill)."""
    inst = instances.get(cmd["instance"])
    facts = res.get("facts", {})
    if inst is None or not is_engine(fmt, cmd["argv"]) or not facts:
        return []
    batch = facts.get("max_num_seqs", facts.get("max_running_requests"))
    want = {"tp": inst["tp"], "pp": inst["pp"], "batch": inst.get("in_flight", inst["batch"])}
    got = {"tp": facts.get("tp"), "pp": facts.get("pp"), "batch": batch}
    return [f"{k}: export {want[k]}, engine {got[k]}" for k in want if want[k] != got[k]]


def check_engine(engines: Path, fmt: str, exports: list[Export], work: Path) -> int:
    """Prints the summary line and each problem; returns the number of problems."""
    cmds, origin, problems = [], [], [p for e in exports for p in e.problems]
    for e in exports:
        for c in e.doc.get("commands", []):
            if is_checked(fmt, c["argv"]):
                cmds.append({"id": len(cmds), "argv": c["argv"], "env": c["env"]})
                origin.append((e, c))
    make_broken = broken_vllm if fmt == "vllm" else broken_sglang
    broken = [b for b in (make_broken(exports[0].doc),) if b is not None]
    for b in broken:
        cmds.append({"id": len(cmds), "argv": b["argv"], "env": b["env"]})
    head, results = run_probe(engines, fmt, cmds, work)
    accepted = 0
    for (e, c), res in zip(origin, results, strict=False):
        instances = {i["name"]: i for i in e.doc["instances"]}
        wrong = cross_check(fmt, c, res, instances)
        where = f"{e.case} {c['instance']} on {c['server']}"
        if not res["ok"]:
            problems.append(f"{where}: refused at {res['stage']}: {res['error']}"
                            f" ({res.get('where', '?')})")  # fmt: skip
        elif wrong:
            problems.append(f"{where}: {'; '.join(wrong)}")
        else:
            accepted += 1
    version = " ".join(f"{k} {v}" for k, v in head.items() if k != "engine")
    print(f"{fmt}: {len(origin)} commands, {accepted} accepted, {len(problems)} problems"
          f" ({version})")  # fmt: skip
    for p in problems:
        print(f"  problem: {p}")
    for b, res in zip(broken, results[len(origin) :], strict=True):
        if res["ok"]:
            problems.append(f"broken export accepted: {b['what']}")
            print(f"  broken export NOT refused: {b['what']}")
        else:
            print(f"  broken export refused ({b['what']}): at {res['stage']}: {res['error']}"
                  f" ({res.get('where', '?')})")  # fmt: skip
    if len(broken) != 1:
        problems.append("no command to break")
    return len(problems)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engines",
        type=Path,
        default=DEFAULT_ENGINES,
        help="folder with the vllm/ and sglang/ environments (tools/engines.sh)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path("engine-check"),
        help="folder for plans, exports and model configs",
    )
    p.add_argument("--quick", action="store_true", help="only the forced 1x8 / 4x1 plan")
    p.add_argument("--engine", choices=("vllm", "sglang"), action="append",
                   help="check only this engine (repeatable; default both)")  # fmt: skip
    a = p.parse_args(argv)
    for fmt in a.engine or ("vllm", "sglang"):
        if not (a.engines / fmt / "bin" / "python").exists():
            print(f"engine_check: no {fmt} environment in {a.engines} (tools/engines.sh)",
                  file=sys.stderr)  # fmt: skip
            return 2
    # absolute: the exports name the model folder under it, and the probes run with it as cwd
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    engine_flag = plan_supports_engine()
    total = 0
    for fmt in a.engine or ("vllm", "sglang"):
        exports = [export_case(c, fmt, a.work, engine_flag) for c in (QUICK if a.quick else CASES)]
        total += check_engine(a.engines, fmt, exports, a.work)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
