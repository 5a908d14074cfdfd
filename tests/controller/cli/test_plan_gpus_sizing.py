"""`plan --gpus N` sizes a track cluster to what it plans (the fewest whole units holding N
GPUs, when `--servers` is not given) and refuses more GPUs than the cluster has."""

from __future__ import annotations

import json

import pytest

from controller.cli import main
from controller.cli.common import sized_topology


@pytest.mark.parametrize(
    ("topology", "servers", "gpus", "name"),
    [
        ("8tracks", None, 64, "8tracks-16"),  # one unit of 16 8-GPU servers: 128 GPUs
        ("8tracks", None, 128, "8tracks-16"),
        ("8tracks", None, 129, "8tracks-32"),
        ("2tracks", None, 49, "2tracks-12"),  # units of 6 servers, 48 GPUs each
        ("2tracks", None, 9600, "2tracks"),  # the paper's size keeps its name
        ("2tracks", None, 9599, "2tracks"),
        ("8tracks", 32, 64, "8tracks-32"),  # --servers wins
        ("8tracks", None, None, "8tracks"),
        ("testbed", None, 8, "testbed"),  # not a track cluster: as it is
    ],
)
def test_gpus_sizes_a_track_cluster(topology, servers, gpus, name) -> None:
    assert sized_topology(topology, servers, gpus) == name


def test_a_plan_for_64_gpus_of_8tracks_runs_on_one_unit(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    argv = ["plan", "--topology", "8tracks", "--gpus", "64", "--planner", "distserve"]
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["topology"] == "8tracks-16"
    assert d["predicted"]["gpus_used"] <= 64


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--topology", "testbed", "--gpus", "17"],
            "--gpus 17 is more than the 16 GPUs of testbed",
        ),
        (
            ["--topology", "8tracks", "--servers", "16", "--gpus", "129"],
            "the 128 GPUs of 8tracks-16",
        ),
        (["--topology", "2tracks", "--gpus", "9601"], "the 9600 GPUs of 2tracks"),
    ],
)
def test_more_gpus_than_the_cluster_is_refused_in_one_line(argv, message, capsys) -> None:
    assert main(["plan", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
