"""``--config FILE.yaml`` of plan, compare, evaluate and fidelity (docs/inputs.md,
"Configuration files"): the keys are the flags' dests, checked by the flags' own checks; the
command line overrides the file; bad files refused in one line naming the key, never echoed;
the page lists every key."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from support import ROOT

from controller.cli import build_parser, config_keys_markdown, main
from controller.cli.configfile import (
    COMMANDS,
    MAX_CONFIG_BYTES,
    keys,
    parse_with_config,
)


def _parse(command: str, *argv: str) -> argparse.Namespace:
    top = build_parser([command])
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return parse_with_config(top, subs.choices[command], [command, *argv])


def _file(tmp_path: Path, text: str) -> str:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    return str(f)


def test_the_file_sets_options_and_the_command_line_wins(tmp_path: Path) -> None:
    f = _file(tmp_path, "topology: 2tracks\nservers: 96\nseed: 7\nquiet: true\n"
              "cost_mode: paper\nprice: ['A100=2.5', 'V100=1']\n")  # fmt: skip
    a = _parse("plan", "--config", f)
    assert (a.topology, a.servers, a.seed, a.quiet, a.cost_mode) == (
        "2tracks",
        96,
        7,
        True,
        "paper",
    )
    assert a.price == [("A100", 2.5), ("V100", 1.0)]  # the flag's own parser ran
    b = _parse("plan", "--seed", "3", f"--config={f}", "--price", "L40S=1")
    assert (b.seed, b.servers) == (3, 96)
    assert b.price == [("L40S", 1.0)]  # a repeatable flag replaces the file's list
    # an option the file does not name keeps its default
    assert _parse("plan", "--config", f).workload == _parse("plan").workload == "chatbot"


def test_a_required_flag_may_come_from_the_file(tmp_path: Path) -> None:
    f = _file(tmp_path, "scenario: testbed-chatbot\nfast: true\n")
    a = _parse("evaluate", "--config", f)
    assert (a.scenario, a.fast) == ("testbed-chatbot", True)


def test_fidelity_plain_argparse_options_too(tmp_path: Path) -> None:
    f = _file(tmp_path, "servers: 96\nquick: true\nsection: ablation\n")
    a = _parse("fidelity", "--config", f, "--servers", "48")
    assert (a.servers, a.quick, a.section) == (48, True, "ablation")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("bogus_key: 1\n", "unknown key 'bogus_key'"),
        ("servers: 5000\n", "key 'servers': must be at most 1200"),
        ("servers: true\n", "key 'servers': a bool where an integer is expected"),
        ("servers: [1, 2]\n", "key 'servers': a list where an integer is expected"),
        ("quick: 'yes'\n", "key 'quick': true or false expected"),
        ("section: everything\n", "key 'section': not one of ablation"),
        ("sim_requests: 0.5\n", "key 'sim_requests': must be an integer"),
        ("- servers\n", "a mapping of option names to values expected"),
        ("servers: [\n", "is not valid YAML (line 2, column 1)"),
    ],
)
def test_bad_files_are_refused_in_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    assert (
        main(["fidelity", "--config", _file(tmp_path, text), "--out", str(tmp_path / "f.md")]) == 2
    )
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1, err


def test_a_file_is_bounded_and_never_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "hunter2-PRIVATE"
    for text in (f"{secret}: 1\n", f"root:{secret}:0\n", f"servers: '{secret}'\n",
                 f"x: [{secret}\n", f"seed: 1\n# {'x' * MAX_CONFIG_BYTES}\n"):  # fmt: skip
        assert main(["plan", "--config", _file(tmp_path, text)]) == 2
        err = capsys.readouterr().err
        assert secret not in err and len(err.splitlines()) == 1, err
    assert "larger than" in err
    assert main(["plan", "--config", str(tmp_path)]) == 2  # a folder
    assert "not a regular file" in capsys.readouterr().err


def test_every_key_is_a_dest_and_docs_list_them_all() -> None:
    doc = (ROOT / "docs" / "inputs.md").read_text()
    block = re.search(r"<!-- config-keys:begin -->\n(.*)<!-- config-keys:end -->", doc, re.S)
    assert block, "docs/inputs.md lacks the config-keys block"
    assert block.group(1) == config_keys_markdown()  # the page's list is generated
    top = build_parser(COMMANDS)
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        ks = keys(subs.choices[name])
        assert "config" not in ks and "help" not in ks
        for k in ks:
            assert f"| `{k}` |" in block.group(1)


def test_plan_runs_from_a_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    f = _file(tmp_path, f"quiet: true\njson: '{out}'\nprefill_par: 1x4\ndecode_par: 4x2\n")
    assert main(["plan", "--config", f]) == 0
    assert '"planner": "heroserve"' in out.read_text()
