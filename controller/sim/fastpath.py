"""The simulator's fast path (docs/simulator.md "The fast path"): the same rules as
:class:`~controller.sim.engine.Simulator`, compiled (``fastcore.py``), with every stage
iteration and KV transfer taking its time alone. It leaves out one thing, link contention,
and is for clusters whose network the run does not load: ``bench_sim.py --paths
event,fast`` and ``tests/controller/sim/test_fastpath.py`` measure its agreement with the
event simulator.

Holds :func:`unsupported` (why a run cannot take the fast path), :class:`FastTables` and
:func:`fast_tables` (a priced plan as the core's arrays: per stage, the seconds besides
compute at every batch; per prefill/decode pair, the KV transfer's envelope),
:class:`FastSimulator` (``Simulator``'s interface) and :func:`run_fast` (one run, reported
as the simulator reports).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from controller.costmodel.compute import prefill_layer_time
from controller.errors import InputError
from controller.sim import fastcore as core
from controller.sim.engine import prefill_limits, route_draws
from controller.sim.metrics import RunRecord, SimResult, summarise
from controller.sim.model import InstanceModel, PlanModel
from controller.sim.options import SimOptions
from controller.workload import Request


def unsupported(options: SimOptions) -> str | None:
    """Why a run with ``options`` cannot take the fast path (None: it can). The online
    scheduler reads link bytes as they are booked and ``"stage"`` admission has no limit in
    flight; neither is compiled."""
    if options.online_scheduler:
        return "the fast path does not run the online scheduler"
    if options.prefill_admission != "engine":
        return "the fast path runs the engines' prefill admission only"
    return None


@dataclass
class FastTables:
    """A priced plan as the core's arrays (``fastcore.PrefillSide`` / ``DecodeSide``
    parameters), reusable by every run of a sweep. ``max_tokens``: the largest prefill batch
    the tables cover; ``kv_pairs``: prefill/decode pairs priced."""

    pre: dict[str, np.ndarray]
    dec: dict[str, np.ndarray]
    max_tokens: int
    kv_pairs: int


def _layers_per_stage(im: InstanceModel) -> float:
    layers = {st.layers for st in im.stages}
    if len(layers) != 1:  # the plan schema and build_model make every stage L / P_pipe
        raise ValueError("the fast path needs equal layers per stage")
    return layers.pop()


def _prefill(m: PlanModel, options: SimOptions, max_prompt: int) -> dict[str, np.ndarray]:
    """The prefill side's parameters, its stage extras for batches of 0 up to the larger of
    the token budget and ``max_prompt`` tokens (a prompt past the budget runs alone)."""
    n = len(m.prefill)
    width = max(im.pp for im in m.prefill)
    limits = np.array([prefill_limits(m, im, options) for im in m.prefill], dtype=float)
    max_tokens = int(max(limits[:, 0].max(), max_prompt))
    tokens = np.arange(max_tokens + 1, dtype=float)
    extra = np.zeros((n, width, max_tokens + 1))
    abc = np.zeros((n, 3))
    for p, im in enumerate(m.prefill):
        layers = _layers_per_stage(im)
        for s, st in enumerate(im.stages):
            extra[p, s] = m.stage_extra_times(st, tokens)
        co = m.evaluator.coeffs(im.gpu_type)
        c = prefill_layer_time(co, m.model, im.tp, 0.0, 0.0)
        abc[p] = (
            layers * (prefill_layer_time(co, m.model, im.tp, 1.0, 0.0) - c),
            layers * (prefill_layer_time(co, m.model, im.tp, 0.0, 1.0) - c),
            layers * c,
        )
    return {
        "nst": np.array([im.pp for im in m.prefill]),
        "abc": abc,
        "speed": limits[:, 3].copy(),
        "budget": limits[:, 0].astype(np.int64),
        "slots": limits[:, 1].astype(np.int64),
        "max_requests": limits[:, 2].astype(np.int64),
        "extra": extra,
    }


def _decode(m: PlanModel) -> dict[str, np.ndarray]:
    n = len(m.decode)
    width = max(im.pp for im in m.decode)
    most = max(im.max_batch for im in m.decode)
    batch = np.arange(most + 1, dtype=float)
    extra = np.zeros((n, width, most + 1))
    for d, im in enumerate(m.decode):
        for s, st in enumerate(im.stages):
            extra[d, s] = m.stage_extra_times(st, batch)
    nst = np.array([im.pp for im in m.decode])
    return {
        "nst": nst,
        "layers": np.array([_layers_per_stage(im) for im in m.decode]),
        "terms": np.array([im.decode_terms for im in m.decode], dtype=float),
        "cap": np.array([im.kv_capacity_tokens for im in m.decode], dtype=float),
        "max_batch": np.array([im.max_batch for im in m.decode]),
        "gpus": np.array([im.tp * im.pp for im in m.decode], dtype=float),
        "mb0": np.concatenate([[0], np.cumsum(nst)[:-1]]).astype(np.int64),
        "extra": extra,
    }


def _kv(m: PlanModel, dec: dict[str, np.ndarray]) -> int:
    """Every pair's KV envelope (mult * K s per token, mult * lat s) into ``dec``, from its
    own routes (``PlanModel.kv``; pairs of one shape do not share them: on 2tracks-1,200
    the core's equal-cost routes give pairs of one shape times up to 1.67x apart). Returns
    the pairs priced."""
    env: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for p in range(len(m.prefill)):
        for d in range(len(m.decode)):
            work = m.kv(p, d).work
            (mult, _, _), points = work.parts[0], work.envelopes[0]
            env[p, d] = [(mult * k, mult * lat) for k, lat in points]
    width = max(len(v) for v in env.values())
    kv_k = np.zeros((len(m.prefill), len(m.decode), width))
    kv_l = np.zeros_like(kv_k)
    for (p, d), points in env.items():
        for e, (k, lat) in enumerate(points):
            kv_k[p, d, e], kv_l[p, d, e] = k, lat
    dec["kv_k"], dec["kv_l"] = kv_k, kv_l
    return len(env)


def fast_tables(m: PlanModel, options: SimOptions, max_prompt: int) -> FastTables:
    """The core's tables for ``m`` with prompts up to ``max_prompt`` tokens."""
    pre = _prefill(m, options, max_prompt)
    dec = _decode(m)
    pairs = _kv(m, dec)
    return FastTables(pre, dec, pre["extra"].shape[2] - 1, pairs)


class FastSimulator:
    """``Simulator``'s interface on the fast path: ``FastSimulator(model, options).run(
    requests)``; the tables are built on the first run and kept on the priced plan
    (``PlanModel.derived``) for the next (a sweep)."""

    def __init__(self, model: PlanModel, options: SimOptions | None = None) -> None:
        self.m = model
        self.o = options or SimOptions()
        why = unsupported(self.o)
        if why:
            raise InputError(why)

    def run(self, requests: list[Request]) -> SimResult:
        return self.run_arrays(
            np.array([r.arrival_s for r in requests], dtype=float),
            np.array([r.input_tokens for r in requests], dtype=np.int64),
            np.array([r.output_tokens for r in requests], dtype=np.int64),
        )

    def run_arrays(self, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray) -> SimResult:
        """One run of requests given as arrays (``sim.request_arrays``)."""
        if len(inputs) == 0:
            raise InputError("no requests to simulate")
        longest = int(np.max(inputs))
        o = self.o
        key = f"fast_tables:{o.prefill_token_budget}:{o.prefill_max_requests}"
        tables = self.m.derived.get(key)
        if not isinstance(tables, FastTables) or tables.max_tokens < longest:
            tables = self.m.derived[key] = fast_tables(self.m, o, longest)
        return run_fast(self.m, tables, arrival, inputs, outputs, self.o)


def run_fast(
    m: PlanModel,
    tables: FastTables,
    arrival: np.ndarray,
    inputs: np.ndarray,
    outputs: np.ndarray,
    options: SimOptions | None = None,
) -> SimResult:
    """One run of ``len(arrival)`` requests (arrival s, input and output tokens each) on the
    fast path, reported as :func:`~controller.sim.metrics.summarise` reports a run."""
    o = options or SimOptions()
    why = unsupported(o)
    if why:
        raise InputError(why)
    n = len(arrival)
    if n == 0:
        raise InputError("no requests to simulate")
    t0 = time.perf_counter()
    order = np.argsort(np.asarray(arrival, dtype=float), kind="stable")
    inp = np.asarray(inputs, dtype=np.int64)[order]
    if int(inp.max()) > tables.max_tokens:
        raise InputError(
            f"a prompt of {int(inp.max())} tokens is past the fast path's tables "
            f"({tables.max_tokens}); build them with max_prompt at least that"
        )
    nan = np.full(n, math.nan)
    minus = np.full(n, -1, dtype=np.int64)
    out = np.asarray(outputs, dtype=np.int64)[order]
    req = core.Requests(
        np.asarray(arrival, dtype=float)[order], inp, out, nan.copy(), nan.copy(),
        nan.copy(), nan.copy(), minus.copy(), minus.copy(), out - 1,
        np.zeros(n, dtype=np.int64), minus.copy(), minus.copy(),
        route_draws(o.seed, 0, n, len(m.prefill), o.route_choices)[order],
        route_draws(o.seed, 1, n, len(m.decode), o.route_choices)[order],
    )  # fmt: skip
    pre = _prefill_state(tables, n)
    dec = _decode_state(tables)
    ctr = np.zeros(core.N_COUNTERS, dtype=np.int64)
    acc = np.zeros(core.N_ACCUMULATORS)
    timeline = np.zeros((2 * o.kv_samples + 1, 2))
    opts = np.array(
        [m.model.kv_bytes_per_token(), o.swap_bytes_per_s, o.kv_samples],
        dtype=float,
    )
    end, kept = core.run_core(req, pre, dec, ctr, acc, timeline, opts)
    ina, ar, use = _statistics(m, pre, dec, tables)
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)  # each request's place in the sorted run
    record = RunRecord(
        np.asarray(arrival, dtype=float), req.start_pf[back], req.first[back],
        req.kv_done[back], req.finish[back], np.asarray(outputs), float(end),
        float(acc[core.Q_AREA]), float(acc[core.SYS_AREA]), ina, ar,
        use, float(acc[core.PEAK_GPU]), float(acc[core.PEAK_FRAC]),
        int(ctr[core.OVERFLOW]), int(ctr[core.PREEMPTIONS]), 0,
        [(float(t), float(f)) for t, f in timeline[:kept]],
    )  # fmt: skip
    return summarise(m, record, time.perf_counter() - t0, int(ctr[core.EVENTS]))


def _prefill_state(t: FastTables, n: int) -> core.PrefillSide:
    k = len(t.pre["nst"])
    width = int(t.pre["nst"].max())
    ints = [np.zeros(k, dtype=np.int64) for _ in range(3)]
    return core.PrefillSide(
        **t.pre,
        q_head=np.full(k, -1, dtype=np.int64), q_tail=np.full(k, -1, dtype=np.int64),
        work=np.zeros(k), requests=ints[0], batches=ints[1], free=np.zeros((k, width)),
        b_head=np.zeros(n, dtype=np.int64), b_size=np.zeros(n, dtype=np.int64),
        b_tok=np.zeros(n, dtype=np.int64), n_batches=ints[2], n_tokens=np.zeros(k),
    )  # fmt: skip


def _decode_state(t: FastTables) -> core.DecodeSide:
    k = len(t.dec["nst"])
    width = int(t.dec["nst"].max())
    mbs = int(t.dec["nst"].sum())
    most = int(t.dec["max_batch"].max())

    def heads() -> np.ndarray:
        return np.full(k, -1, dtype=np.int64)

    return core.DecodeSide(
        **t.dec,
        members=np.zeros(k, dtype=np.int64), reserved=np.zeros(k), held=np.zeros(k),
        swapping=np.zeros(k, dtype=np.int64), free=np.zeros((k, width)),
        p_head=heads(), p_tail=heads(), w_head=heads(), w_tail=heads(), s_head=heads(),
        s_tail=heads(), mb_count=np.zeros(mbs, dtype=np.int64), mb_ctx=np.zeros(mbs),
        mb_step=np.zeros(mbs, dtype=np.int64), mb_run=np.zeros(mbs, dtype=np.bool_),
        mb_end=np.zeros((mbs, most), dtype=np.int64),
        mb_req=np.zeros((mbs, most), dtype=np.int64), n_passes=np.zeros(k, dtype=np.int64),
        n_batched=np.zeros(k), kv_tokens=np.zeros(t.dec["kv_k"].shape[:2]),
    )  # fmt: skip


def _statistics(
    m: PlanModel, pre: core.PrefillSide, dec: core.DecodeSide, t: FastTables
) -> tuple[float, float, dict[str, int]]:
    """(INA bytes, all-reduce bytes, iterations per policy) of the run, as the simulator
    counts them per stage iteration, with the all-reduce bytes booked on the plan's links
    (``Links.bytes``, which ``summarise`` reads), and each pair's KV bytes on its routes."""
    links = m.links
    links.reset()
    ina = ar = 0.0
    use: dict[str, int] = {}
    sides = ((m.prefill, pre.n_batches, pre.n_tokens), (m.decode, dec.n_passes, dec.n_batched))
    for instances, iterations, tokens in sides:
        for i, im in enumerate(instances):
            nbytes = m.message_bytes(float(tokens[i]))
            for st in im.stages:
                if not st.options:
                    continue
                opt = st.options[0]
                moved = st.allreduces * nbytes
                ar += moved
                if opt.scheme != "ring":
                    ina += moved
                use[opt.use_key] = use.get(opt.use_key, 0) + int(iterations[i])
                for e, b in opt.bytes_per_byte.items():
                    links.bytes[e] += b * moved
    for (p, d), tok in np.ndenumerate(dec.kv_tokens):
        if tok > 0:
            for e, b in m.kv(p, d).bytes_per_token.items():
                links.bytes[e] += b * tok
    return ina, ar, use
