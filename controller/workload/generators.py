"""Request generators and trace loaders. No data set is downloaded at run time.

Length statistics (documented approximations of the public data sets, in tokens):
- chatbot, ShareGPT as vLLM's paper reports it: input mean 161, output mean 338; both
  log-normal with a CV of about 1.
- summarization, LongBench as DistServe's paper reports it: input mean 1738, output mean 90.
Lengths are clipped to [1, max_context] with input + output <= max_context (OPT: 2048).

Arrivals: Poisson at rate lambda, or gamma inter-arrival times with a given CV (CV 1 is
Poisson; larger is burstier).

Trace files (CSV, JSON, ShareGPT) are read by ``traces.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.errors import InputError


@dataclass(frozen=True)
class Request:
    arrival_s: float
    input_tokens: int
    output_tokens: int


@dataclass
class Workload:
    """A length distribution, sampled or taken from a trace."""

    name: str
    inputs: np.ndarray  # token counts
    outputs: np.ndarray
    arrivals: np.ndarray | None = None  # trace timestamps, if the trace had them

    @property
    def mean_input(self) -> float:
        return float(np.mean(self.inputs))

    @property
    def mean_input_sq(self) -> float:
        return float(np.mean(self.inputs.astype(float) ** 2))

    @property
    def mean_output(self) -> float:
        return float(np.mean(self.outputs))

    @property
    def mean_kv_tokens(self) -> float:
        """Time-average KV tokens held per request in a decode batch: a request holds
        l + t tokens at its t-th step for o steps, and requests stay in proportion to o, so
        the average is E[o (l + o/2)] / E[o] (length-biased, not l + o/2 of the means)."""
        o = self.outputs.astype(float)
        return float(np.sum(o * (self.inputs + o / 2)) / np.sum(o))

    def requests(self, rate: float, n: int, seed: int = 0, cv: float = 1.0) -> list[Request]:
        """``n`` requests at ``rate`` req/s: Poisson (cv=1) or gamma inter-arrivals."""
        if rate <= 0:
            raise InputError(f"request rate must be positive, got {rate}")
        if n <= 0:
            raise InputError(f"number of requests must be positive, got {n}")
        rng = np.random.default_rng(seed)
        if cv == 1.0:
            gaps = rng.exponential(1.0 / rate, n)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
        times = np.cumsum(gaps) - gaps[0]
        idx = rng.integers(0, len(self.inputs), n)
        return [
            Request(float(t), int(self.inputs[i]), int(self.outputs[i]))
            for t, i in zip(times, idx, strict=True)
        ]


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


def resolve_workload(spec: str, seed: int = 0) -> Workload:
    if spec in WORKLOADS:
        return WORKLOADS[spec](seed=seed)
    if Path(spec).suffix in (".csv", ".json"):
        from controller.workload.traces import load_trace  # traces builds on this module

        return load_trace(spec)
    raise InputError(f"unknown workload {spec!r}: use chatbot, summarization or a .csv/.json trace")
