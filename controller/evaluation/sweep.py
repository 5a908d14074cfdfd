"""Simulation sweeps: attainment against rate, max rate at the SLA percentile (bisection),
latency at fixed rates, on every core (a process pool) or on a Ray cluster.

A *point* is one simulation of one plan at one rate. Points are plain picklable tuples; a
worker process rebuilds the cluster and prices each plan once (cached per process), so
points of one plan cost only their simulation. Bisection runs for every planner at once:
each round evaluates, per planner, ``k`` rates inside its current bracket (k = 1 is plain
bisection; with more workers than planners, k grows so every core is busy) and keeps the
sub-bracket where attainment crosses the target.

With a journal (``evaluation.journal``), each job and simulation point is looked up before it
runs and recorded as it finishes, so a run that dies goes on, when run again, from the jobs
it finished."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from controller.errors import InputError, WorkerLost
from controller.evaluation.journal import MISSING, Journal, job_key
from controller.evaluation.results import point_problem

T = TypeVar("T")
R = TypeVar("R")

# (scenario name, scenario overrides, planner, plan dict, total rate, requests, seed, opts)
Point = tuple[str, dict, str, dict, float, int, int, dict]

_CACHE: dict[tuple, Any] = {}


def _model_for(scen_name: str, overrides: dict, planner: str, plan_d: dict):
    from controller.evaluation.scenarios import scenario
    from controller.inputs.plan_checks import validate_plan_dict
    from controller.sim import build_model

    key = (scen_name, tuple(sorted(overrides.items())), planner)
    hit = _CACHE.get(key)
    if hit is None:
        s = scenario(scen_name, **overrides)
        gkey = ("graph", scen_name, tuple(sorted(overrides.items())))
        if gkey not in _CACHE:
            _CACHE[gkey] = (s.cluster(), s.load())
        g, w = _CACHE[gkey]
        hit = (build_model(validate_plan_dict(plan_d), g, w), w)
        _CACHE[key] = hit
    return hit


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one point; return the figures a sweep keeps (no per-request arrays; the
    attainment of the run's halves for ``maxrate.judge``)."""
    from controller.sim import SimOptions, run_at

    scen_name, overrides, planner, plan_d, rate, n, seed, opts = point
    model, w = _model_for(scen_name, overrides, planner, plan_d)
    keep_timeline = opts.get("keep_timeline", False)  # the sweep's, not the simulator's
    o = SimOptions(seed=seed, **{k: v for k, v in opts.items() if k != "keep_timeline"})
    res = run_at(model, w, rate, n, seed, options=o)
    d = res.to_dict()
    d["halves"] = halves(res.per_request, res.sla)  # the stable rule's (evaluation.maxrate)
    if not keep_timeline:
        d.pop("kv_timeline", None)
    d["planner"] = planner
    d["rate"] = rate
    d["rate_per_gpu"] = rate / model.gpus_used
    return d


def halves(per_request: dict[str, list[float]], sla: dict[str, float]) -> list[list[float]]:
    """[met, requests, slack] of the first half and of the second half of a run's requests
    in arrival order (a simulator's ``per_request``): what ``maxrate.judge`` decides on. A
    request meets the SLA when it finished within the TTFT and TPOT bounds (as
    ``SimResult.attainment`` counts it); its slack is the larger of TTFT and TPOT over their
    bounds (infinite if it never finished), and a half's slack is that ratio at the SLA's
    attainment percentile: at most 1 exactly when the half meets the attainment."""
    import numpy as np

    arr = np.asarray(per_request["arrival_s"], dtype=float)
    ttft = np.asarray(per_request["ttft_s"], dtype=float)
    tpot = np.asarray(per_request["tpot_s"], dtype=float)
    fin = np.asarray(per_request["finish_s"], dtype=float)
    ratio = np.maximum(ttft / sla["ttft_s"], tpot / sla["tpot_s"])
    ratio = np.where(np.isnan(fin) | np.isnan(ratio), np.inf, ratio)
    order = np.argsort(arr, kind="stable")
    cut = len(order) // 2
    out = []
    for part in (order[:cut], order[cut:]):
        r = ratio[part]
        met = int(np.sum(r <= 1.0))
        q = float(np.quantile(r, sla.get("attainment", 0.9), method="higher")) if r.size else 0.0
        out.append([met, int(r.size), q])
    return out


class Runner:
    """Maps points to results in order: in this process (workers = 1), on a process pool,
    or on a Ray cluster (``ray_address``; the optional extra ``heroserve[ray]``). With a
    ``journal``, a job recorded there is read back instead of run, and every job run is
    recorded as soon as it finishes (results then as JSON gives them back: lists, not
    tuples, either way)."""

    def __init__(
        self,
        workers: int = 1,
        ray_address: str | None = None,
        progress: Callable[[str], None] | None = None,
        journal: Journal | None = None,
    ) -> None:
        if workers < 1:
            raise InputError(f"--workers must be at least 1, got {workers}")
        self.workers = workers
        self.progress = progress
        self.journal = journal
        self.done = 0
        self.batch_done = 0
        self.job_seconds = 0.0  # the jobs run (not read back) took this long in their workers
        self.t0 = time.perf_counter()
        self._pool: ProcessPoolExecutor | None = None
        self._ray = None
        if ray_address is not None:
            try:
                import ray  # type: ignore[import-not-found]
            except ImportError:
                raise InputError(
                    "--ray needs the optional extra: pip install 'heroserve[ray]'"
                ) from None
            if not ray.is_initialized():
                local = ray_address == "local"
                # a local instance's workers import what this process imports; a remote
                # cluster must have heroserve installed on its nodes
                env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
                try:
                    ray.init(
                        address=None if local else ray_address,
                        include_dashboard=False,
                        log_to_driver=False,
                        runtime_env=env if local else None,
                    )
                except Exception as e:  # noqa: BLE001 - Ray raises many kinds; report one line
                    raise InputError(f"cannot reach Ray at {ray_address!r}: {e}") from None
            self._ray = ray
            self._remote = ray.remote(timed)
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        elif workers > 1:
            self._pool = ProcessPoolExecutor(max_workers=workers)

    def map(self, points: Sequence[Point], what: str = "") -> list[dict[str, Any]]:
        self.batch_done = 0
        out = []
        for r in self._results(run_point, points, point_problem):
            out.append(r)
            self._tick(what, len(points))
        return out

    def call(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        what: str = "",
        check: Callable[[Any], str | None] | None = None,
    ) -> list[R]:
        """``fn`` over ``items`` in order, on the pool or the Ray cluster like ``map``'s
        points (``fn`` a module-level function, its items and results picklable); jobs such
        as a scenario's plans, which take minutes each at 1,200 servers. Progress per job
        done, not counted as simulations. ``check`` names what is wrong with a result read
        back from the journal (None: nothing), whose job then runs again."""
        out: list[R] = []
        for r in self._results(fn, items, check):
            out.append(r)
            if self.progress:
                self.progress(f"{what}: {len(out)}/{len(items)} done ({self.workers} worker(s))")
        return out

    def _results(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        check: Callable[[Any], str | None] | None = None,
    ) -> Iterable[R]:
        """``fn``'s results over ``items``, in order, as they come: read from the journal
        (those ``check`` passes) or run (on the Ray cluster, the pool, or here) and recorded
        as each finishes, with the seconds it took in its worker."""
        j = self.journal
        keys = [job_key(fn, x) for x in items] if j is not None else []
        got: list[Any] = [MISSING] * len(items) if j is None else [j.get(k, check) for k in keys]
        todo = [i for i, v in enumerate(got) if v is MISSING]
        finished = self._finished(fn, [items[i] for i in todo])  # runs from the first next()
        for done in range(len(items)):
            while got[done] is MISSING:  # results read back before it are told already
                t, (r, seconds) = next(finished)
                i = todo[t]
                self.job_seconds += seconds
                got[i] = j.put(keys[i], r, seconds) if j is not None else r
            yield got[done]

    def _finished(
        self, fn: Callable[[T], R], items: Sequence[T]
    ) -> Iterable[tuple[int, tuple[R, float]]]:
        """(index, (result, seconds in its worker)) of ``fn`` over ``items`` in the order the
        jobs finish."""
        if not items:
            return
        if self._ray is not None:
            remote = self._remote
            index = {remote.remote(fn, x): i for i, x in enumerate(items)}
            pending = list(index)
            while pending:
                ready, pending = self._ray.wait(pending, num_returns=1)
                yield index[ready[0]], self._ray.get(ready[0])
        elif self._pool is not None:
            kept = self.journal.path if self.journal is not None else None
            yield from _pooled(self._pool, fn, items, self.workers, kept)
        else:
            yield from ((i, timed(fn, x)) for i, x in enumerate(items))

    def resumed(self) -> str:
        """What the journal gave this run, for a report's footer: empty without a journal or
        when nothing was read back."""
        j = self.journal
        if j is None or not j.hits:
            return ""
        return (
            f" ({j.hits} jobs read back from the journal {j.path}, which took "
            f"{j.hit_seconds:.0f} s in their workers when they ran; {j.recorded} run here, "
            f"{self.job_seconds:.0f} s)"
        )

    def _tick(self, what: str, total: int) -> None:
        self.done += 1
        self.batch_done += 1
        if self.progress:
            self.progress(
                f"{what}: {self.batch_done}/{total} simulations "
                f"({self.done} so far, {self.workers} worker(s))"
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Bracket:
    lo: float  # a rate known to meet the target (0 at first)
    hi: float  # a rate known to miss it
    att_lo: float = 1.0
    att_hi: float = 0.0


def max_rates(
    runner: Runner,
    make_point: Callable[[str, float], Point],
    guesses: dict[str, float],
    target: float = 0.9,
    rel_tol: float = 0.02,
    max_rounds: int = 12,
) -> dict[str, Bracket]:
    """Largest total rate per planner whose attainment is >= ``target``, to ``rel_tol``.

    Starts from each planner's guess (the plan's predicted rate), grows the bracket by 2x
    until the target is missed, then bisects (k-section with spare workers)."""
    br: dict[str, Bracket] = {}
    probe = dict(guesses)
    # find a rate that misses the target
    for _ in range(max_rounds):
        todo = [p for p in probe if p not in br or br[p].hi == math.inf]
        if not todo:
            break
        res = runner.map([make_point(p, probe[p]) for p in todo], "bracketing max rate")
        for p, r in zip(todo, res, strict=True):
            b = br.setdefault(p, Bracket(0.0, math.inf))
            if r["attainment"] >= target:
                b.lo, b.att_lo = probe[p], r["attainment"]
                probe[p] *= 2.0
            else:
                b.hi, b.att_hi = probe[p], r["attainment"]
        if all(b.hi < math.inf for b in br.values()):
            break
    k = max(1, runner.workers // max(1, len(br)))
    for _ in range(4 * max_rounds):  # ends on rel_tol; this only bounds a pathological curve
        todo = [p for p, b in br.items() if b.hi - b.lo > rel_tol * max(b.hi, 1e-12)]
        if not todo:
            break
        points, owners = [], []
        for p in todo:
            b = br[p]
            for i in range(1, k + 1):
                points.append(make_point(p, b.lo + (b.hi - b.lo) * i / (k + 1)))
                owners.append(p)
        res = runner.map(points, "bisecting max rate")
        for p in todo:
            b = br[p]
            rs = [
                (pt[4], r["attainment"])
                for pt, r, o in zip(points, res, owners, strict=True)
                if o == p
            ]
            for rate, att in sorted(rs):
                if att >= target:
                    if rate > b.lo:
                        b.lo, b.att_lo = rate, att
                else:
                    if rate < b.hi:
                        b.hi, b.att_hi = rate, att
                    break
    return br


def timed(fn: Callable[[T], R], item: T) -> tuple[R, float]:
    """``fn(item)`` and the wall seconds it took, measured where it runs (a worker's time,
    not the caller's wait, which holds the queue)."""
    t0 = time.perf_counter()
    r = fn(item)
    return r, time.perf_counter() - t0


def _pooled(
    pool: ProcessPoolExecutor,
    fn: Callable[[T], R],
    items: Sequence[T],
    workers: int,
    kept_in: Path | None = None,
) -> Iterable[tuple[int, tuple[R, float]]]:
    """(index, (result, seconds)) of ``fn`` over ``items`` on ``pool`` as they finish; a
    worker that died told in one line (``WorkerLost``) rather than as the pool's traceback,
    naming the journal ``kept_in`` that keeps what finished."""
    index = {pool.submit(timed, fn, x): i for i, x in enumerate(items)}
    pending = set(index)
    try:
        while pending:
            ready, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(ready, key=index.__getitem__):
                yield index[f], f.result()
    except BrokenProcessPool:
        kept = (f"; the jobs that finished are kept in {kept_in}, and the same command "
                "goes on from them" if kept_in is not None else "")  # fmt: skip
        raise WorkerLost(
            f"a worker process died ({workers} ran; the system kills one when "
            f"memory runs out): run again with fewer --workers, or beside less{kept}"
        ) from None
    finally:
        for f in pending:
            f.cancel()
