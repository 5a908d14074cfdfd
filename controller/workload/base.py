"""The types a workload is made of, shared by the generators and the trace loaders (both
build them; neither imports the other): :class:`Request` (one request's arrival and
lengths) and :class:`Workload` (a length distribution, sampled or from a trace).

Arrivals (``Workload.requests``): Poisson at rate lambda, or gamma inter-arrival times with
a given CV (CV 1 is Poisson; larger is burstier)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.errors import InputError


@dataclass(frozen=True)
class Request:
    """One request: when it arrives (s) and its prompt and output lengths (tokens)."""

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
    def mean_decode_steps(self) -> float:
        """Decode steps a request takes on average: its output tokens after the first, which
        prefill makes (the simulator and the engines decode ``output - 1`` tokens). At least
        1, so that a workload whose requests all end at their first token prices decode
        finitely (as if each took one step) rather than at an infinite rate."""
        return max(self.mean_output - 1.0, 1.0)

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
