"""Engine profiles (docs/engine-profile.md): the fit of Eqs. 12-13 to measured
times, ``plan --profile`` and ``simulate --profile`` using it, and bad profile files refused in
one line without quoting them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main
from controller.costmodel.compute import (
    ComputeCoefficients,
    decode_layer_time,
    default_coefficients,
    layer_weights,
    prefill_layer_time,
)
from controller.costmodel.profiled import fit_profile
from controller.errors import InputError
from controller.models import model_spec
from controller.models.profile import FORMAT, profile_from_doc
from controller.workload import resolve_workload

M = model_spec("OPT-125M")
TOPOLOGY = """name: two-slots
servers:
  - {id: localhost, gpu_type: H100, gpus: 2, role: any}
switches:
  - {id: s1, tier: access}
links:
  - {a: localhost-gpu0, b: s1, gbps: 100}
  - {a: localhost-gpu1, b: s1, gbps: 100}
"""
PREFILL = ([1, 2, 4, 8, 16], [32, 64, 128, 256, 512])
DECODE = ([1, 2, 4, 8, 16, 32, 64, 128], [64, 128, 256, 512, 1024])


def profile_doc(co: ComputeCoefficients, scale: float = 1.0) -> dict:
    """A profile whose times are ``scale`` x Eqs. 12-13 under ``co`` over all layers."""
    (pb, pl), (db, dc) = PREFILL, DECODE
    pre = [
        [scale * M.layers * prefill_layer_time(co, M, 1, b * n, b * n * n) for n in pl] for b in pb
    ]
    dec = [[scale * M.layers * decode_layer_time(co, M, 1, b, b * c) for c in dc] for b in db]
    return {
        "format": FORMAT, "model": "OPT-125M", "gpu_type": "H100", "hardware": "test",
        "engine": "Eqs. 12-13", "tp": 1, "dtype": "float16",
        "prefill": {"batch_sizes": pb, "prompt_lengths": pl, "time_s": pre},
        "decode": {"batch_sizes": db, "context_lengths": dc, "time_s": dec},
    }  # fmt: skip


def test_fit_recovers_the_coefficients_that_made_the_times():
    """Times made from known C1, C2, C3 (prefill) and C1d, C5, C6 (decode, no memory floor)
    come back from the fit, and its residual is nil."""
    co = ComputeCoefficients(c1=3e-12, c2=2e-11, c3=4e-5, c4=0.0, c5=7e-12, c6=5e-5, c1d=9e-12)
    fit = fit_profile(profile_from_doc(profile_doc(co), "t"), M)
    got = fit.coefficients
    for k in ("c1", "c2", "c3", "c5", "c6", "c1d"):
        assert getattr(got, k) == pytest.approx(getattr(co, k), rel=1e-6), k
    assert got.c4 == 0.0
    assert max(fit.max_error.values()) < 1e-9


def _plan_rate(tmp_path: Path, capsys, *extra: str) -> float:
    topo = tmp_path / "topo.yaml"
    topo.write_text(TOPOLOGY)
    out = tmp_path / "plan.json"
    argv = ["plan", "--topology", str(topo), "--model", "OPT-125M", "--planner", "heroserve"]
    assert main([*argv, "--quiet", "--json", str(out), *extra]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())["predicted"]["rate"]


def test_plan_prices_compute_from_the_profile(tmp_path, capsys):
    """On one server with 1x1 prefill and 1x1 decode (no all-reduce, no hop) and the chatbot
    SLA, the plan's rate is decode's throughput at its batch B = 512:
        H = B / (L (C4 W + C6 + C5 3h B ctx) steps)
    with ctx the mean decode context and steps the tokens decode makes per request. A profile
    made from the H100's datasheet coefficients is fitted with C4 = 0 and C6' = C4 W + C6
    (all its decode batches are below the roofline's knee), so the same formula gives the
    profile's rate; its times x10 give exactly a tenth. The datasheet's own plan differs
    (it prices B = 512 as compute-bound), so an ignored profile fails both checks."""
    co = default_coefficients("H100")
    w = resolve_workload("chatbot", seed=0)
    b, ctx, steps = 512, w.mean_kv_tokens, w.mean_decode_steps
    step = M.layers * (co.c4 * layer_weights(M) + co.c6 + co.c5 * 3 * M.hidden * b * ctx)
    hand = b / (step * steps)
    for scale in (1, 10):
        f = tmp_path / f"p{scale}.json"
        f.write_text(json.dumps(profile_doc(co, scale)))
        assert _plan_rate(tmp_path, capsys, "--profile", str(f)) == pytest.approx(
            hand / scale, rel=1e-6
        )
    assert _plan_rate(tmp_path, capsys) != pytest.approx(hand, rel=1e-3)


def test_simulate_needs_the_profile_the_plan_was_priced_with(tmp_path, capsys):
    co = default_coefficients("H100")
    p1, p10 = tmp_path / "p1.json", tmp_path / "p10.json"
    p1.write_text(json.dumps(profile_doc(co)))
    p10.write_text(json.dumps(profile_doc(co, 10)))
    _plan_rate(tmp_path, capsys, "--profile", str(p1))
    sim = ["simulate", "--plan", str(tmp_path / "plan.json"), "--topology"]
    sim += [str(tmp_path / "topo.yaml"), "--requests", "50"]
    for extra, why in (([], "pass the same --profile"), (["--profile", str(p10)], "not the one")):
        assert main([*sim, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()  # the fit's lines, then the error
        assert why in err[-1] and sum("error:" in x for x in err) == 1
    assert main([*sim, "--profile", str(p1)]) == 0
    assert "SLA attainment" in capsys.readouterr().out


def _broken(doc: dict, path: tuple, value) -> dict:
    d = json.loads(json.dumps(doc))
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


@pytest.mark.parametrize(
    "path,value,why",
    [
        (("prefill", "batch_sizes"), [1, 4, 2, 8, 16], "increase strictly"),
        (("decode", "time_s", 1, 2), -0.5, "decode.time_s[1][2]"),
        (("decode", "time_s", 0, 0), float("nan"), "decode.time_s[0][0]"),
        (("prefill", "time_s", 3), [1.0], "prefill.time_s[3]"),
        (("tp",), 1.5, "'tp'"),
        (("format",), "vidur", "'format'"),
        (("SECRET-KEY",), 1, "unknown field"),
        (("hardware",), "", "'hardware'"),
        (("prefill", "prompt_lengths"), list(range(1, 70)), "1 to 64"),
    ],
)
def test_a_bad_profile_is_refused_in_one_line_unquoted(tmp_path, capsys, path, value, why):
    doc = _broken(profile_doc(default_coefficients("H100")), path, value)
    with pytest.raises(InputError, match=None) as e:
        profile_from_doc(doc, "p.json")
    assert why in str(e.value) and "SECRET" not in str(e.value)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    topo = tmp_path / "topo.yaml"
    topo.write_text(TOPOLOGY)
    argv = ["plan", "--topology", str(topo), "--model", "OPT-125M", "--profile", str(f)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "SECRET" not in err


def test_a_profile_of_another_model_or_gpu_type_is_refused(tmp_path, capsys):
    topo = tmp_path / "topo.yaml"
    topo.write_text(TOPOLOGY)
    doc = profile_doc(default_coefficients("H100"))
    for field, value, why in (
        ("model", "OPT-13B", "measures OPT-13B"),
        ("gpu_type", "A100-40GB", "none of"),
    ):
        f = tmp_path / "p.json"
        f.write_text(json.dumps({**doc, field: value}))
        argv = ["plan", "--topology", str(topo), "--model", "OPT-125M", "--profile", str(f)]
        assert main(argv) == 2
        assert why in capsys.readouterr().err


def _fake_engine(tmp_path: Path, decode_time: float) -> Path:
    """An executable standing in for the engine's Python: it writes the measurements a probe
    of the default grid's shape (4 x 4 prefill, 5 x 4 decode) would to the file after
    ``--result``, and then logs to stdout as vLLM does at shutdown."""
    out = {"engine": "fake 0", "hardware": "test", "prefill": [[0.01] * 4] * 4,
           "decode": [[decode_time] * 4] * 5}  # fmt: skip
    exe = tmp_path / "python"
    exe.write_text(
        '#!/bin/sh\nwhile [ "$1" != --result ]; do shift; done\n'
        f"echo '{json.dumps(out)}' > \"$2\"\necho 'INFO [core.py] shutting down'\n"
    )
    exe.chmod(0o755)
    return exe


def test_profile_writes_what_plan_reads_and_refuses_a_bad_measurement(tmp_path, capsys):
    """``heroserve profile`` writes the probe's measurements as a profile ``read_profile``
    accepts, with the grid it asked for; a decode step measured as no positive time is one
    line and exit 2; a missing engine too."""
    from controller.models.profile import read_profile

    out = tmp_path / "p.json"
    argv = ["profile", "--gpu-type", "H100", "--out", str(out), "--model-dir", str(tmp_path)]
    assert main([*argv, "--engine-python", str(_fake_engine(tmp_path, 0.002))]) == 0
    prof = read_profile(out)
    assert prof.prefill.cols == (32, 64, 128, 256) and prof.decode.rows == (1, 2, 4, 8, 16)
    assert prof.decode.times[4][3] == 0.002 and prof.model == "OPT-125M"
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 12
    capsys.readouterr()
    assert main([*argv, "--engine-python", str(_fake_engine(tmp_path, -0.001))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "decode.time_s[0][0]" in err[-1] and "--decode-steps" in err[-1]
    kept = json.loads((tmp_path / "p.json.refused.json").read_text())  # the run is not lost
    assert kept["decode"]["time_s"][0][0] == -0.001 and kept["prefill"]["time_s"][3][3] == 0.01
    assert main([*argv, "--engine-python", str(tmp_path / "none")]) == 2
    assert "no engine Python" in capsys.readouterr().err
