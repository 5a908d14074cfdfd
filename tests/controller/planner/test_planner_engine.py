"""The search for a serving engine or a forced parallelism: DistServe's low-affinity layouts
keep to the forced (TP, PP) and to the engine's rules, and a placement the engine cannot
start (SGLang's uneven pipeline split) is never planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import InputError
from controller.models import model_spec
from controller.models.engines import SGLANG, placement_problem
from controller.planner import PlannerOptions, plan
from controller.planner.colocated import colocated_search
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY
from controller.planner.options import Problem
from controller.topology import resolve_topology
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla


def _colocated(**opts: object):  # noqa: ANN202 - a SearchResult or None
    problem = Problem(
        make_testbed(), model_spec("OPT-66B"), chatbot(), default_sla("chatbot"),
        PlannerOptions(**opts),  # type: ignore[arg-type]
    )  # fmt: skip
    return colocated_search(Evaluator(problem, POLICY))


def test_low_affinity_layouts_keep_to_a_forced_parallelism() -> None:
    free = _colocated()
    assert free is not None and (free.prefill.tp, free.prefill.pp) == (2, 2)
    # the one unit that fits OPT-66B here (2x2 and 2x2 on the A100 servers) is allowed...
    forced = _colocated(prefill_par=(2, 2), decode_par=(2, 2))
    assert forced is not None and (forced.decode.tp, forced.decode.pp) == (2, 2)
    # ...and refused when another parallelism is forced on either role
    assert _colocated(decode_par=(4, 2)) is None
    assert _colocated(prefill_par=(1, 8)) is None


def test_low_affinity_layouts_keep_to_the_engine() -> None:
    # every unit pipelines both roles over the same nodes: vLLM's decode cannot
    assert _colocated(engine="vllm") is None
    assert _colocated(engine="sglang") is not None


def _uneven(tmp: Path) -> Path:
    """Prefill servers of 8 and 4 A100-80GB GPUs, a decode server of 8."""
    servers = {"a": (8, "prefill"), "b": (4, "prefill"), "c": (8, "decode")}
    text = "servers:\n" + "".join(
        f"  - {{id: {s}, gpu_type: A100-80GB, gpus: {n}, role: {r}}}\n"
        for s, (n, r) in servers.items()
    )
    text += "switches:\n  - {id: sw, tier: access}\nlinks:\n" + "".join(
        f"  - {{a: {s}-gpu{i}, b: sw, link: ethernet, gbps: 100}}\n"
        for s, (n, _) in servers.items()
        for i in range(n)
    )
    path = tmp / "uneven.yaml"
    path.write_text(text)
    return path


def test_sglang_is_never_planned_an_uneven_pipeline_split(tmp_path: Path) -> None:
    """OPT-175B forced to prefill 1x12 on servers of 8 and 4 GPUs: the neutral plan takes
    all 12 (8 + 4, what SGLang cannot start); for SGLang there is no such plan."""
    g = resolve_topology(str(_uneven(tmp_path)))
    args = (g, model_spec("OPT-175B"), chatbot(), default_sla("chatbot"))
    neutral = plan(*args, PlannerOptions(prefill_par=(1, 12)))
    server_of = {x: d["server"] for x, d in g.nodes(data=True) if d["kind"] == "gpu"}
    bad = placement_problem(SGLANG, "prefill/0", neutral.prefill.instances[0].stages, server_of)
    assert bad is not None and "8+4 GPUs" in bad
    with pytest.raises(InputError, match="no deployment of OPT-175B that sglang runs"):
        plan(*args, PlannerOptions(prefill_par=(1, 12), engine="sglang"))
