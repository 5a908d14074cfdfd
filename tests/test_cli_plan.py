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
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
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
    r = subprocess.run(
        [sys.executable, "-m", "controller.cli", "plan", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
