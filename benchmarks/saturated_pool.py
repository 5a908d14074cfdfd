"""The prefill pool's saturated one-instance case, as the planner prices it for every distinct
prefill instance (``InstancePricer.prefill_capacity``): ``prefill_pool.saturated_departures``
(one instance, the token budget's batches formed once per prompt list) against
``pool_run``, the general pool loop it replaces, on the planner's own prompt sample
(``PROMPT_SAMPLE`` chatbot prompts, seed 0) and vLLM's admission at PP 2-12, with random
stage costs of the planner's scale. Prints CPU seconds of each, their ratio, and whether
every batch's departure is the same float.

    .venv/bin/python benchmarks/saturated_pool.py [--calls 40]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree, not an installed one

from controller.costmodel.prefill_pool import pool_run, saturated_departures
from controller.models.engines import engine_profile, prefill_admission
from controller.planner.instances import PROMPT_SAMPLE
from controller.workload import chatbot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40, help="stage costs priced per PP")
    a = ap.parse_args()
    lengths, counts = np.unique(np.asarray(chatbot().inputs, dtype=float), return_counts=True)
    rng = np.random.default_rng(0)
    prompts = lengths[rng.choice(len(lengths), size=PROMPT_SAMPLE, p=counts / counts.sum())]
    prompts = prompts.tolist()
    profile = engine_profile("vllm")
    print(f"{'PP':>3} {'pool_run CPU s':>15} {'saturated CPU s':>16} {'ratio':>6}  same floats")
    for pp in (2, 4, 8, 12):
        adm = prefill_admission(profile, pp)
        # per stage a (s), b (s/token), c (s/token^2): OPT-175B-like stages, ms per batch
        costs = [rng.uniform(0.5, 2.0, size=(pp, 3)) * [1e-3, 2e-5, 1e-10] for _ in range(a.calls)]
        t = time.process_time()
        want = [pool_run([0.0] * len(prompts), prompts, [c], adm)[1] for c in costs]
        slow = time.process_time() - t
        t = time.process_time()
        got = [saturated_departures(prompts, c, adm) for c in costs]
        fast = time.process_time() - t
        print(f"{pp:>3} {slow:15.3f} {fast:16.3f} {slow / fast:5.1f}x  {got == want}")


if __name__ == "__main__":
    main()
