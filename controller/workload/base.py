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
    def decode_share(self) -> float:
        """Share of requests that reach decode: those with more than one output token. A
        request whose first token is its last ends at prefill (the simulator finishes it
        there): no KV transfer, no decode step."""
        return float(np.mean(self.outputs > 1))

    @property
    def mean_kv_transfer_tokens(self) -> float:
        """Prompt tokens of the KV cache a transfer carries: the mean prompt of the requests
        that reach decode (``decode_share``), not of all requests (summarization's longest
        prompts leave one token of room and end at prefill). The mean prompt when no request
        reaches decode (nothing is transferred)."""
        dec = self.outputs > 1
        return float(np.mean(self.inputs[dec])) if dec.any() else self.mean_input

    @property
    def mean_kv_tokens(self) -> float:
        """Time-average KV tokens held per request in a decode batch: a request joins with
        its prompt and first token, l + 1, holds l + 1 + t at its t-th decode step and takes
        o - 1 steps, and requests stay in proportion to their steps, so the average is
        E[(o - 1)(l + 1 + (o - 2)/2)] / E[o - 1] (length-biased; a request of one output
        token never joins). l + 1 of the mean prompt when no request reaches decode."""
        o = self.outputs.astype(float)
        steps = o - 1.0
        if steps.sum() <= 0:
            return self.mean_input + 1.0
        return float(np.sum(steps * (self.inputs + 1.0 + (o - 2.0) / 2)) / np.sum(steps))

    def requests(self, rate: float, n: int, seed: int = 0, cv: float = 1.0) -> list[Request]:
        """``n`` requests at ``rate`` req/s: Poisson (cv=1) or gamma inter-arrivals."""
        times, inputs, outputs = self.arrays(rate, n, seed, cv)
        return [
            Request(float(t), int(i), int(o))
            for t, i, o in zip(times, inputs, outputs, strict=True)
        ]

    def arrays(
        self, rate: float, n: int, seed: int = 0, cv: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``requests`` as three arrays (arrival s, input tokens, output tokens), the same
        draws: what the simulator's fast path takes, without a million objects."""
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
        return times, self.inputs[idx].astype(np.int64), self.outputs[idx].astype(np.int64)
