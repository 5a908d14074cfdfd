"""`heroserve plan` as a user runs it, including bad input (exit 2, one line, no traceback)."""

import json
import subprocess
import sys

import pytest

from controller.cli import main


def test_default_plan_prints_every_planner_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("heroserve", "distserve", "ds-atp", "ds-switchml"):
        assert name in text
    assert "why" in text
    d = json.loads(out.read_text())
    assert d["planner"] == "heroserve"
    for phase in ("prefill", "decode"):
        p = d[phase]
        assert {"tp", "pp", "instances", "groups"} <= set(p)
        for gr in p["groups"]:
            assert {"gpus", "scheme", "switch", "paths"} <= set(gr)
            assert gr["scheme"] in ("ina", "ring")
    assert {"ttft_s", "tpot_s", "kv_transfer_s", "rate_per_gpu"} <= set(d["predicted"])
    assert "kv_transfer" in d
    assert (tmp_path / "plan.distserve.json").exists()


def test_time_limit_and_idle_gpus_in_the_output(tmp_path, capsys):
    """A spent time limit marks the planner's row and the JSON; the GPUs the plan leaves out
    are listed with why, as many as the cluster's 16 less those the plan uses."""
    out = tmp_path / "plan.json"
    argv = ["plan", "--planner", "heroserve", "--gpus", "12", "--planner-time-limit", "1e-9"]
    assert main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "heroserve (time limit)" in text
    assert "heroserve: time limit reached, the best plan found by then" in text
    d = json.loads(out.read_text())
    assert d["time_limit_reached"] is True
    idle = 16 - d["predicted"]["gpus_used"]
    assert idle > 0 and sum(e["gpus"] for e in d["idle"]) == idle
    for e in d["idle"]:
        assert f"heroserve: {e['gpus']} {e['role']} GPU(s) idle: {e['reason']}" in text


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


TOPO = """
servers:
  - {id: a, gpu_type: A100-40GB, gpus: 2, role: prefill}
  - {id: b, gpu_type: A100-40GB, gpus: 2, role: decode}
switches:
  - {id: sw, tier: access}
links:
%s
"""


def _links(extra=""):
    rows = [
        f"  - {{a: {s}-gpu{i}, b: sw, link: ethernet, gbps: 100}}" for s in "ab" for i in range(2)
    ]
    return TOPO % ("\n".join(rows) + extra)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "{bad_edge}"], "unknown node 'ghost'"),
        (["--topology", "{negative}"], "must be positive"),
        (["--topology", "{disconnected}"], "is disconnected"),
        (["--model", "OPT-175B"], "does not fit"),
        (["--topology", "nowhere.yaml"], "does not exist"),
        (["--model", "GPT-5"], "unknown model"),
        (["--planner", "magic"], "unknown planner"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    files = {
        "{bad_edge}": _write(tmp_path, "a.yaml", _links("\n  - {a: ghost, b: sw, gbps: 100}")),
        "{negative}": _write(tmp_path, "b.yaml", _links().replace("gbps: 100}", "gbps: -100}", 1)),
        "{disconnected}": _write(
            tmp_path,
            "c.yaml",
            _links().replace("servers:", "servers:\n  - {id: c, gpu_type: T4, gpus: 1}"),
        ),
    }
    args = [files.get(x, x) for x in args]
    assert main(["plan", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_the_installed_command_answers_bad_input_in_one_line(tmp_path):
    """A spot check through a real process (the rest run in-process: a process start costs
    several seconds on a busy 2-core machine)."""
    bad = _write(tmp_path, "a.yaml", _links("\n  - {a: ghost, b: sw, gbps: 100}"))
    r = subprocess.run(
        [sys.executable, "-m", "controller.cli", "plan", "--quiet", "--topology", bad],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"heroserve plan: error: {bad}: links[4].a: unknown node 'ghost'\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], "argument --seed: must be non-negative, got -1"),
        (["--seed", "4294967296"], "argument --seed: must be at most 4294967295"),
        (["--json", "{missing}/p.json"], "argument --json: directory '{missing}' does not exist"),
        (["--json", "{tmp}"], "argument --json: '{tmp}' is a directory, not a file"),
        (["--sla-ttft", "nan"], "argument --sla-ttft: must be a finite number, got nan"),
        (["--sla-tpot", "inf"], "argument --sla-tpot: must be a finite number, got inf"),
        (["--sla-tpot", "0"], "argument --sla-tpot: must be positive, got 0"),
        (["--planner-time-limit", "0"], "argument --planner-time-limit: must be positive, got 0"),
        (["--max-candi", "0.5"], "argument --max-candi: must be an integer, got 0.5"),
        (["--prefill-par", "4096x1"], "TP and PP must be in 1..1024"),
        (["--topology", "{typo}"], "links[0]: key 5: unknown key (did you mean latency_us?)"),
        (["--workload", "{nan_trace}"], "line 2: arrival_s: must be a finite number, got nan"),
    ],
)
def test_bad_arguments_exit_2_in_one_line_before_any_planning(tmp_path, capsys, args, message):
    subs = {
        "{missing}": str(tmp_path / "missing"),
        "{tmp}": str(tmp_path),
        "{typo}": _write(
            tmp_path, "t.yaml", _links().replace("gbps: 100}", "gbps: 100, latncy_us: 3}", 1)
        ),
        "{nan_trace}": _write(tmp_path, "w.csv", "input_tokens,output_tokens,arrival_s\n3,4,nan\n"),
    }

    def sub(x: str) -> str:
        for k, v in subs.items():
            x = x.replace(k, v)
        return x

    assert main(["plan", "--quiet", "--planner", "heroserve", *map(sub, args)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and sub(message) in err, err


def test_validate_names_what_it_read(tmp_path, capsys):
    topo = _write(tmp_path, "t.yaml", _links())
    assert main(["validate", topo]) == 0
    # two 2-GPU A100 servers on the 4-GPU board (a mesh: one pair link each, no fabric
    # node), one switch: 5 nodes, 4 Ethernet and 2 NVLink links
    assert capsys.readouterr().out == f"{topo}: valid topology (4 GPUs, 5 nodes, 6 links)\n"
    plan = tmp_path / "p.json"
    assert main(["plan", "--quiet", "--planner", "heroserve", "--model", "OPT-13B",
                 "--topology", topo, "--json", str(plan)]) == 0  # fmt: skip
    capsys.readouterr()
    # the plan names its cluster "t" (the file's name), which only the file resolves
    assert main(["validate", str(plan)]) == 2
    assert "the plan's topology is not a built-in" in capsys.readouterr().err
    assert main(["validate", str(plan), "--topology", topo]) == 0
    out = capsys.readouterr().out
    p = json.loads(plan.read_text())  # what the planner chose is the planner's business
    n = sum(len(s) for ph in ("prefill", "decode") for i in p[ph]["instances"] for s in i["stages"])
    assert out.startswith(f"{plan}: valid plan by heroserve ({n} GPUs, prefill ")
    assert out.endswith("fits topology t\n")
    trace = _write(tmp_path, "w.csv", "input_tokens,output_tokens\n3,4\n5,6\n")
    assert main(["validate", trace]) == 0
    assert (
        "valid trace (2 requests, mean input 4.0 and output 5.0 tokens" in capsys.readouterr().out
    )
    # the same plan against a cluster without its GPUs
    assert main(["validate", str(plan), "--topology", "fig2"]) == 2
    assert "GPU 'a-gpu0' is not in topology 'fig2'" in capsys.readouterr().err
