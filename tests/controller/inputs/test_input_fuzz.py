"""Fuzz test of topology, plan and trace files.

Seeded mutations of the shipped examples (every docs example, built-in topologies exported
to files, plans the planner writes) go through the real CLI entry points in-process
(``heroserve validate``, and for mutants that still validate, ``simulate``); a few go through
the installed ``heroserve`` command. Every run must end with exit 0 or 2, a one-line error
for 2, no traceback and no run over 10 s. A failure names the seed to replay it.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.docs import examples
from support.fuzz import HANG_S, deadline

from controller.cli import main
from controller.models import model_spec
from controller.planner import BASELINES, plan
from controller.service.sample import sample_plan, save_sample_topology
from controller.topology import fig2, topology_to_dict
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla

HOSTILE: list[Any] = [
    None, True, False, "", "x" * 5000, "a/b|c", "../../etc/passwd", -1, 0, 0.5, -0.0,
    1e300, -1e300, math.nan, math.inf, -math.inf, 10**7, 2**63, 10**40, [], {}, [[[[[[1]]]]]],
    {"nested": {"deeper": [1, 2]}}, list(range(2000)),
]  # fmt: skip


# -- mutations ---------------------------------------------------------------------------
def _containers(doc: Any) -> list[Any]:
    out, stack = [], [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict | list):
            out.append(x)
            stack.extend(x.values() if isinstance(x, dict) else x)
    return out


def _typo(key: str, rng: random.Random) -> str:
    if len(key) < 2:
        return key + "x"
    i = rng.randrange(len(key) - 1)
    return rng.choice([key[:i] + key[i + 1] + key[i] + key[i + 2 :], key[:i] + key[i + 1 :]])


def mutate_doc(doc: Any, rng: random.Random) -> str:
    """One structural mutation in place; returns what it did."""
    pool = [c for c in _containers(doc) if c]
    if not pool:
        return "nothing to mutate"
    c = rng.choice(pool)
    if isinstance(c, dict):
        k = rng.choice(list(c))
        op = rng.choice(["delete", "typo", "hostile", "hostile", "swap", "scale"])
        if op == "delete":
            del c[k]
        elif op == "typo":
            c[_typo(k, rng)] = c.pop(k)
        elif op == "hostile":
            c[k] = copy.deepcopy(rng.choice(HOSTILE))
        elif op == "swap":
            others = [o for o in _containers(doc) if isinstance(o, dict) and k in o and o is not c]
            if others:
                o = rng.choice(others)
                c[k], o[k] = o[k], c[k]
        elif isinstance(c[k], int | float) and not isinstance(c[k], bool):
            c[k] = c[k] * rng.choice([-1, 0, 10**6, 1e-9]) + rng.choice([0, 1, 0.5])
        return f"{op} {k!r}"
    i = rng.randrange(len(c))
    op = rng.choice(["duplicate", "drop", "hostile", "reverse"])
    if op == "duplicate":
        c.insert(rng.randrange(len(c) + 1), copy.deepcopy(c[i]))
    elif op == "drop":
        del c[i]
    elif op == "hostile":
        c[i] = copy.deepcopy(rng.choice(HOSTILE))
    else:
        c.reverse()
    return f"{op} item {i}"


def mutate_text(text: str, rng: random.Random) -> str:
    op = rng.choice(["truncate", "flip", "insert", "nest", "alias", "dupkey", "bytes"])
    n = len(text)
    at = rng.randrange(n + 1)
    if op == "truncate":
        return text[:at]
    if op == "flip":
        chars = list(text)
        for _ in range(rng.randint(1, 5)):
            if chars:
                chars[rng.randrange(len(chars))] = chr(rng.choice([0, 7, 34, 44, 58, 91, 123, 255]))
        return "".join(chars)
    if op == "insert":
        return (
            text[:at] + rng.choice(['"', "{", "]", ",", ": ", "\n- ", "\ufeff", "\\"]) + text[at:]
        )
    if op == "nest":
        return text[:at] + "[" * 50_000 + text[at:]
    if op == "bytes":  # a lone surrogate: written as bytes that are not UTF-8
        return text[:at] + "\udcff" + text[at:]
    if op == "alias":
        return "x: &x [1, 2]\n" + text.replace(": ", ": *x #", 1)
    return text[:at] + '"id": 1, "id": 2, ' + text[at:]


def dump(doc: Any, fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(doc, default_flow_style=None, allow_unicode=True)
    if fmt == "csv":
        rows = doc if isinstance(doc, list) else [doc]
        keys: list[str] = []
        for r in rows:
            for k in r if isinstance(r, dict) else ():
                if k not in keys:
                    keys.append(k)
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(keys)
        for r in rows:
            w.writerow([r.get(k, "") if isinstance(r, dict) else r for k in keys])
        return out.getvalue()
    return json.dumps(doc)  # NaN and Infinity come out as the non-standard literals


def mutant(seed_doc: Any, fmt: str, rng: random.Random) -> tuple[str, str]:
    doc = copy.deepcopy(seed_doc)
    did = [mutate_doc(doc, rng) for _ in range(rng.randint(1, 3))]
    text = dump(doc, fmt)
    if rng.random() < 0.25:
        text = mutate_text(text, rng)
        did.append("text")
    return text, ", ".join(did)


# -- seeds -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("seeds")
    topologies = [
        (
            yaml.safe_load(t) if lang != "json" else json.loads(t),
            "yaml" if lang != "json" else "json",
        )
        for _, lang, t in examples()
        if lang != "csv" and "links" in t
    ]
    topologies += [(topology_to_dict(make_testbed()), "json"), (topology_to_dict(fig2()), "yaml")]
    g = make_testbed()
    args = (g, model_spec("OPT-66B"), chatbot(n=2000), default_sla("chatbot"))
    plans = [
        (json.loads(plan(*args, planner=n).to_json()), "testbed")
        for n in ["heroserve", *BASELINES[:1]]
    ]
    sample_topo = str(save_sample_topology(tmp / "sample.json", ina_groups=2, ring_groups=2))
    plans.append((json.loads(sample_plan(ina_groups=2, ring_groups=2).to_json()), sample_topo))
    traces = []
    for _, lang, t in examples():
        if lang == "csv":
            traces.append((list(csv.DictReader(io.StringIO(t))), "csv"))
        elif t.lstrip().startswith("["):
            traces.append((json.loads(t), "json"))
    assert len(topologies) >= 4 and len(plans) == 3 and len(traces) == 3
    return {"topology": topologies, "plan": plans, "trace": traces}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with deadline(HANG_S):
        rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def judge(rc: int, out: str, err: str) -> str | None:
    """What is wrong with one run, or None."""
    if "Traceback" in err or "Traceback" in out:
        return "traceback"
    if rc == 2:
        lines = err.splitlines()
        if len(lines) != 1 or ": error: " not in lines[0]:
            return f"exit 2 without a one-line error: {err[:300]!r}"
        return None
    return None if rc == 0 else f"exit {rc}"


CASES = {"topology": 420, "plan": 360, "trace": 260}  # 1,040 mutants


def case(kind: str, seed: int, seeds, tmp_path: Path) -> tuple[Path, list[str], str, str]:
    """Mutant ``seed`` of ``kind`` written to a file: (path, validate argv, what was done,
    the seed's format or, for a plan, its topology)."""
    rng = random.Random(f"{kind}-{seed}")
    doc, extra = rng.choice(seeds[kind])
    fmt = extra if kind != "plan" else "json"
    text, did = mutant(doc, fmt, rng)
    path = tmp_path / f"{kind}-{seed}.{fmt}"
    path.write_text(text, errors="surrogatepass")
    argv = ["validate", str(path), "--as", kind]
    return path, argv + (["--topology", extra] if kind == "plan" else []), did, extra


@pytest.mark.parametrize("kind", list(CASES))
def test_fuzzed_files_get_exit_0_or_2_and_one_line(kind, seeds, tmp_path, capsys):
    failures: list[str] = []
    valid: list[tuple[Path, str]] = []
    for seed in range(CASES[kind]):
        path, argv, did, extra = case(kind, seed, seeds, tmp_path)
        try:
            rc, out, err = run_cli(argv, capsys)
        except (Exception, SystemExit) as e:  # noqa: BLE001 (the test reports any escape)
            failures.append(f"seed {kind}-{seed} ({did}): {type(e).__name__}: {e}")
            continue
        why = judge(rc, out, err)
        if why:
            failures.append(f"seed {kind}-{seed} ({did}): {why}")
        elif rc == 0:
            valid.append((path, extra))
    # mutants that still validate must also run: a sample of them through simulate
    for path, extra in valid[:: max(1, len(valid) // 12)]:
        failures += simulate_one(kind, path, extra, seeds, tmp_path, capsys)
    assert not failures, f"{len(failures)} failures, first: " + "\n".join(failures[:5])
    assert len(valid) < CASES[kind]  # the mutations do break files (the test can fail)


def simulate_one(kind: str, path: Path, extra: str, seeds, tmp_path, capsys) -> list[str]:
    if kind == "topology":
        return []  # a valid topology's planning is the planner's tests' business
    if kind == "plan":
        if not extra.endswith("testbed"):
            return []  # sample plans have no model the simulator prices
        argv = ["simulate", "--plan", str(path), "--rate", "2", "--requests", "30"]
    else:
        plan_path = tmp_path / "seed-plan.json"
        if not plan_path.exists():
            plan_path.write_text(json.dumps(seeds["plan"][0][0]))
        argv = ["simulate", "--plan", str(plan_path), "--rate", "2", "--requests", "30",
                "--workload", str(path)]  # fmt: skip
    try:
        rc, out, err = run_cli(argv, capsys)
    except (Exception, SystemExit) as e:  # noqa: BLE001
        return [f"simulate {path.name}: {type(e).__name__}: {e}"]
    why = judge(rc, out, err)
    return [f"simulate {path.name}: {why}"] if why else []


def test_the_installed_command_gives_the_same_answers(seeds, tmp_path, capsys):
    """A few mutants through the real ``heroserve`` process: the same exit and line."""
    exe = Path(sys.executable).with_name("heroserve")
    for kind, seed in (("topology", 3), ("plan", 5), ("trace", 7)):
        _, argv, _, _ = case(kind, seed, seeds, tmp_path)
        rc, out, err = run_cli(argv, capsys)
        r = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=120)
        assert (r.returncode, r.stdout, r.stderr) == (rc, out, err)
        assert rc in (0, 2)
