"""``heroserve profile``: measure a serving engine on the hardware at hand over a grid of
batch sizes, prompt lengths and contexts for one model shape, and write an engine profile
(docs/engine-profile.md; format in ``controller/models/profile.py``) that
``plan --profile`` and ``simulate --profile`` price compute with.

The measuring runs in the engine's own Python (``profile_probe.py``, vLLM's offline engine
with dummy weights); this side writes the model's config.json, hands the probe the grid,
checks what comes back as it checks any profile file, and writes it. Bad input, a probe that
fails or a measurement that is not a positive time: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from controller.cli.config import ProfileCommand
from controller.errors import InputError
from controller.inputs.flags import add_flags

PROBE = Path(__file__).with_name("profile_probe.py")
DEFAULT_PYTHON = Path.home() / ".cache" / "heroserve-engines" / "vllm" / "bin" / "python"
MAX_PROBE_OUTPUT = 4 << 20  # bytes of the probe's result read back


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Measure a serving engine (vLLM) over a grid of batch sizes and lengths for a model "
        "shape and write an engine profile for plan/simulate --profile."
    )
    add_flags(p, ProfileCommand)


def run(a: argparse.Namespace) -> int:
    from controller.models import gpu_spec, model_spec
    from controller.models.hfconfig import write_model_config
    from controller.models.profile import FORMAT, profile_from_doc, profile_json

    spec = model_spec(a.model)
    gpu_spec(a.gpu_type)  # a known type, or one line naming the known ones
    python = Path(a.engine_python) if a.engine_python else DEFAULT_PYTHON
    if not python.is_file() or not os.access(python, os.X_OK):
        raise InputError(
            f"no engine Python at {str(python)!r}: build the vLLM environment "
            "(bash tools/engines.sh) or pass --engine-python"
        )
    grid = {
        "prefill": [list(a.batch_sizes), list(a.prompt_lengths)],
        "decode": [list(a.decode_batches), list(a.contexts)],
        "steps": a.decode_steps,
        "repeats": a.repeats,
    }
    with tempfile.TemporaryDirectory(prefix="hs-profile-") as tmp:
        folder = Path(a.model_dir or tmp)
        if not (folder / "config.json").is_file():
            write_model_config(spec, folder)
        # run from a folder of its own: beside this module, profile.py would shadow the
        # standard library's profile module in the engine's Python
        probe = Path(tmp) / PROBE.name
        probe.write_bytes(PROBE.read_bytes())
        measured = _probe(python, probe, folder, grid, a, Path(tmp) / "measured.json")
    doc = {
        "format": FORMAT,
        "model": spec.name,
        "gpu_type": a.gpu_type,
        "hardware": measured.get("hardware"),
        "engine": measured.get("engine"),
        "tp": a.tp,
        "dtype": a.dtype,
        "prefill": {
            "batch_sizes": grid["prefill"][0],
            "prompt_lengths": grid["prefill"][1],
            "time_s": measured.get("prefill"),
        },
        "decode": {
            "batch_sizes": grid["decode"][0],
            "context_lengths": grid["decode"][1],
            "time_s": measured.get("decode"),
        },
    }
    try:  # what plan --profile accepts
        prof = profile_from_doc(doc, "the engine's measurements")
    except InputError as e:
        # what was measured stays for a reader: a refused run may have taken half an hour
        kept = Path(a.out + ".refused.json")
        kept.write_text(json.dumps(doc, indent=1) + "\n")
        raise InputError(
            f"{e} (a decode step is the difference of two runs: on a busy machine raise "
            f"--decode-steps or --repeats; the measurements are in {kept})"
        ) from None
    Path(a.out).write_text(profile_json(prof.to_doc()))
    print(f"profile of {spec.name} on {prof.hardware} ({prof.engine}) written to {a.out}")
    return 0


def _probe(
    python: Path, probe: Path, folder: Path, grid: dict, a: argparse.Namespace, result: Path
) -> dict:
    """The probe's measurements (the JSON object it writes to ``result``)."""
    argv = [str(python), str(probe), "--model-dir", str(folder), "--grid", json.dumps(grid)]
    argv += ["--result", str(result)]
    argv += ["--dtype", a.dtype, "--tp", str(a.tp)]
    # vLLM's CPU build (ignored on a GPU): 1 GiB of KV cache (its default sizes it from the
    # machine) and OpenMP threads left unbound (its default binding reserves cores a small
    # shared machine does not have), as tools/engine_e2e.py starts it
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", **os.environ}
    print(f"measuring {len(a.batch_sizes) * len(a.prompt_lengths)} prefill and "
          f"{len(a.decode_batches) * len(a.contexts)} decode points", file=sys.stderr)  # fmt: skip
    log = Path(a.out + ".log")  # the engine's own messages, for when it fails or stalls
    try:
        with log.open("wb") as err:
            # stdout too: vLLM's logger writes there
            r = subprocess.run(argv, stdout=err, stderr=err, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        raise InputError(
            f"the engine did not finish within {a.timeout:g} s (--timeout; its log: {log})"
        ) from None
    if r.returncode != 0:
        raise InputError(f"the engine's probe failed (status {r.returncode}; its log: {log})")
    try:
        with result.open("rb") as f:
            out = json.loads(f.read(MAX_PROBE_OUTPUT + 1)[:MAX_PROBE_OUTPUT])
    except (OSError, ValueError):
        raise InputError(f"the engine's probe wrote no measurements (its log: {log})") from None
    if not isinstance(out, dict):
        raise InputError(f"the engine's probe wrote no measurements (its log: {log})")
    return out
