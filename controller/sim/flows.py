"""What an activity of the simulator's fluid network moves, and its time (docs/design.md §7).

Holds the flow types (:data:`Flow`, :data:`Part`, :data:`Envelope`), the stretch vector's
(:class:`Stretch`, :data:`ONES`), :class:`Work` (an activity's flows grouped in parts) and
the functions that price them: :func:`alone_time`, :func:`flow_sums`, :func:`flow_slope`,
:func:`envelope`. ``network.py`` shares links among activities; ``model.py`` builds the
flows from the cost model's.

An *activity* is anything that moves bytes: one pipeline stage's iteration (its compute plus
the 2 L/P all-reduces of its layers) or one request's KV-cache transfer. Its uncontended
duration is the cost model's own formula (``controller.costmodel.network.compile_phase``),
written as

    t(x) = fixed_s + sum over parts p of mult_p * max_{f in p} ( scale * K_f(x) + lat_f )

A part is one phase of a collective (``mult_p``: its rounds times the iteration's
all-reduces); ``scale * k_{f,e}`` is the seconds flow ``f`` spends on link ``e`` when the link
is its own (``bytes on e / B(e)``, counting every flow of the same collective on ``e``, as
Eq. 10 with the shared-link rule does), ``x_e >= 1`` the link's *stretch factor*, and a
flow's ``K_f(x)`` combines its links as the cost mode prices a path: store and forward (the
paper's mode), ``sum_e k_{f,e} x_e``; pipelined, the most stretched hop sets the rate,
``max_e k_{f,e} x_e``. Alone, ``x = 1`` and the simulator reproduces the cost model exactly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# A flow of an activity: ((link index, seconds per unit on that link), ...), latency seconds.
Flow = tuple[tuple[tuple[int, float], ...], float]
# A part of an activity: (multiplier, first flow, end flow) over its flat flow list.
Part = tuple[float, int, int]
Envelope = tuple[tuple[float, float], ...]
ALONE_MEMO = 50_000  # scales remembered per Work (message sizes, prompt lengths)


class Stretch(Protocol):
    """Per directed link index, its stretch factor ``x_e >= 1`` (``Links.stretch``, or
    :data:`ONES`)."""

    def __getitem__(self, e: int, /) -> float: ...


@dataclass(frozen=True)
class Work:
    """What an activity moves, shared by the activities of one channel: its flows, grouped in
    ``parts`` (mult, lo, hi), each part's ``envelope`` (its undominated (K_f(1), lat_f)), and
    how a flow combines its links (``pipelined``: the most stretched one; else the sum)."""

    flows: tuple[Flow, ...]
    parts: tuple[Part, ...]
    envelopes: tuple[Envelope, ...]
    pipelined: bool
    # one part whose flows cross one link each (a pipelined KV transfer as one flow per link):
    # (link, k, lat); its time is then the larger of its envelope alone and its stretched flows
    singles: tuple[tuple[int, float, float], ...] | None = None
    # parts whose flows take their most stretched hop even when not ``pipelined`` (a ring
    # step at its bottleneck, Eq. 11; ``costmodel.network.Phase.bottleneck``)
    max_parts: tuple[int, ...] = ()
    # singles by link: link -> ((k, lat), ...), so a pass over the few stretched links
    # replaces a pass over every flow (a KV route crosses hundreds of links)
    by_link: dict[int, tuple[tuple[float, float], ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # per scale, each part's ``mult_p * max over its envelope``: the time alone without the
    # fixed part (the same message sizes and prompt lengths come back all run long)
    _alone: dict[float, tuple[float, ...]] = field(default_factory=dict, repr=False, compare=False)
    _worst: dict[float, float] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (
            self.singles is None
            and len(self.parts) == 1
            and self.flows
            and all(len(t) == 1 for t, _ in self.flows)
        ):
            singles = tuple((t[0][0], t[0][1], lat) for t, lat in self.flows)
            object.__setattr__(self, "singles", singles)
        if self.singles is not None and not self.by_link:
            grouped: dict[int, list[tuple[float, float]]] = {}
            for e, k, lat in self.singles:
                grouped.setdefault(e, []).append((k, lat))
            self.by_link.update((e, tuple(v)) for e, v in grouped.items())

    @classmethod
    def single(cls, flows: Sequence[Flow], pipelined: bool, mult: float = 1.0) -> Work:
        """One part over all ``flows``."""
        flows = tuple(flows)
        return cls(flows, ((mult, 0, len(flows)),), (envelope(flows, pipelined),), pipelined)

    def sums(
        self, stretch: Stretch, hot: Collection[int] | None = None
    ) -> list[tuple[float, float]]:
        """The flows' (K_f(x), lat_f); for ``singles``, only the stretched flows' (a flow at
        x = 1 is never above the envelope alone, and a stretched flow's value alone is never
        above its value stretched, so the maximum is the same). ``hot``, when given, holds
        every link with x > 1: the singles are then found from the smaller of the two (the
        order differs, and only the maximum of a singles list is ever read)."""
        if self.singles is not None:
            if hot is not None and len(hot) < len(self.by_link):
                by_link = self.by_link
                return [(k * stretch[e], lat) for e in hot if e in by_link for k, lat in by_link[e]]
            return [(k * x, lat) for e, k, lat in self.singles if (x := stretch[e]) > 1.0]
        out = flow_sums(self.flows, stretch, self.pipelined)
        if self.max_parts and not self.pipelined:
            for i in self.max_parts:
                _, lo, hi = self.parts[i]
                out[lo:hi] = flow_sums(self.flows[lo:hi], stretch, True)
        return out

    def time(self, fixed_s: float, scale: float, sums: Sequence[tuple[float, float]]) -> float:
        """t(x) from ``sums`` (as ``Work.sums`` gives them)."""
        if self.singles is not None:
            worst = self._worst_alone(scale)
            if sums:
                worst = max(worst, max([k * scale + lat for k, lat in sums]))
            return fixed_s + self.parts[0][0] * worst
        t = fixed_s
        for mult, lo, hi in self.parts:
            if hi > lo:
                t += mult * max([k * scale + lat for k, lat in sums[lo:hi]])
        return t

    def times_alone(self, fixed_s: float, scales: np.ndarray) -> np.ndarray:
        """``time_alone`` at every scale of ``scales`` at once (the fast path's tables)."""
        x = np.asarray(scales, dtype=float)
        t = np.full(x.shape, fixed_s)
        for (mult, _, _), env in zip(self.parts, self.envelopes, strict=True):
            if env:
                t += mult * np.max([k * x + lat for k, lat in env], axis=0)
        return t

    def _worst_alone(self, scale: float) -> float:
        """The singles' part: the largest ``scale * K + lat`` over its envelope."""
        worst = self._worst.get(scale)
        if worst is None:
            worst = max([k * scale + lat for k, lat in self.envelopes[0]], default=0.0)
            if len(self._worst) < ALONE_MEMO:
                self._worst[scale] = worst
        return worst

    def time_alone(self, fixed_s: float, scale: float) -> float:
        """t(1): each part's envelope at ``scale`` (as :func:`alone_time` adds them, term by
        term from ``fixed_s``, so the sum is the same to the last bit)."""
        terms = self._alone.get(scale)
        if terms is None:
            terms = tuple(
                mult * max([k * scale + lat for k, lat in env])
                for (mult, _, _), env in zip(self.parts, self.envelopes, strict=True)
                if env
            )
            if len(self._alone) < ALONE_MEMO:
                self._alone[scale] = terms
        t = fixed_s
        for x in terms:
            t += x
        return t


def alone_time(
    fixed_s: float, scale: float, parts: Sequence[Part], envelopes: Sequence[Envelope]
) -> float:
    """``fixed_s + sum_p mult_p * max over p's envelope of (scale * K + lat)``, s."""
    t = fixed_s
    for (mult, _, _), env in zip(parts, envelopes, strict=True):
        if env:
            t += mult * max([k * scale + lat for k, lat in env])
    return t


def flow_sums(
    flows: Sequence[Flow], stretch: Stretch, pipelined: bool
) -> list[tuple[float, float]]:
    """``(K_f(x), lat_f)`` of each flow under the stretch vector ``stretch``: its most
    stretched hop (pipelined) or the sum of its hops."""
    if pipelined:
        return [(max([k * stretch[e] for e, k in terms], default=0.0), lat) for terms, lat in flows]
    return [(sum([k * stretch[e] for e, k in terms]), lat) for terms, lat in flows]


def flow_slope(flow: Flow, pipelined: bool) -> float:
    """K_f(1): a flow's seconds per unit alone."""
    if pipelined:
        return max((k for _, k in flow[0]), default=0.0)
    return sum(k for _, k in flow[0])


def envelope(flows: Sequence[Flow], pipelined: bool) -> Envelope:
    """The (K_f(1), latency) pairs of the flows not dominated by another flow."""
    pts = sorted({(flow_slope(f, pipelined), f[1]) for f in flows}, reverse=True)
    out: list[tuple[float, float]] = []
    for k, lat in pts:  # by k descending: keep a flow only if its latency beats all kept
        if not out or lat > max(x[1] for x in out):
            out.append((k, lat))
    return tuple(out)


class _Ones:
    """A read-only all-ones stretch vector: the uncontended case."""

    def __getitem__(self, i: int) -> float:
        return 1.0


ONES = _Ones()
