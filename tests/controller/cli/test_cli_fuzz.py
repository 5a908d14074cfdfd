"""Fuzz of every ``heroserve`` subcommand's command line (the files they read have their own
fuzz, tests/controller/inputs/test_input_fuzz.py).

Each subcommand has a valid command line (cheap to run: fig2 with OPT-13B, a live controller
for ``admin``) and, per option, values it must accept and values it must refuse: out of
range, not a number, NaN, a missing file, a FIFO (a read would block for ever), a folder, a
binary file, a port past 65535, control characters, a path out of /dev/shm. A seeded case
applies one to three of them, each option at most once; it is valid when every value applied
is, or when it asks for ``--help``. Valid input must exit 0; bad input must exit 2 with one
line naming the problem; nothing may raise, print a traceback or take over 10 s. Commands
that would run for good on valid input (``controller``, ``softswitch``, ``emulate``,
``demo``) and the long ones (``evaluate``, ``fidelity``) get only bad input and ``--help``.
``softswitch`` runs in a child process of its own (it needs the pure-Python protobuf
runtime), every other case in this process. A failure names the case's seed.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ROOT
from support.fuzz import judge, run_captured

from controller.cli import SUBCOMMANDS, main
from controller.service.sample import sample_plan, save_sample_topology
from controller.service.server import ControllerServer, ThreadedServer
from controller.service.store import Store

NUMBER_JUNK = ["nan", "inf", "-inf", "x", "", "1e400", "0x10", "1_0e"]
PATH_JUNK = ["{missing}", "{fifo}", "{dir}", "{bin}"]


@dataclass
class Spec:
    """A subcommand's valid command line and its options: flag -> (good values, bad values).
    A flag ``@N`` is the base's N-th word (a positional argument)."""

    base: list[str]
    options: dict[str, tuple[list[str], list[str]]]
    cases: int = 32
    valid: int = 0  # how many of the cases use good values only


SPECS: dict[str, Spec] = {
    "plan": Spec(
        ["plan", "--topology", "fig2", "--model", "OPT-13B", "--planner", "heroserve", "--quiet"],
        {
            "--topology": ([], ["nosuch", "{fifo_json}", "{dir}", "{bin}", "{garbage}", ""]),
            "--model": (["LLaMA-3-8B"], ["nosuch", "", "OPT-13B\n"]),
            "--workload": (["summarization", "{trace}"], ["nosuch", "{fifo_csv}", "{missing}"]),
            "--sla-ttft": (["3", "0.5"], ["0", "-1", "1e300", *NUMBER_JUNK]),
            "--sla-tpot": (["0.2"], ["0", "-0.1", *NUMBER_JUNK]),
            "--planner": (["distserve"], ["nosuch", "", "heroserve,heroserve"]),
            "--seed": (["7", "0"], ["-1", "1e30", *NUMBER_JUNK]),
            "--max-candi": (["3"], ["0", "-1", "1e9", *NUMBER_JUNK]),
            "--json": (["{tmp}/p.json"], ["{dir}", "{missing}", "/proc/x/p.json"]),
            "--prefill-par": ([], ["0x1", "4x", "x", "1000x1", "-1x2"]),
            "--decode-par": ([], ["1x0", "2x2x2", ""]),
            "--gpus": ([], ["0", "-3", "1e9", "99999", *NUMBER_JUNK]),
            "--ina-lanes": (["int32"], ["int7", ""]),
            "--cost-mode": (["paper", "pipelined"], ["fast", ""]),
            "--tpot-mode": (["eq4"], ["x"]),
            "--time-limit": (["30"], ["0", "-1", "1e300", *NUMBER_JUNK]),
            "--prune-degree": ([], ["nan", "-1", "x"]),
        },
        valid=8,
    ),
    "validate": Spec(
        ["validate", "{topo}"],
        {
            "@1": (
                ["{plan}", "{trace}", "{topo}"],
                [*PATH_JUNK, "{garbage}", "{fifo_json}", "{unknown_model_plan}"],
            ),
            "--as": ([], ["x", "csv"]),
        },
        valid=6,
    ),
    "topology": Spec(
        ["topology", "validate", "fig2"],
        {
            "@1": (["export"], ["x", ""]),
            "@2": (["testbed", "{topo}"], ["nosuch", *PATH_JUNK, "{garbage}", "{fifo_json}"]),
        },
        valid=6,
    ),
    "export": Spec(
        ["export", "--plan", "{plan}", "--format", "vllm", "--out", "{tmp}/out"],
        {
            "--plan": ([], [*PATH_JUNK, "{garbage}", "{fifo_json}"]),
            "--format": (["deployment", "sglang"], ["x", ""]),
            "--out": (["{tmp}/a/b"], ["{bin}", "/proc/x/out", ""]),
            "--topology": (["fig2"], ["nosuch", "testbed", "{fifo_json}"]),
            "--controller": (
                ["ctl.example:50051", "[::1]:1"],
                ["ctl:99999", "ctl:0", "not an address", "ctl", ":1", "a\nb:1", "ctl:-1"],
            ),
            "--shm-prefix": (["run-1.a_b", ""], ["../../etc/x", "a/b", "..", "x" * 65, "a\tb"]),
            "--base-port": (["9000"], ["0", "70000", "-1", "x"]),
            # values the start scripts carry as data (quoted), and values they cannot (braces
            # doubled: the case's values are format strings)
            "--tuner-plugin": (
                ["/opt/lib/t.so", "$(touch INJECTED).so", "`id`'\"; x"],
                ["t\n.so", "", "${{RUN}}/t.so", '${{ADDR}}"; touch INJECTED; echo "'],
            ),
            "--model-path": (
                ["/models/x", "$(touch INJECTED)", "a b;c"],
                ["m\x1bx", '${{ADDR}}"; touch INJECTED; echo "', "${{RUN}}"],
            ),
            "--address": (
                ["A=10.0.0.1", "B=fd00::2", "A=127.0.0.1"],
                [
                    "A=fe80::1%$(touch INJECTED)",
                    "A=fe80::1%eth0",
                    "A=0.0.0.0",
                    "A=::",
                    "A=255.255.255.255",
                    "A=224.0.0.1",
                    "A=ff02::1",
                    "nosuch=10.0.0.1",
                    "A=",
                    "A=host.example",
                    "=10.0.0.1",
                ],
            ),  # fmt: skip
        },
        cases=96,
        valid=16,
    ),
    "admin": Spec(
        ["admin", "--controller", "{addr}", "state"],
        {
            "--controller": ([], ["h:99999", "127.0.0.1:0", "not an address", "127.0.0.1"]),
            "--tls-cert": ([], ["{missing}", "{fifo}", "{dir}", "{bin}"]),
            "@3": (["agents", "slots"], ["x", ""]),
        },
        valid=6,
    ),
    "pki": Spec(
        ["pki", "issue", "{ca}", "--name", "{node}"],
        {
            "@2": ([], ["{tmp}/no-ca", "{bin}", "{fifo}", ""]),
            "--name": ([], ["a\nb", "", "a/b", "ca", "x" * 70, "-x"]),
            "--days": (["30"], ["0", "-1", "40000", "x"]),
            "--host": ([], ["10.0.0.1", "a b"]),  # without --server: refused
        },
        valid=6,
    ),
    "emulate": Spec(
        ["emulate", "--topology", "fig2"],
        {
            "--topology": ([], ["nosuch", "{fifo_json}", "{garbage}"]),
            "--plan": ([], [*PATH_JUNK, "{garbage}", "{fifo_json}"]),
            "--switch": ([], ["x"]),
            "--window": ([], ["0", "2000", "x"]),
            "--bytes": ([], ["0", "x", "1e12", "4,", "-4"]),
            "--slowdown": ([], ["0", "nan", "x"]),
            "--loss": ([], ["1", "-0.1", "nan"]),
            "--repeat": ([], ["0", "101"]),
            "--seed": ([], ["-1", "x"]),
            "--json": ([], ["{dir}", "{missing}"]),
            "--log-level": ([], ["x"]),
        },
    ),
    "demo": Spec(
        ["demo", "--topology", "fig2"],
        {
            "--topology": ([], ["nosuch", "{fifo_json}", "{bin}"]),
            "--plan": ([], [*PATH_JUNK, "{fifo_json}"]),
            "--window": ([], ["0", "x"]),
            "--hold": ([], ["nan", "-1", "1e9", "x"]),
            "--log-format": ([], ["xml"]),
        },
    ),
    "controller": Spec(
        [
            "controller",
            "--db",
            "{tmp}/c.db",
            "--plan",
            "{sample_plan}",
            "--topology",
            "{sample_topo}",
        ],  # fmt: skip
        {
            "--listen": ([], ["nohost", "127.0.0.1:99999", "[::1", "a b:1", "unix:", ":5"]),
            "--db": ([], ["{dir}", "/proc/x/c.db"]),
            "--plan": ([], [*PATH_JUNK, "{garbage}"]),
            "--topology": ([], ["nosuch", "{fifo_json}"]),
            "--tls-cert": ([], ["{missing}", "{dir}", "{bin}"]),
            "--metrics-port": ([], ["0", "99999", "x"]),
            "--gamma": ([], ["nan", "2", "-1"]),
            "--window-s": ([], ["0", "nan", "1e9"]),
            "--default-slots": ([], ["0", "1e9"]),
            "--slots-per-group": ([], ["0", "-5"]),
            "--port-file": ([], ["{dir}", "{missing}/p"]),
        },
    ),
    "softswitch": Spec(
        ["softswitch", "--p4runtime", "127.0.0.1:0"],
        {
            "--p4runtime": ([], ["nohost", "127.0.0.1:99999", "a b:1", ""]),
            "--device-id": ([], ["-1", str(2**64), "x"]),
            "--p4info": ([], [*PATH_JUNK, "{garbage}", "/dev/zero"]),
            "--interface": ([], ["600@x", "hsnosuch0"]),
            "--log-level": ([], ["x"]),
        },
    ),
    "simulate": Spec(
        ["simulate", "--plan", "{plan}", "--rate", "2", "--requests", "20"],
        {
            "--plan": ([], [*PATH_JUNK, "{garbage}", "{fifo_json}"]),
            "--rate": (["0.5"], ["0", "-1", "1e300", *NUMBER_JUNK]),
            "--requests": (["5"], ["0", "1e7", "x"]),
            "--workload": (["{trace}", "summarization"], ["nosuch", "{fifo_csv}", "{missing}"]),
            "--topology": (["fig2"], ["nosuch", "testbed"]),
            "--seed": (["3"], ["-1", "x"]),
            "--cv": (["2"], ["0", "1e6", "nan"]),
            "--json": (["{tmp}/r.json"], ["{dir}", "{missing}"]),
        },
        valid=6,
    ),
    "evaluate": Spec(
        ["evaluate", "--scenario", "testbed-chatbot", "--out", "{tmp}/eval", "--quiet"],
        {
            "--scenario": ([], ["nosuch", ""]),
            "--out": ([], ["{bin}", "/proc/x/eval"]),
            "--workers": ([], ["0", "1000", "x"]),
            "--requests": ([], ["0", "-1", "1e12"]),
            "--servers": ([], ["0", "-16", "1e9"]),
            "--planners": ([], ["nosuch", "heroserve,nosuch"]),
            "--seed": ([], ["-1", "nan"]),
            "--journal": ([], ["{dir}", "{bin}", "/proc/x/j.db"]),
        },
    ),
    # The base names no engine: a profile run needs vLLM (tools/engines.sh), which CI lacks,
    # so every case is bad input, refused before any engine would start.
    "profile": Spec(
        ["profile", "--gpu-type", "H100", "--out", "{tmp}/p.json", "--engine-python", "{missing}"],
        {
            "--gpu-type": ([], ["nosuch", ""]),
            "--out": ([], ["{dir}", "{missing}", ""]),
            "--model": ([], ["nosuch", ""]),
            "--model-dir": ([], ["{bin}"]),
            "--batch-sizes": ([], ["0", "x", "-1", "1,,2"]),
            "--prompt-lengths": ([], ["0", "x", *NUMBER_JUNK]),
            "--decode-batches": ([], ["0", "x"]),
            "--contexts": ([], ["0", "x"]),
            "--decode-steps": ([], ["0", "x", "1e12"]),
            "--repeats": ([], ["0", "x"]),
            "--tp": ([], ["0", "x"]),
            "--timeout": ([], ["0", "nan", "x"]),
        },
    ),
    "fidelity": Spec(
        ["fidelity", "--out", "{tmp}/f.md", "--quiet", "--quick"],
        {
            "--out": ([], ["{dir}", "{missing}", "/proc/x/f.md"]),
            "--servers": ([], ["0", "15", "1201", "x", "nan"]),
            "--workers": ([], ["0", "1000", "x"]),
            "--sim-requests": ([], ["0", "-1", "1e12", "x"]),
            "--requests": ([], ["0", "-1", "1e12", "x", "nan"]),
            "--section": ([], ["nosuch", ""]),
            "--journal": ([], ["{dir}", "{bin}", "/proc/x/j.db"]),
        },
    ),
    "compare": Spec(
        [
            "compare",
            "--topology",
            "fig2",
            "--model",
            "OPT-13B",
            "--planners",
            "heroserve",
            "--no-sim",
            "--quiet",
        ],  # fmt: skip
        {
            "--topology": ([], ["nosuch", "{fifo_json}"]),
            "--model": (["LLaMA-3-8B"], ["nosuch"]),
            "--planners": (["heroserve,distserve"], ["nosuch", "", "heroserve,,x"]),
            "--seed": (["2"], ["-1", "x"]),
            "--requests": ([], ["0", "1e9"]),
            "--lives": ([], ["0", "x"]),
            "--steps": ([], ["0", "x"]),
            "--json": (["{tmp}/c.json"], ["{dir}", "{missing}"]),
            "--time-limit": ([], ["0", "nan"]),
        },
        valid=4,
    ),
}


@dataclass
class Case:
    sub: str
    seed: int
    argv: list[str]
    valid: bool
    did: list[str] = field(default_factory=list)

    def name(self) -> str:
        return f"seed {self.sub}-{self.seed} ({'; '.join(self.did) or 'base'}): {self.argv!r}"


def make_case(sub: str, k: int, env: dict[str, str], spec: Spec | None = None) -> Case:
    """Case ``k`` of ``sub``: the base with one to three options changed (good values only
    for the first ``valid`` cases), or ``--help`` (case ``valid``). ``spec``: another set of
    options than ``SPECS[sub]`` (test_cli_fuzz_options.py's, named ``sub``)."""
    spec = spec or SPECS[sub]
    rng = random.Random(f"{sub}-{k}")
    argv = list(spec.base)
    case = Case(sub, k, argv, valid=k <= spec.valid)
    if k == spec.valid:
        argv.append("--help")
        case.did.append("--help")
    else:
        usable = [f for f, (good, bad) in spec.options.items() if (good if case.valid else bad)]
        flags = rng.sample(usable, min(len(usable), rng.randint(1, 3)))
        for i, flag in enumerate(flags):
            good, bad = spec.options[flag]
            # the first change of a bad case is bad; the others either
            pool = good if case.valid else bad if i == 0 or not good else rng.choice([good, bad])
            value = rng.choice(pool)
            case.did.append(f"{flag} {value!r}")
            if flag.startswith("@"):
                argv[int(flag[1:])] = value
            else:
                argv += [flag, value]
        if not case.valid and rng.random() < 0.15:  # what argparse itself must refuse
            extra = rng.choice([["--no-such-option"], ["--no-such-option", "1"], [flags[0]]])
            argv += extra
            case.did.append(f"then {extra!r}")
    tmp = Path(env["root"]) / f"{sub}-{k}"
    tmp.mkdir()
    values = {**env, "tmp": str(tmp), "node": f"n{k}"}
    case.argv = [a.format(**values) if "{" in a and "}" in a else a for a in argv]
    return case


def import_every_module() -> None:
    """Import what the commands import lazily, once, outside any case's deadline: on a
    loaded machine the first import of a command's modules alone can take over 10 s, which
    is not the command's answer to its input."""
    import controller

    for m in pkgutil.walk_packages(controller.__path__, "controller."):
        if not m.name.endswith("__main__"):  # those run the command
            importlib.import_module(m.name)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Files the cases name, a CA, and a live controller for ``admin``."""
    import_every_module()
    d = tmp_path_factory.mktemp("clifuzz")
    for name in ("x.fifo", "x.json.fifo", "fifo.json", "fifo.csv"):
        os.mkfifo(d / name)
    (d / "dir").mkdir()
    (d / "bin.json").write_bytes(bytes(range(256)) * 4)
    (d / "garbage.json").write_text('{"a": [1, 2')
    (d / "trace.csv").write_text("input_tokens,output_tokens\n100,20\n300,40\n50,5\n")
    plan = d / "plan.json"
    assert main(["plan", "--topology", "fig2", "--model", "OPT-13B", "--planner", "heroserve",
                 "--quiet", "--json", str(plan)]) == 0  # fmt: skip
    topo = d / "fig2.json"
    with open(topo, "w") as f, pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", f)
        assert main(["topology", "export", "fig2"]) == 0
    unknown = d / "unknown-model.json"  # export refuses it: so must validate
    unknown.write_text(json.dumps({**json.loads(plan.read_text()), "model": "NoSuch-1B"}))
    sample = d / "sample.json"
    sample_plan().save(sample)
    sample_topo = save_sample_topology(d / "sample-topology.json")
    assert main(["pki", "init", str(d / "ca")]) == 0
    srv = ThreadedServer(ControllerServer(Store(str(d / "admin.db"))))  # state only
    try:
        yield {
            "root": str(d / "cases"), "missing": str(d / "missing" / "x.json"),
            "fifo": str(d / "x.fifo"), "fifo_json": str(d / "fifo.json"),
            "fifo_csv": str(d / "fifo.csv"), "dir": str(d / "dir"), "bin": str(d / "bin.json"),
            "garbage": str(d / "garbage.json"), "trace": str(d / "trace.csv"),
            "plan": str(plan), "topo": str(topo), "sample_plan": str(sample),
            "unknown_model_plan": str(unknown),
            "sample_topo": str(sample_topo), "ca": str(d / "ca"),
            "addr": f"127.0.0.1:{srv.port}",
        }  # fmt: skip
    finally:
        srv.stop()


def test_every_subcommand_is_fuzzed() -> None:
    assert sorted(SPECS) == sorted(SUBCOMMANDS)
    total = sum(s.cases for s in SPECS.values())
    assert total >= 400, total


@pytest.mark.parametrize("sub", [s for s in SUBCOMMANDS if s != "softswitch"])
def test_fuzzed_command_lines(sub: str, env: dict[str, str]) -> None:
    Path(env["root"]).mkdir(exist_ok=True)
    failures, outcomes = [], set()
    for k in range(SPECS[sub].cases):
        case = make_case(sub, k, env)
        rc, err = run_captured(main, case.argv)
        why = judge(rc, err, case.valid, f"heroserve {sub}")
        if why:
            failures.append(f"{case.name()}: {why}")
        outcomes.add(rc)
    assert not failures, f"{len(failures)} failures, first:\n" + "\n".join(failures[:5])
    assert 2 in outcomes  # bad cases were made, and refused


def test_fuzzed_softswitch_command_lines(env: dict[str, str]) -> None:
    """In one child process (the pure-Python protobuf runtime the switch needs)."""
    Path(env["root"]).mkdir(exist_ok=True)
    cases = [make_case("softswitch", k, env) for k in range(SPECS["softswitch"].cases)]
    child_env = dict(
        os.environ,
        PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
    )
    r = subprocess.run(
        [sys.executable, "-m", "support.fuzz"],
        input=json.dumps([c.argv for c in cases]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env,
        timeout=60 + 30 * len(cases),  # a hang guard: each case has deadlines of its own
    )
    assert r.returncode == 0, r.stderr[-3000:]
    failures = []
    for case, (rc, err) in zip(cases, json.loads(r.stdout), strict=True):
        why = judge(rc, err, case.valid, "heroserve softswitch")
        if why:
            failures.append(f"{case.name()}: {why}")
    assert not failures, f"{len(failures)} failures, first:\n" + "\n".join(failures[:5])
