"""`heroserve simulate` and `evaluate` with hostile arguments and files:
one line naming the problem and exit 2, no traceback, no hang; the work a command may be
asked to do is bounded."""

import json
from pathlib import Path

import pytest

from controller.cli import main
from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology import testbed as make_testbed
from controller.workload import chatbot, default_sla


@pytest.fixture(scope="module")
def plan_doc() -> dict:
    g = make_testbed(fixed_roles=True)
    # the layout the cases below name: prefill 1x4 on srv0-1, decode 4x2 on srv2-3
    opts = PlannerOptions(prefill_par=(1, 4), decode_par=(4, 2))
    p = plan(g, model_spec("OPT-66B"), chatbot(n=2000), default_sla("chatbot"), opts)
    return json.loads(p.to_json())


@pytest.fixture
def plan_file(tmp_path, plan_doc) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    return path


def _one_line_2(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "1e300"], "argument --rate: must be at most 1000000, got 1e300"),
        (["--rate", "nan"], "argument --rate: must be a finite number, got nan"),
        (["--rate", "1", "--cv", "1e6"], "argument --cv: must be at most 100, got 1e6"),
        (["--rate", "1", "--cv", "0"], "argument --cv: must be positive, got 0"),
        (["--rate", "1", "--requests", "1e7"], "argument --requests: must be at most 1000000"),
        (["--rate", "1", "--seed", "-1"], "argument --seed: must be non-negative, got -1"),
        (["--rate", "1", "--json", "/nonexistent-dir/r.json"], "'/nonexistent-dir' does not exist"),
        # 1e5 per GPU times the plan's 12 GPUs
        (["--rate", "1e5", "--per-gpu"], "offered rate 1.2e+06 req/s is above the bound 1e+06"),
    ],
)
def test_simulate_bounds_its_arguments(plan_file, capsys, args, message):
    _one_line_2(capsys, ["simulate", "--plan", str(plan_file), *args], message)


def test_simulate_without_rate_offers_the_plans_predicted_rate(
    plan_doc, plan_file, tmp_path, capsys
):
    out = tmp_path / "r.json"
    assert main(["simulate", "--plan", str(plan_file), "--requests", "50", "--json", str(out)]) == 0
    predicted = plan_doc["predicted"]["rate"]
    assert predicted > 0
    assert f"offering the plan's predicted rate, {predicted:.4g} req/s" in capsys.readouterr().err
    # the offered rate the simulator reports is that of the requests made at the plan's rate:
    # 50 Poisson arrivals at rate H span about 50 / H seconds
    d = json.loads(out.read_text())
    assert 0.5 * predicted < d["offered_rate"] < 2 * predicted


def test_simulate_refuses_per_gpu_without_rate_and_a_plan_without_a_rate(
    plan_doc, tmp_path, capsys
):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    _one_line_2(capsys, ["simulate", "--plan", str(path), "--per-gpu"], "pass --rate too")
    path.write_text(json.dumps({**plan_doc, "predicted": {**plan_doc["predicted"], "rate": 0}}))
    _one_line_2(capsys, ["simulate", "--plan", str(path)], "the plan predicts no rate")


def test_simulate_one_request_does_a_few_thousand_events(plan_file, tmp_path):
    """One request used to sample the KV timeline 1.57 M times (a period set by the arrivals'
    span, which one request does not have); all at once at the top rate likewise."""
    for rate, n in (("1", "1"), ("1000000", "200")):
        out = tmp_path / "r.json"
        argv = ["simulate", "--plan", str(plan_file), "--rate", rate, "--requests", n]
        assert main([*argv, "--json", str(out)]) == 0
        d = json.loads(out.read_text())
        assert d["finished"] == int(n) and d["events"] < 20_000
        assert len(d["kv_timeline"]) <= 800  # 2 x the engine's 400 samples


def test_simulate_refuses_traces_beyond_the_work_bound(plan_file, tmp_path, capsys):
    huge = tmp_path / "huge.csv"
    huge.write_text("input_tokens,output_tokens\n1000000000000,5\n")
    _one_line_2(
        capsys,
        ["simulate", "--plan", str(plan_file), "--rate", "1", "--workload", str(huge)],
        f"{huge}: line 2: input_tokens: must be at most 1048576, got 1000000000000",
    )
    heavy = tmp_path / "heavy.csv"  # each request within bounds, 1,000 of them too much
    heavy.write_text("input_tokens,output_tokens\n" + "1048576,1048576\n" * 1000)
    _one_line_2(
        capsys,
        [
            "simulate",
            "--plan",
            str(plan_file),
            "--rate",
            "1",
            "--requests",
            "1000",
            "--workload",
            str(heavy),
        ],  # fmt: skip
        "1000 requests hold 2097152000 tokens, more than one simulation may run (1e+09)",
    )


def _gpus(doc: dict, phase: str, i: int = 0) -> list[list[str]]:
    return doc[phase]["instances"][i]["stages"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["decode"]["groups"][0].update(scheme="allgather"),
            "decode.groups[0].scheme: must be one of ina, ring, hier",
        ),
        (
            lambda d: _gpus(d, "decode")[1].__setitem__(0, _gpus(d, "decode")[0][0]),
            "decode.instances[0].stages[1][0]: GPU 'srv2-gpu0' is used twice (also "
            "decode.instances[0].stages[0][0])",
        ),
        (
            lambda d: d["decode"].update(batch_size=float("nan")),
            "decode.batch_size: must be a finite number, got nan",
        ),
    ],
)
def test_simulate_refuses_a_bad_plan(plan_doc, tmp_path, capsys, change, message):
    doc = json.loads(json.dumps(plan_doc))
    change(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    _one_line_2(capsys, ["simulate", "--plan", str(path), "--rate", "1"], f"{path}: {message}")


def test_simulate_refuses_a_plan_with_gpus_not_in_its_topology(plan_file, tmp_path, capsys):
    other = tmp_path / "small.yaml"
    other.write_text(
        "servers: [{id: srv0, gpu_type: A100-40GB, gpus: 4, role: prefill}]\n"
        "switches: [{id: s1}]\n"
        "links: [" + ", ".join(f"{{a: srv0-gpu{i}, b: s1, gbps: 100}}" for i in range(4)) + "]\n"
    )
    _one_line_2(
        capsys,
        ["simulate", "--plan", str(plan_file), "--rate", "1", "--topology", str(other)],
        "decode.instances[0].stages[0][0]: GPU 'srv2-gpu0' is not in topology 'small'",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "/proc/heroserve-x"], "--out: cannot create directory '/proc/heroserve-x'"),
        (["--out", "{file}/x"], "argument --out: '{file}' is not a directory"),
        (["--seed", "-1"], "argument --seed: must be non-negative, got -1"),
        (["--workers", "0"], "argument --workers: must be positive, got 0"),
        (["--requests", "1e9"], "argument --requests: must be at most 1000000"),
    ],
)
def test_evaluate_bounds_its_arguments(tmp_path, capsys, args, message):
    f = tmp_path / "plain-file"
    f.write_text("")
    args = [a.replace("{file}", str(f)) for a in args]
    _one_line_2(
        capsys,
        ["evaluate", "--scenario", "testbed-chatbot", "--quiet", *args],
        message.replace("{file}", str(f)),
    )


def test_fidelity_defaults_write_beside_the_user_at_the_reports_size():
    """The report's own size (1,200 servers, docs/fidelity.md) and a file in the working
    directory: a bare `heroserve fidelity` must not overwrite the repository's docs/."""
    from controller.cli import build_parser

    a = build_parser(["fidelity"]).parse_args(["fidelity"])
    assert (a.out, a.servers) == ("fidelity.md", 1200)
