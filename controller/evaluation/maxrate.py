"""Maximum rates that hold: a rate meets the SLA's attainment only when the simulation shows
it with confidence and without drift, over several seeds, and a ratio of two maximum rates
is a gain only when its interval excludes 1.

Why: near saturation a queue grows for the whole run, so attainment falls with the run's
length. On testbed summarization, HeroServe's plan at the rate a one-seed search of 2,000
requests called its maximum met 94.5 / 90.4 / 62.2% attainment with 2,000 requests (seeds
0 / 1 / 2) and 7.3 / 7.1 / 2.6% with 26,400 (an audit of the ablation): a short run's
verdict said nothing.

The rule (``judge``), per seed and rate: split the run's requests, in arrival order, into
halves; the first half is the warm-up from an empty cluster. A point may run up to
``2**MAX_DOUBLINGS`` times the scenario's requests (its request lives, 30 at least, so 240);
the rate must hold for that whole horizon. It

- *misses* when the 95% Wilson interval of the second half's attainment lies below the target;
- *meets* when that interval lies above the target and the run does not drift toward it
  before the cap: carried on at the slope between the halves to the cap's length, neither
  the attainment (when the second half is worse than the first beyond the two-proportion
  95% margin) falls below the target nor the slack (the larger of TTFT and TPOT over their
  bounds, at the attainment percentile; ``sweep.halves``) rises above 1: a queue that grows
  slowly shows in its latency long before its attainment falls;
- else is *undecided*, and runs again with twice the requests; at the cap the interval alone
  decides, and one still straddling the target counts as a miss (the reported maximum is a
  rate shown to meet the target, never one merely not refuted).

``search`` bisects each (plan, seed) on its own, so each plan's maximum comes as one rate per
seed (``SEEDS``: three); ``spread`` gives their mean, minimum and maximum, and ``compare`` the
interval of a ratio of two plans' maxima (each seed's bracket [lo, hi] included) and its
verdict: a gain or a loss only when the interval excludes 1, else no difference.

Holds ``Z95``, ``SEEDS``, ``MAX_DOUBLINGS``, ``wilson``, ``judge``, ``Rates``,
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


def judge(first: Sequence[float], second: Sequence[float], target: float,
          remaining: float = 0.0) -> Verdict:  # fmt: skip
    """The verdict of one run from its halves' [met, requests, slack] (``sweep.halves``), as
    the module states it; ``remaining``: how many more half-runs the point may still run
    (0 at the cap, where the verdict is the second half's interval alone)."""
    k1, n1, s1 = int(first[0]), int(first[1]), float(first[2])
    k2, n2, s2 = int(second[0]), int(second[1]), float(second[2])
    lo, hi = wilson(k2, n2)
    if hi < target:
        return "misses"
    if remaining <= 0:
        return "meets" if lo >= target else "misses"
    if n1 <= 0 or n2 <= 0:
        return "undecided"
    p1, p2 = k1 / n1, k2 / n2
    p = (k1 + k2) / (n1 + n2)
    margin = Z95 * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    # the share meeting the SLA, and the slack at the attainment percentile, carried on at
    # the slope between the halves to the cap: a queue still growing would cross the target
    falling = p1 - p2 > margin and p2 - (p1 - p2) * remaining < target
    growing = s2 + max(0.0, s2 - s1) * remaining > 1.0
    return "meets" if lo >= target and not (falling or growing) else "undecided"


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
            left = 2 * (2 ** (MAX_DOUBLINGS - doubling) - 1)  # half-runs of this length to go
            v = judge(r["halves"][0], r["halves"][1], target, left)
            if v != "undecided":
                got[i] = (v == "meets", n[i])
                second = r["halves"][1]
                edge = wilson(int(second[0]), int(second[1]))[1] >= target  # not a clear miss
                out[asks[i][0]].capped += doubling == MAX_DOUBLINGS and v == "misses" and edge
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
    builds a sweep point whose result has ``halves`` (``sweep.run_point``'s);
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
