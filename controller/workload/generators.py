"""Synthetic workloads after the paper's data sets. No data set is downloaded at run time.

Length statistics (documented approximations of the public data sets, in tokens):
- chatbot, ShareGPT's means as vLLM's paper reports them: input 161, output 338; both
  log-normal with a CV of about 1 (assumed: the paper gives histograms, not spreads).
- summarization, LongBench's means as DistServe's paper reports them: input 1738, output 90;
  CVs 0.3 and 0.5 (assumed). docs/costmodel.md says what to measure to replace them.
Lengths are clipped to [1, max_context] with input + output <= max_context (OPT: 2048).

Holds :func:`chatbot`, :func:`summarization` and :data:`WORKLOADS` (name -> generator).
The :class:`~controller.workload.base.Workload` they build, and its arrival sampling, are in
``base.py``; trace files
(CSV, JSON, ShareGPT) are read by ``traces.py``; ``resolve.py`` turns a name or a file into a
workload.
"""

from __future__ import annotations

import math

import numpy as np

from controller.workload.base import Workload


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    sigma2 = math.log(1 + cv * cv)
    mu = math.log(mean) - sigma2 / 2
    return rng.lognormal(mu, math.sqrt(sigma2), n)


def _synthetic(
    name: str,
    mean_in: float,
    cv_in: float,
    mean_out: float,
    cv_out: float,
    n: int,
    seed: int,
    max_context: int,
) -> Workload:
    rng = np.random.default_rng(seed)
    inp = np.clip(np.rint(_lognormal(rng, mean_in, cv_in, n)), 1, max_context - 1).astype(int)
    out = np.clip(np.rint(_lognormal(rng, mean_out, cv_out, n)), 1, None).astype(int)
    out = np.minimum(out, max_context - inp)
    return Workload(name, inp, out)


def chatbot(n: int = 20000, seed: int = 0, max_context: int = 2048) -> Workload:
    """ShareGPT-like chat: input mean 161, output mean 338 tokens."""
    return _synthetic("chatbot", 161, 1.0, 338, 0.9, n, seed, max_context)


def summarization(n: int = 20000, seed: int = 0, max_context: int = 2048) -> Workload:
    """LongBench-like summarization: input mean 1738, output mean 90 tokens (inputs clipped
    to the context window, as DistServe filters LongBench)."""
    return _synthetic("summarization", 1738, 0.3, 90, 0.5, n, seed, max_context)


WORKLOADS = {"chatbot": chatbot, "summarization": summarization}
