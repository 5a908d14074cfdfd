"""The measuring side of ``heroserve profile``, run by the serving engine's own Python (it
imports vLLM and the standard library only, never the controller): it starts vLLM's offline
engine on a model folder with dummy weights and times engine steps over a grid
(docs/engine-profile.md).

    <vllm python> profile_probe.py --model-dir DIR --grid JSON --result FILE [--dtype D] [--tp N]

``--grid``: {"prefill": [[batch sizes], [prompt lengths]], "decode": [[batch sizes],
[context lengths]], "steps": N, "repeats": R}. Prefill time at (B, L): one ``generate`` of B
distinct prompts of L tokens making 1 token each (the engine's step that prefills them, its
sampling and scheduling included, as a prefill instance serves a request). Decode step at
(B, c): B prompts of c tokens making 1 + N tokens, less the same making 1, over N (the
context grows from c to c + N during the N steps). Each figure is the median of R runs;
prompts never repeat (prefix caching off too), so no run reuses another's KV cache. Writes one
JSON object to ``--result``: engine, hardware, and the two tables in seconds. Not to stdout:
vLLM's logger writes there, also after the measurements (at shutdown), so a last line of stdout
is not the probe's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def _hardware() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return f"{n} x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - no torch or no GPU: describe the CPU
        pass
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {name}, {os.cpu_count()} cores visible, load {os.getloadavg()[0]:.1f}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--grid", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tp", type=int, default=1)
    a = p.parse_args()
    grid = json.loads(a.grid)
    (pb, pl), (db, dc) = grid["prefill"], grid["decode"]
    steps, repeats = int(grid["steps"]), int(grid["repeats"])

    import vllm
    from vllm import LLM, SamplingParams

    longest = max(max(pl), max(dc) + steps + 1)
    llm = LLM(
        model=a.model_dir, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
        dtype=a.dtype, tensor_parallel_size=a.tp, max_model_len=longest,
        max_num_seqs=max(max(pb), max(db)),
        max_num_batched_tokens=max(max(pb) * max(pl), max(db) * max(dc), longest),
        enable_prefix_caching=False, seed=0,
    )  # fmt: skip
    vocab = json.load(open(os.path.join(a.model_dir, "config.json")))["vocab_size"]
    counter = [0]

    def run(batch: int, length: int, tokens: int) -> float:
        prompts = []
        for _ in range(batch):
            counter[0] += 1
            k = counter[0]
            prompts.append(
                {"prompt_token_ids": [3 + (k * 7919 + j) % (vocab - 4) for j in range(length)]}
            )
        sp = SamplingParams(
            max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0, detokenize=False
        )
        t0 = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - t0

    run(1, 16, 2)  # warm-up: first-call allocations are no step's cost

    def median(f) -> float:
        return statistics.median(f() for _ in range(repeats))

    prefill = [[median(lambda b=b, n=n: run(b, n, 1)) for n in pl] for b in pb]
    decode = [
        [median(lambda b=b, c=c: (run(b, c, 1 + steps) - run(b, c, 1)) / steps) for c in dc]
        for b in db
    ]
    out = {
        "engine": f"vllm {vllm.__version__}",
        "hardware": _hardware(),
        "prefill": prefill,
        "decode": decode,
    }
    with open(a.result, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
