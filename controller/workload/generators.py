"""Request generators and trace loaders. No data set is downloaded at run time.

Length statistics (documented approximations of the public data sets, in tokens):
- chatbot, ShareGPT as vLLM's paper reports it: input mean 161, output mean 338; both
  log-normal with a CV of about 1.
- summarization, LongBench as DistServe's paper reports it: input mean 1738, output mean 90.
Lengths are clipped to [1, max_context] with input + output <= max_context (OPT: 2048).

Arrivals: Poisson at rate lambda, or gamma inter-arrival times with a given CV (CV 1 is
Poisson; larger is burstier).

Trace files: CSV with columns ``input_tokens,output_tokens[,arrival_s]``, JSON list of objects
with those keys, or a ShareGPT JSON file (conversations of ``{"from", "value"}`` turns) where
each human turn is a request and the next gpt turn its answer, with tokens approximated as
``ceil(characters / 4)`` (the usual ~4 characters per BPE token of English text).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.errors import InputError

CHARS_PER_TOKEN = 4.0


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


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _positive_int(v: object, where: str) -> int:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{where}: {v!r} is not a number") from None
    if not math.isfinite(x) or x < 1 or x != int(x):
        raise InputError(f"{where}: token count must be a positive integer, got {v!r}")
    return int(x)


def load_trace(path: str | Path) -> Workload:
    """Load a CSV, JSON or ShareGPT trace (see module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"trace file {str(p)!r} does not exist")
    inputs: list[int] = []
    outputs: list[int] = []
    arrivals: list[float] = []
    if p.suffix == ".csv":
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            need = {"input_tokens", "output_tokens"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise InputError(f"{p}: CSV needs columns input_tokens,output_tokens")
            for i, row in enumerate(reader, start=2):
                inputs.append(_positive_int(row["input_tokens"], f"{p}:{i} input_tokens"))
                outputs.append(_positive_int(row["output_tokens"], f"{p}:{i} output_tokens"))
                if row.get("arrival_s") not in (None, ""):
                    arrivals.append(float(row["arrival_s"]))
    else:
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{p}: not valid JSON ({e})") from None
        if not isinstance(doc, list) or not doc:
            raise InputError(f"{p}: expected a non-empty JSON list of requests")
        for i, item in enumerate(doc):
            if not isinstance(item, dict):
                raise InputError(f"{p}: item {i} is not an object")
            if "conversations" in item:  # ShareGPT
                turns = item["conversations"]
                for a, b in zip(turns, turns[1:], strict=False):
                    if a.get("from") == "human" and b.get("from") == "gpt":
                        inputs.append(_tokens(str(a.get("value", ""))))
                        outputs.append(_tokens(str(b.get("value", ""))))
            else:
                inputs.append(_positive_int(item.get("input_tokens"), f"{p}: item {i}"))
                outputs.append(_positive_int(item.get("output_tokens"), f"{p}: item {i}"))
                if "arrival_s" in item:
                    arrivals.append(float(item["arrival_s"]))
    if not inputs:
        raise InputError(f"{p}: no requests found")
    arr = np.array(arrivals) if len(arrivals) == len(inputs) else None
    return Workload(p.stem, np.array(inputs), np.array(outputs), arr)


def resolve_workload(spec: str, seed: int = 0) -> Workload:
    if spec in WORKLOADS:
        return WORKLOADS[spec](seed=seed)
    if Path(spec).suffix in (".csv", ".json"):
        return load_trace(spec)
    raise InputError(f"unknown workload {spec!r}: use chatbot, summarization or a .csv/.json trace")
