"""The CLI fuzz (test_cli_fuzz.py) over the options added since it was written: the serving
engine, servers' addresses, plugin and model paths, the k8s images and
volumes, the planner's whole-run time limit and the seed planners' options, the simulator's
modes, and the journal and Ray options of the long commands. Same rules and machinery: a
seeded case changes one to three options; good values only must exit 0, a bad one must exit
2 with one line naming the problem, never a traceback or a hang. Each entry is named after
its subcommand (the part before ``+``) and adds to that subcommand's own cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fuzz import judge, run_captured
from test_cli_fuzz import NUMBER_JUNK, PATH_JUNK, SPECS, Spec, env, make_case  # noqa: F401

from controller.cli import main

_EXPORT = ["export", "--plan", "{plan}", "--format", "vllm", "--out", "{tmp}/out"]
# the testbed's plan: its servers' names are Kubernetes names (fig2's A and B are not)
_K8S = ["export", "--plan", "{tb_plan}", "--format", "k8s", "--engine", "vllm", "--out", "{tmp}/k",
        "--heroserve-image", "reg.example/heroserve:1"]  # fmt: skip

OPTION_SPECS: dict[str, Spec] = {
    "plan+options": Spec(
        ["plan", "--topology", "fig2", "--model", "OPT-13B", "--planner", "heroserve", "--quiet"],
        {
            "--engine": (["vllm", "sglang"], ["x", "", "VLLM", "vllm,sglang"]),
            "--planner-time-limit": (["30", "0.5"], ["0", "-1", "1e300", "86401", *NUMBER_JUNK]),
            "--servers": ([], ["0", "-1", "1e9", "x", "nan"]),
            "--json": (["{tmp}/q.json"], ["{dir}", "{missing}", "{fifo}"]),
            "--cost-mode": (["paper"], ["PAPER", "x"]),
            "--helix-nodes": ([], ["x", ""]),
            "--mapper": ([], ["x", ""]),
            "--costeff-method": ([], ["x"]),
            "--budget": ([], ["x", "nan", "-1"]),
        },
        cases=60,
        valid=10,
    ),
    "export+options": Spec(
        _EXPORT,
        {
            "--format": (["sglang", "deployment"], ["VLLM", "x"]),
            "--engine": ([], ["x", "", "tgi"]),
            "--address": (
                ["A=10.0.0.1"],
                [
                    "nosuch=10.0.0.1",
                    "fig2-s0",
                    "A=",
                    "=10.0.0.1",
                    "A=not-an-ip",
                    "A=10.0.0.1\\n",
                    "A=10.0.0.256",
                    "A=1.2.3",
                ],
            ),  # fmt: skip
            "--tuner-plugin": (["libx.so", "/opt/heroserve/lib/t.so"], ["t\n.so", "a\x00b"]),
            "--net-plugin": (["heroserve", "/opt/lib/libnccl-net-x.so"], ["a\nb", "x\x1b"]),
            "--ina-config": (["/run/h/ina.json"], ["relative/ina.json", "a\nb", ""]),
            "--model-path": (["/models/m", "org/model"], ["m\x1bx", "a\nb"]),
            "--base-port": (["8100", "1024"], ["0", "65536", "-1", "x", "nan", "1e3"]),
            "--shm-prefix": (["p."], ["../x", "a/b", "x" * 65]),
            "--controller": (["10.0.0.9:50051"], ["x:0", "x:65536", "a b:1", ""]),
            "--out": ([], ["{bin}", "/proc/x/o"]),
        },
        cases=80,
        valid=12,
    ),
    "export+k8s": Spec(
        _K8S,
        {
            "--image": (["reg.example/vllm:0.6"], ["a\nb", "a b"]),
            "--router-image": (["reg.example/router:1"], ["a\nb"]),
            "--heroserve-image": (["reg.example/heroserve:1"], ["a\nb"]),
            "--dev-shm": (["8Gi"], ["x", "-1Gi", ""]),
            "--model-volume": ([], ["a\nb"]),
            "--plugin-dir": (["/opt/heroserve/lib"], ["relative/dir", "a\nb", ""]),
            "--engine": (["sglang"], ["x", ""]),
            "--tuner-plugin": ([], ["t\n.so"]),
        },
        cases=60,
        valid=8,
    ),
    "simulate+options": Spec(
        ["simulate", "--plan", "{plan}", "--rate", "2", "--requests", "20"],
        {
            "--per-gpu": ([], ["x"]),
            "--rate": (["0.1"], ["-0", "1e-400", "nan", "-inf"]),
            "--requests": (["10"], ["-5", "0x10", "2.5", ""]),
            "--cv": (["0.5"], ["-1", "inf", "x"]),
            "--workload": (["chatbot"], ["{dir}", "{bin}", "{garbage}"]),
            "--json": (["{tmp}/s.json"], ["{fifo}", "{dir}"]),
        },
        cases=60,
        valid=8,
    ),
    "evaluate+options": Spec(
        ["evaluate", "--scenario", "testbed-chatbot", "--out", "{tmp}/eval", "--quiet"],
        {
            "--journal": ([], ["{dir}", "{bin}", "{fifo}", "/proc/x/j.db", "{garbage}"]),
            "--ray": ([], ["", "a b", "x:99999"]),
            "--workers": ([], ["-1", "nan", "1e9"]),
            "--requests": ([], ["x", "nan"]),
            "--servers": ([], ["x", "-1"]),
        },
        cases=30,
    ),
    "fidelity+options": Spec(
        ["fidelity", "--out", "{tmp}/f.md", "--quiet", "--quick"],
        {
            "--journal": ([], ["{dir}", "{bin}", "{fifo}", "/proc/x/j.db", "{garbage}"]),
            "--eval-dir": ([], ["{bin}", "{fifo}", "{garbage}"]),
            "--ray": ([], ["", "a b"]),
            "--servers": ([], ["-1", "1e9"]),
            "--section": ([], ["ABLATION", "x"]),
        },
        cases=30,
    ),
}


def test_the_fuzz_covers_at_least_700_command_lines() -> None:
    """At least 700 inputs over the old and the new options."""
    assert all(name.split("+")[0] in SPECS for name in OPTION_SPECS)
    total = sum(s.cases for s in SPECS.values()) + sum(s.cases for s in OPTION_SPECS.values())
    assert total >= 700, total


@pytest.fixture(scope="module")
def tb_env(env: dict[str, str]) -> dict[str, str]:  # noqa: F811
    """``env`` and a plan of the testbed for vLLM (``{tb_plan}``)."""
    path = Path(env["root"]).parent / "tb-plan.json"
    argv = ["plan", "--topology", "testbed", "--planner", "heroserve", "--engine", "vllm"]
    assert main([*argv, "--quiet", "--json", str(path)]) == 0
    return {**env, "tb_plan": str(path)}


@pytest.mark.parametrize("name", list(OPTION_SPECS))
def test_fuzzed_new_options(name: str, tb_env: dict[str, str]) -> None:
    Path(tb_env["root"]).mkdir(exist_ok=True)
    spec = OPTION_SPECS[name]
    sub = name.split("+")[0]
    failures, outcomes = [], set()
    for k in range(spec.cases):
        case = make_case(name.replace("+", "-"), k, tb_env, spec)
        rc, err = run_captured(main, case.argv)
        why = judge(rc, err, case.valid, f"heroserve {sub}")
        if why:
            failures.append(f"{case.name()}: {why}")
        outcomes.add(rc)
    assert not failures, f"{len(failures)} failures, first:\n" + "\n".join(failures[:8])
    assert 2 in outcomes
