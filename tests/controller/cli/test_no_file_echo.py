"""No command opens a file a plan names, and no error message quotes a file's content
(docs/inputs.md, "What a message shows"): a stand-in for /etc/shadow holding a marker is
named by a plan (``export``, ``controller --plan``, ``simulate``) or given on the command
line in every form a reader accepts; each time one line, exit status 2, and no marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main
from controller.service.sample import sample_plan, save_sample_topology

MARK = "SECRET-MARKER-4f2a"
# root's hash line first: the old readers quoted a file's first line or key
SHADOW = f"root:$6${MARK}$hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"


def _refused(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert MARK not in err + cap.out and "$6$" not in err + cap.out, err
    return err


def _plan_naming(tmp_path: Path, **fields: str) -> Path:
    d = json.loads(sample_plan().to_json())
    d.update(fields)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("name", ["shadow", "shadow.yaml", "shadow.json"])
def test_a_plan_naming_a_file_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture, name: str
) -> None:
    secret = tmp_path / name
    secret.write_text(SHADOW)
    plan = _plan_naming(tmp_path, topology=str(secret))
    out = tmp_path / "out"
    err = _refused(
        capsys, ["export", "--plan", str(plan), "--format", "deployment", "--out", str(out)]
    )
    assert "the plan's topology names a file" in err and "--topology" in err
    assert not out.exists()
    err = _refused(capsys, ["controller", "--plan", str(plan), "--db", str(tmp_path / "c.db")])
    assert "the plan's topology names a file" in err


def test_a_plan_naming_a_trace_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    secret = tmp_path / "shadow.csv"
    secret.write_text(SHADOW)
    topo = save_sample_topology(tmp_path / "sample.yaml")
    plan = _plan_naming(tmp_path, workload=str(secret))
    argv = ["simulate", "--plan", str(plan), "--topology", str(topo), "--rate", "1"]
    err = _refused(capsys, argv)
    assert "the plan's workload is not a generator" in err and "--workload" in err


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("shadow", SHADOW),  # a YAML scalar: "must be a mapping ..., got <the line>" before
        ("shadow.json", SHADOW),  # not JSON
        ("keys.yaml", f"{MARK}: 1\nlinks: []\n"),  # an unknown key: quoted before
        ("keys.json", json.dumps({MARK: 1, "links": []})),
        ("dup.yaml", f"{MARK}: 1\n{MARK}: 2\n"),  # a duplicate key: quoted before
        ("dup.json", f'{{"{MARK}": 1, "{MARK}": 2}}'),
        ("bad.yaml", f"links: [{MARK}\n  - : {MARK} : [\n"),  # PyYAML's snippet
        ("alias.yaml", f"a: &{MARK} [1]\nb: *{MARK}\n"),  # the anchor's name: quoted before
        ("tag.yaml", f"links: !{MARK} x\n"),  # PyYAML quotes the tag
        ("id.yaml", f"links: [{{a: '{MARK}/x', b: y, gbps: 1}}]\n"),  # not an id: quoted before
        ("kind.yaml", f"links: [{{a: x, b: y, gbps: 1, link: {MARK}}}]\n"),  # not a choice
    ],
)
def test_a_topology_file_is_never_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture, name: str, text: str
) -> None:
    secret = tmp_path / name
    secret.write_text(text)
    _refused(capsys, ["plan", "--topology", str(secret)])
    _refused(capsys, ["validate", str(secret), "--as", "topology"])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("shadow.csv", SHADOW),  # the header: quoted as a column name before
        ("cell.csv", f"input_tokens,output_tokens\n{MARK},4\n"),  # a cell: quoted before
        ("keys.json", json.dumps([{"input_tokens": 1, "output_tokens": 1, MARK: 1}])),
        ("turn.json", json.dumps([{"conversations": [{"from": MARK, "value": 5}]}])),
    ],
)
def test_a_trace_file_is_never_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture, name: str, text: str
) -> None:
    secret = tmp_path / name
    secret.write_text(text)
    _refused(capsys, ["validate", str(secret), "--as", "trace"])


@pytest.mark.parametrize(
    "text",
    [
        SHADOW,
        json.dumps({MARK: 1}),  # an unknown key of a plan
        json.dumps({**json.loads(sample_plan().to_json()), "notes": MARK}),  # a string, not a list
        json.dumps({**json.loads(sample_plan().to_json()), "options": {MARK: [[[[[[[[[1]]]]]]]]]}}),
    ],
)
def test_a_plan_file_is_never_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str
) -> None:
    secret = tmp_path / "plan.json"
    secret.write_text(text)
    _refused(capsys, ["validate", str(secret), "--as", "plan"])
    _refused(capsys, ["controller", "--plan", str(secret), "--db", str(tmp_path / "c.db")])
