"""Every YAML and JSON example in the docs is read by the program's own reader and, when it is
a topology, plan or trace, checked by its validator; the limits the docs
state are the code's."""

import re
from pathlib import Path

import pytest
from support import ROOT
from support.docs import examples

import controller.inputs.limits as limits
from controller.inputs.documents import parse_document
from controller.inputs.plan_checks import validate_plan_dict
from controller.models.profile import FORMAT as PROFILE_FORMAT
from controller.models.profile import profile_from_doc
from controller.topology import topology_from_dict
from controller.workload.traces import load_trace, trace_rows


def check(where: str, lang: str, text: str, tmp: Path | None = None) -> str:
    """Read an example as the program reads a file; returns what it was checked as."""
    if lang == "csv":  # the trace loader reads CSV only from files
        path = tmp / "example.csv"
        path.write_text(text)
        load_trace(path)
        return "trace"
    command = re.match(r"# heroserve (\w+) --config ", text)
    if command:  # a configuration file: read as that command reads its --config
        return check_config(command.group(1), text, tmp)
    doc = parse_document(text, where, yaml_ok=lang != "json")
    if isinstance(doc, dict) and "links" in doc:
        topology_from_dict(doc, where)
        return "topology"
    if isinstance(doc, dict) and doc.get("format") == PROFILE_FORMAT:
        profile_from_doc(doc, where)
        return "profile"
    if isinstance(doc, dict) and {"planner", "prefill", "decode"} & set(doc):
        validate_plan_dict(doc, where)
        return "plan"
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        trace_rows(doc, where)
        return "trace"
    return "parsed"


def check_config(command: str, text: str, tmp: Path | None) -> str:
    import argparse

    from controller.cli import build_parser
    from controller.cli.configfile import load

    assert tmp is not None, "a configuration example is read from a file"
    path = tmp / "config.yaml"
    path.write_text(text)
    top = build_parser([command])
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert load(str(path), subs.choices[command])
    return "config"


@pytest.mark.parametrize(("where", "lang", "text"), examples(), ids=lambda x: str(x)[:40])
def test_every_docs_example_reads(tmp_path, where, lang, text):
    check(where, lang, text, tmp_path)


def test_the_topology_page_examples_are_checked_as_topologies():
    """Today's docs/topology.md example failed ("GPU 'srv1-gpu0' is disconnected")."""
    kinds = [check(*e) for e in examples() if e[0].startswith("docs/topology.md")]
    assert kinds == ["topology", "topology"]


def test_the_inputs_page_shows_every_trace_format(tmp_path):
    kinds = [check(*e, tmp_path) for e in examples() if e[0].startswith("docs/inputs.md")]
    assert kinds == ["trace", "trace", "trace", "config"]


def test_a_docs_example_with_a_typo_is_caught():
    where, lang, text = next(e for e in examples() if e[0].startswith("docs/topology.md"))
    with pytest.raises(Exception, match=r"key \d+: unknown key \(did you mean latency_us\?\)"):
        check(where, lang, text.replace("latency_us", "latncy_us", 1))


ROW = re.compile(r"^\|[^|]*\|\s*([0-9][0-9,.]*)[^|]*\|\s*`(MAX_[A-Z_]+)`\s*\|\s*$", re.M)


@pytest.mark.parametrize("page", ["docs/topology.md", "docs/inputs.md"])
def test_the_limits_the_docs_state_are_the_codes(page):
    rows = ROW.findall((ROOT / page).read_text())
    assert len(rows) >= 14
    for value, name in rows:
        assert float(value.replace(",", "")) == getattr(limits, name), name
