"""Maximum rates that hold: a rate meets the SLA's attainment only when the simulation shows
it with confidence and without drift, over several seeds, and a ratio of two maximum rates
is a gain only when its interval excludes 1.

Why: near saturation a queue grows for the whole run, so attainment falls with the run's
length. On testbed summarization, HeroServe's plan at the rate a one-seed search of 2,000
requests called its maximum met 94.5 / 90.4 / 62.2% attainment with 2,000 requests (seeds
0 / 1 / 2) and 7.3 / 7.1 / 2.6% with 26,400 (issue 39): a short run's verdict said nothing.

The rule (``judge``), per seed and rate: split the run's requests, in arrival order, into
halves; the first half is the warm-up from an empty cluster. The rate

- *misses* when the 95% Wilson interval of the second half's attainment lies below the target;
- *meets* when that interval lies above the target and the run does not drift toward it: a
  second half worse than the first by more than the two-proportion 95% margin, and worse by
  enough that one more run length at the same slope would fall below the target, is drift;
- else is *undecided*, and runs again with twice the requests (more request lives), up to
  ``MAX_DOUBLINGS`` times; undecided at that cap, it counts as a miss (the reported maximum
  is a rate shown to meet the target, never one merely not refuted).

``search`` bisects each (plan, seed) on its own, so each plan's maximum comes as one rate per
seed (``SEEDS``: three); ``spread`` gives their mean, minimum and maximum, and ``compare`` the
interval of a ratio of two plans' maxima (each seed's bracket [lo, hi] included) and its
verdict: a gain or a loss only when the interval excludes 1, else no difference.

Holds ``Z95``, ``SEEDS``, ``MAX_DOUBLINGS``, ``wilson``, ``judge``, ``halves``, ``Rates``,
``search``, ``spread`` and ``compare``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from controller.evaluation.sweep import Point, Runner

Z95 = 1.959964  # two-sided 95% standard normal quantile
SEEDS = (0, 1, 2)  # at least three: one seed's run near saturation can say anything
MAX_DOUBLINGS = 3  # a point may run 8x its scenario's requests before it counts as a miss

Verdict = Literal["meets", "misses", "undecided"]


def wilson(ok: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``ok`` / ``n`` (E. B. Wilson, 1927);
    (0, 1) for no trials."""
    if n <= 0:
        return 0.0, 1.0
    p = ok / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def judge(first: tuple[int, int], second: tuple[int, int], target: float) -> Verdict:
    """The verdict of one run from its halves' (met, requests), as the module states it."""
    (k1, n1), (k2, n2) = first, second
    lo, hi = wilson(k2, n2)
    if hi < target:
        return "misses"
    if n1 <= 0 or n2 <= 0:
        return "undecided"
    p1, p2 = k1 / n1, k2 / n2
    p = (k1 + k2) / (n1 + n2)
    margin = Z95 * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    drifting = p1 - p2 > margin and 2 * p2 - p1 < target
    return "meets" if lo >= target and not drifting else "undecided"


def halves(per_request: dict[str, list[float]], sla: dict[str, float]) -> list[list[int]]:
    """[[met, requests] of the first half, [met, requests] of the second] of a run's requests
    in arrival order (a simulator's ``per_request``; a request meets the SLA when it finished
    within the TTFT and TPOT bounds, as ``SimResult.attainment`` counts it)."""
    order = sorted(range(len(per_request["arrival_s"])), key=per_request["arrival_s"].__getitem__)
    ttft, tpot, fin = per_request["ttft_s"], per_request["tpot_s"], per_request["finish_s"]

    def met(i: int) -> bool:  # NaN (never finished) compares False
        return fin[i] == fin[i] and ttft[i] <= sla["ttft_s"] and tpot[i] <= sla["tpot_s"]

    cut = len(order) // 2
    parts = (order[:cut], order[cut:])
    return [[sum(met(i) for i in part), len(part)] for part in parts]


@dataclass
class Rates:
    """One plan's search: per seed, the largest rate shown to meet the target (``lo``) and
    the smallest shown to miss it (``hi``), the requests of the deciding runs, and how many
    points stayed undecided at the cap (counted as misses)."""

    lo: dict[int, float] = field(default_factory=dict)
    hi: dict[int, float] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)  # of the run that set ``lo``
    capped: int = 0
    runs: int = 0


def _verdicts(
    runner: Runner,
    make_point: Callable[[str, float, int, int], Point],
    base_requests: Callable[[str, float], int],
    asks: Sequence[tuple[str, int, float]],
    target: float,
    out: dict[str, Rates],
) -> list[tuple[bool, int]]:
    """(meets, requests of the deciding run) of each (key, seed, rate) in ``asks``: undecided
    points run again with twice the requests, all of a round in one batch."""
    n = [base_requests(k, r) for k, _, r in asks]
    got: list[tuple[bool, int] | None] = [None] * len(asks)
    for doubling in range(MAX_DOUBLINGS + 1):
        todo = [i for i, g in enumerate(got) if g is None]
        if not todo:
            break
        pts = [make_point(asks[i][0], asks[i][2], n[i], asks[i][1]) for i in todo]
        res = runner.map(pts, "max rate (stable rule)")
        for i, r in zip(todo, res, strict=True):
            out[asks[i][0]].runs += 1
            v = judge(tuple(r["halves"][0]), tuple(r["halves"][1]), target)
            if v != "undecided":
                got[i] = (v == "meets", n[i])
            elif doubling == MAX_DOUBLINGS:
                got[i] = (False, n[i])
                out[asks[i][0]].capped += 1
            else:
                n[i] *= 2
    return [g for g in got if g is not None]


def search(
    runner: Runner,
    make_point: Callable[[str, float, int, int], Point],
    base_requests: Callable[[str, float], int],
    guesses: dict[str, float],
    target: float = 0.9,
    rel_tol: float = 0.02,
    seeds: Sequence[int] = SEEDS,
    max_rounds: int = 12,
) -> dict[str, Rates]:
    """Per key of ``guesses`` (a plan; its value the predicted rate) and seed, the bracket
    of its maximum rate by ``judge``'s rule: from the guess, doubled until a miss, then
    bisected until hi - lo <= ``rel_tol`` x hi. ``make_point(key, rate, requests, seed)``
    builds a sweep point whose worker adds ``halves`` (``sweep.run_point`` does);
    ``base_requests(key, rate)`` is a point's first request count."""
    out = {k: Rates() for k in guesses}
    probe = {(k, s): g for k, g in guesses.items() for s in seeds}
    for k, s in probe:
        out[k].hi[s] = math.inf
        out[k].lo[s] = 0.0
    for _ in range(max_rounds):
        todo = [(k, s) for k, s in probe if out[k].hi[s] == math.inf]
        if not todo:
            break
        got = _verdicts(runner, make_point, base_requests,
                        [(k, s, probe[k, s]) for k, s in todo], target, out)  # fmt: skip
        for (k, s), (ok, n) in zip(todo, got, strict=True):
            if ok:
                out[k].lo[s], out[k].requests[s] = probe[k, s], n
                probe[k, s] *= 2.0
            else:
                out[k].hi[s] = probe[k, s]
    for _ in range(4 * max_rounds):  # ends on rel_tol; this only bounds a pathological curve
        todo = [(k, s) for k, s in probe
                if out[k].hi[s] - out[k].lo[s] > rel_tol * max(out[k].hi[s], 1e-12)]  # fmt: skip
        if not todo or any(out[k].hi[s] == math.inf for k, s in todo):
            break
        mids = [(out[k].lo[s] + out[k].hi[s]) / 2 for k, s in todo]
        got = _verdicts(runner, make_point, base_requests,
                        [(k, s, m) for (k, s), m in zip(todo, mids, strict=True)],
                        target, out)  # fmt: skip
        for (k, s), m, (ok, n) in zip(todo, mids, got, strict=True):
            if ok:
                out[k].lo[s], out[k].requests[s] = m, n
            else:
                out[k].hi[s] = m
    return out


def spread(r: Rates) -> dict[str, float]:
    """Mean, minimum and maximum over seeds of a plan's maximum rate (each seed's ``lo``)."""
    v = list(r.lo.values())
    return {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}


def compare(a: Rates, b: Rates) -> dict[str, Any]:
    """The ratio of ``a``'s maximum rate to ``b``'s: its mean-over-mean value, the interval
    every seed's bracket allows (a's smallest lo over b's largest hi, to a's largest hi over
    b's smallest lo) and the verdict: "gain" or "loss" only when the interval excludes 1."""
    mean = spread(a)["mean"] / max(spread(b)["mean"], 1e-300)
    lo = min(a.lo.values()) / max(b.hi.values())
    hi_b = min(b.lo.values())
    hi = max(a.hi.values()) / hi_b if hi_b > 0 else math.inf
    verdict = "gain" if lo > 1.0 else "loss" if hi < 1.0 else "no difference"
    return {"ratio": mean, "low": lo, "high": hi, "verdict": verdict}
