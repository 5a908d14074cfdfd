"""docs/emulation.md's example as written, without root: docs/topology.md's YAML (with A100s
on both servers) given by a relative path and carrying ``role:`` keys, and the one line that
says why a measured INA/ring ratio is far from the prediction."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import networkx as nx
import pytest
from support import ROOT

from controller.cli.emulate import _set_roles_aside, start_cluster
from controller.emulate.plans import check_plan, emulation_plan
from controller.emulate.predict import ratio_note
from controller.emulate.spec import network_spec
from controller.errors import InputError
from controller.inputs.plan_checks import check_plan_on_topology
from controller.topology import resolve_topology
from controller.topology.io import load_topology


@pytest.fixture
def docs_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """docs/topology.md's example, V100s made A100s as docs/emulation.md says, written as
    my.yaml in the working directory: the path the docs give is relative."""
    text = (ROOT / "docs" / "topology.md").read_text()
    yaml = text.split("```yaml\n", 1)[1].split("```", 1)[0].replace("V100-32GB", "A100-40GB")
    (tmp_path / "my.yaml").write_text(yaml)
    monkeypatch.chdir(tmp_path)
    return "my.yaml"


def test_roles_are_set_aside_for_the_made_plan(docs_yaml: str) -> None:
    g = resolve_topology(docs_yaml)
    with pytest.raises(InputError, match="reserved for decode"):  # what the docs' run hit
        check_plan_on_topology(emulation_plan(g), g)
    notes = _set_roles_aside(g)
    assert notes == [
        "roles set aside for the made plan (it measures collectives, not serving): "
        "decode: srv1; prefill: srv0"
    ]
    plan = emulation_plan(g)
    check_plan_on_topology(plan, g)
    check_plan(plan, g, network_spec(g, 1000.0, tag="hdoc"))
    assert _set_roles_aside(g) == []  # nothing left to set aside, nothing said


def test_the_controller_gets_the_loaded_graph_by_an_absolute_path(docs_yaml: str) -> None:
    """The controller runs in the repository's root: it is given the graph this process
    loaded (roles set aside), written into the run's work dir, never the relative path."""
    g = resolve_topology(docs_yaml)
    _set_roles_aside(g)
    a = argparse.Namespace(topology=docs_yaml, switch="model", keep_logs=False, seed=1)
    c = start_cluster(a, g, network_spec(g, 1000.0, tag="hdoc"), emulation_plan(g))
    try:
        path = Path(c.topology)
        assert path.is_absolute() and path.parent == c.workdir
        assert nx.utils.graphs_equal(load_topology(path), g)
        assert {d.get("role", "any") for _, d in load_topology(path).nodes(data=True)} == {"any"}
    finally:
        shutil.rmtree(c.workdir)


def test_ratio_far_from_the_prediction_says_why() -> None:
    """The docs' run: 2 members on s1 by 100 Gb/s links, 64 KB, INA 673.2 ms and ring 28.6 ms
    measured against 30.3 and 49.8 ms predicted. s1 took in 2 x 512 packets of 128 bytes in
    0.6732 s = 1,521/s; each link carries 100e9 / 8 / 1000 / 186 = 67,204 INA frames/s (186:
    Ethernet 14 + IPv4 20 + UDP 8 + INA header 16 + 128 lanes), 134,409 for both."""
    g = resolve_topology("testbed")
    grp = argparse.Namespace(gpus=["srv0-gpu0", "srv1-gpu0"], switch="s1", rails=[])
    note = ratio_note(grp, "ina", 65536, (0.6732, 0.0286), (0.0303, 0.0498), g, 1000.0, "model")
    assert note is not None
    assert note.startswith("INA/ring measured 23.54 against 0.61 predicted (38.7x apart): ")
    assert "a Python interpreter, not a line-rate ASIC" in note
    assert "s1 took in 1,521 INA packets/s where its 2 member links carry 134,409 frames/s" in note
    close = ratio_note(grp, "ina", 65536, (0.06, 0.05), (0.03, 0.05), g, 1000.0, "model")
    assert close is None  # 1.2 against 0.6: within 2x, nothing to explain
