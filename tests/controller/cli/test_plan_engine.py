"""`heroserve plan --engine` plans only what the engine runs; a forced --prefill-par /
--decode-par that cannot be honoured exits 2 in one line naming why, never another plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.cli import main
from controller.inputs.plan_checks import load_plan
from controller.models.engines import PROFILES, plan_problem
from controller.topology import resolve_topology


def _plan(tmp: Path, *args: str) -> tuple[int, Path]:
    out = tmp / "plan.json"
    return main(["plan", "--planner", "heroserve", "--quiet", "--json", str(out), *args]), out


def _servers(topology: str) -> dict[str, str]:
    g = resolve_topology(topology)
    return {x: d["server"] for x, d in g.nodes(data=True) if d["kind"] == "gpu"}


def test_the_neutral_testbed_plan_breaks_vllms_decode_rule(tmp_path: Path) -> None:
    """What makes --engine matter: without it a plan may pipeline decode (here asked for: the
    testbed's own plan decodes 8x1 since its 4-GPU boards are meshes)."""
    rc, out = _plan(tmp_path, "--decode-par", "4x2")
    assert rc == 0
    plan = load_plan(out)
    bad = plan_problem(PROFILES["vllm"], plan, _servers("testbed"))
    assert bad is not None and "decode with PP <= 1" in bad
    assert "engine" not in plan.options


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_plan_for_an_engine_passes_its_profile(engine: str, tmp_path: Path) -> None:
    rc, out = _plan(tmp_path, "--engine", engine)
    assert rc == 0
    plan = load_plan(out)
    assert plan_problem(PROFILES[engine], plan, _servers("testbed")) is None
    assert plan.options["engine"] == engine
    if engine == "vllm":
        assert plan.decode.pp == 1 and plan.decode.tp % plan.prefill.tp == 0


@pytest.mark.parametrize(
    "args, says",
    [
        (["--prefill-par", "2x1", "--decode-par", "4x1"], "--prefill-par 2x1 cannot be honoured"),
        (["--prefill-par", "1000x1000"], "TP must be a power of two"),
        (["--decode-par", "3x3"], "--decode-par 3x3 cannot be honoured: decode TP=3 PP=3"),
        (["--decode-par", "1x7"], "PP must divide OPT-66B's 64 layers"),
        (["--prefill-par", "8x4"], "needs 32 GPUs; the cluster has 16 that may prefill"),
        (["--engine", "vllm", "--decode-par", "4x2"], "vllm >=0.10,<0.34 (NixlConnector) runs"),
        (
            ["--engine", "vllm", "--prefill-par", "8x1", "--decode-par", "4x1"],
            "decode TP a multiple of prefill TP",
        ),
    ],
)
def test_a_forced_parallelism_that_cannot_be_honoured_exits_2(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _plan(tmp_path, *args)
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_forced_parallelism_is_the_plans(tmp_path: Path) -> None:
    """The low-affinity layouts HeroServe also prices keep to the forced parallelism."""
    rc, out = _plan(tmp_path, "--prefill-par", "4x1", "--decode-par", "4x2")
    assert rc == 0
    plan = load_plan(out)
    assert (plan.prefill.tp, plan.prefill.pp, plan.decode.tp, plan.decode.pp) == (4, 1, 4, 2)
