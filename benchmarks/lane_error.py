"""Numerical error of each INA lane format on transformer activations with outliers.

What the switch returns for an all-reduce of ``w`` members' FP16 activations, per lane
format (docs/dataplane.md, "Lane formats"), against the float64 sum of the same FP16 inputs
and against a float32 sum (what NCCL's ring computes for FP16 with a float32 accumulator is
closer to the latter; both are printed):

* ``int32``: fixed point, one exponent for the whole vector (agents/ina/lanes.py);
* ``bfp16``: int16 lanes, one exponent per 64-element block (the packet), agreed as the
  switch's maximum of the members' proposals;
* ``fp16 adds`` (for comparison, what a switch adding FP16 would do, as FPISA): the
  members' values added one by one in FP16.

Data (seed fixed): each member holds a ``tokens x hidden`` partial output of a tensor-
parallel layer. Regular channels are Student-t with 4 degrees of freedom (heavy-tailed, unit
scale); 6 of every 4096 channels are outlier channels scaled by 20, the emergent features
LLM.int8() reports (Dettmers et al., NeurIPS 2022: magnitudes up to 20x the rest, in about 6
feature dimensions at 6.7B parameters). Values are rounded to FP16, the serving precision.
Blocks are 64 consecutive channels of one token, as the packetizer cuts a row-major buffer.

Printed per format and group size: max |error|, relative L2 error (||err|| / ||sum||), and
the format's guaranteed bound on |error| per element (int32 and bfp16: w / (2 scale); the
largest over the blocks for bfp16; none for FP16 adds, which depend on the order).

    .venv/bin/python benchmarks/lane_error.py [--tokens 64] [--hidden 4096] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.ina import lanes  # noqa: E402
from agents.ina.packet import BFP16_LANES  # noqa: E402

OUTLIERS_PER_4096 = 6  # LLM.int8(): about 6 outlier feature dimensions at 6.7B
OUTLIER_SCALE = 20.0  # LLM.int8(): outliers up to 20x larger than the other features
STUDENT_DF = 4  # heavy tails for the regular channels


def activations(rng: np.random.Generator, tokens: int, hidden: int) -> np.ndarray:
    """One member's FP16 partial output (see the module docstring), as float64."""
    x = rng.standard_t(STUDENT_DF, size=(tokens, hidden))
    n_out = max(1, hidden * OUTLIERS_PER_4096 // 4096)
    cols = rng.choice(hidden, size=n_out, replace=False)
    x[:, cols] *= OUTLIER_SCALE
    return x.astype(np.float16).astype(np.float64).reshape(-1)


def int32_sum(data: list[np.ndarray]) -> tuple[np.ndarray, float]:
    w = len(data)
    e = max(lanes.exponent_of(lanes.max_abs(d)) for d in data)
    total = sum(lanes.to_lanes(d, w, e).astype(np.int64) for d in data)
    return lanes.from_lanes(total, w, e), lanes.error_bound(w, e)


def bfp16_sum(data: list[np.ndarray]) -> tuple[np.ndarray, float]:
    # the switch's arithmetic (saturating int16 adds at the largest proposal), block by block
    return lanes.bfp16_reference(data)


def fp16_sum(data: list[np.ndarray]) -> tuple[np.ndarray, float]:
    acc = data[0].astype(np.float16)
    for d in data[1:]:
        acc = (acc + d.astype(np.float16)).astype(np.float16)
    return acc.astype(np.float64), float("nan")


FORMATS = {"int32": int32_sum, "bfp16": bfp16_sum, "fp16 adds": fp16_sum}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.hidden < BFP16_LANES:
        ap.error(f"need --tokens >= 1 and --hidden >= {BFP16_LANES}")
    print(f"{a.tokens} tokens x {a.hidden} channels per member, seed {a.seed}")
    print(
        f"{'w':>2} {'format':<10} {'max|err| f64':>13} {'relL2 f64':>10} "
        f"{'max|err| f32':>13} {'relL2 f32':>10} {'bound':>10}"
    )
    for w in (2, 4, 8):
        rng = np.random.default_rng([a.seed, w])
        data = [activations(rng, a.tokens, a.hidden) for _ in range(w)]
        ref64 = np.sum(np.stack(data), axis=0)
        ref32 = np.zeros(ref64.size, dtype=np.float32)
        for d in data:
            ref32 = ref32 + d.astype(np.float32)
        for name, fn in FORMATS.items():
            got, bound = fn(data)
            cols = []
            for ref in (ref64, ref32.astype(np.float64)):
                err = got - ref
                cols += [np.abs(err).max(), np.linalg.norm(err) / np.linalg.norm(ref)]
            print(
                f"{w:>2} {name:<10} {cols[0]:>13.3e} {cols[1]:>10.2e} "
                f"{cols[2]:>13.3e} {cols[3]:>10.2e} {bound:>10.2e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
