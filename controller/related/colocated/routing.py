"""Request routing of the colocated simulator: which pipeline serves a request.

Either every request gets its own pipeline (Helix's per-request pipelines through the
max-flow graph, picked by IWRR or Swarm's rule; both skip nodes whose estimated KV use
would pass the high-water mark, reserving Helix's estimate of prompt plus mean output), or a
fixed replica's, picked by a request mapper.

Holds :class:`IWRR` and :func:`integer_weights` (interleaved weighted round-robin),
:class:`Router` (the interface the engine calls), :class:`FlowRouter` (Helix, Swarm) and
:class:`ReplicaRouter` (rr, wrr, si, assignment, and the heterogeneous paper's os, mb).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from controller.errors import InputError
from controller.related.colocated.model import (
    SOURCE,
    ColocatedModel,
    RequestState,
    SimNode,
    Stage,
)
from controller.related.costeff_configs import workload_class
from controller.related.hetero_mapper import Mapper

IWRR_MAX_WEIGHT = 100  # flows become integer IWRR weights of at most this (1% resolution)


class IWRR:
    """Interleaved weighted round-robin: in round r every candidate whose weight is at least r
    gets one turn, so each is picked in proportion to its weight without bursts."""

    def __init__(self, candidates: Sequence[Any], weights: Sequence[int]) -> None:
        if not candidates or len(candidates) != len(weights) or min(weights) < 1:
            raise ValueError("IWRR needs candidates with weights of at least 1")
        self.order = [
            c
            for r in range(1, max(weights) + 1)
            for c, w in zip(candidates, weights, strict=True)
            if w >= r
        ]
        self.pos = 0

    def pick(self, ok: Callable[[Any], bool] | None = None) -> Any:
        """The next candidate (skipping those ``ok`` rejects), or None after a full cycle."""
        n = len(self.order)
        for _ in range(n):
            c = self.order[self.pos]
            self.pos = (self.pos + 1) % n
            if ok is None or ok(c):
                return c
        return None


def integer_weights(values: Sequence[float]) -> list[int]:
    """Positive reals as IWRR weights: proportional, the largest IWRR_MAX_WEIGHT, each >= 1."""
    top = max(values)
    return [max(1, round(IWRR_MAX_WEIGHT * v / top)) for v in values]


class Router:
    """Picks pipelines. ``per_request``: a pipeline per request, dispatched from the
    coordinator's queue when one fits; else fixed replicas, each with its own FCFS queue."""

    per_request = True

    def __init__(self, model: ColocatedModel, rng: random.Random) -> None:
        self.m = model
        self.rng = rng  # the run's: ties and predictions draw from one stream, in event order

    def route(self, r: RequestState) -> list[Stage] | None:
        raise NotImplementedError

    def replica(self, r: RequestState) -> int:
        raise NotImplementedError

    def done(self, r: RequestState) -> None:
        """A request finished (or was preempted): release what the policy books."""


class FlowRouter(Router):
    """Helix (IWRR over the max-flow solution) or Swarm (the least loaded next node per unit
    of throughput). Both mask nodes whose estimated KV use would pass the high-water mark."""

    def __init__(self, model: ColocatedModel, rng: random.Random, policy: str) -> None:
        super().__init__(model, rng)
        m = model
        self.policy = policy
        self.high = float(m.col.params.get("high_water", 1.0))
        self.L = m.perf.model.layers
        succ: dict[str, list[tuple[str, float]]] = {}
        for f in m.col.flows:
            if f.dst == "sink":
                continue
            if policy == "iwrr" and f.flow <= 0:
                continue
            succ.setdefault(f.src, []).append((f.dst, f.flow))
        self.succ = {
            v: [m.by_name[d] for d, _ in c] for v, c in succ.items()
        }  # vertex -> node indices
        self.iwrr = {
            v: IWRR([m.by_name[d] for d, _ in c], integer_weights([w for _, w in c]))
            for v, c in succ.items()
            if policy == "iwrr"
        }
        self.mean_out = m.stats.mean_out

    def _fits(self, r: RequestState, node: SimNode, lo: int, hi: int) -> bool:
        est = (r.inp + max(self.mean_out, r.gen + 1)) * node.kv_bpt_layer * (hi - lo)
        return node.kv_est + est <= self.high * node.kv_cap

    def route(self, r: RequestState) -> list[Stage] | None:
        nodes = self.m.nodes
        covered, v, pipe = 0, SOURCE, []
        while covered < self.L:

            def ok(i: int, covered: int = covered) -> bool:
                n = nodes[i]
                return n.start <= covered < n.end and self._fits(r, n, covered, n.end)

            if self.policy == "iwrr":
                it = self.iwrr.get(v)
                i = it.pick(ok) if it is not None else None
            else:
                cands = [i for i in self.succ.get(v, []) if ok(i)]
                i = min(
                    cands,
                    key=lambda i: ((len(nodes[i].residents) + 1) / max(nodes[i].tokens_per_s, 1e-9),
                                   self.rng.random()),
                ) if cands else None  # fmt: skip
            if i is None:
                return None
            n = nodes[i]
            pipe.append((i, covered, n.end))
            covered = n.end
            v = n.name
        return pipe


class ReplicaRouter(Router):
    """Fixed replicas picked by a mapper: ``rr``, ``wrr`` (weights: ``params['weights']``,
    else the replicas' predicted rates), ``si`` (every request to the first replica),
    ``assignment`` (the cost-efficiency planner's shares per workload class, IWRR within a
    class) or the heterogeneous paper's workload mappers ``os`` and ``mb``
    (``controller.related.hetero_mapper``)."""

    per_request = False

    def __init__(self, model: ColocatedModel, rng: random.Random, policy: str) -> None:
        super().__init__(model, rng)
        m = model
        col = m.col
        self.policy = policy
        self.pipes = []
        for rep in col.replicas:
            pipe, covered = [], 0
            for x in rep.nodes:
                i = m.by_name[x]
                pipe.append((i, covered, m.nodes[i].end))
                covered = m.nodes[i].end
            self.pipes.append(pipe)
        n = len(self.pipes)
        self.rr = 0
        if policy == "wrr":
            w = col.params.get("weights") or [rep.rate for rep in col.replicas]
            if len(w) != n or min(w) <= 0:
                raise InputError("wrr needs one positive weight per replica")
            self.iwrr = IWRR(list(range(n)), integer_weights(w))
        elif policy == "assignment":
            self.classes = _classes(col.params)
            self.by_cls = {}
            for c in self.classes:
                share = [rep.share.get(c, 0.0) for rep in col.replicas]
                idx = [k for k in range(n) if share[k] > 0]
                if idx:
                    self.by_cls[c] = IWRR(idx, integer_weights([share[k] for k in idx]))
        elif policy in ("os", "mb"):
            self.mapper = Mapper.from_params(col.params, n, policy, rng)
        elif policy not in ("rr", "si"):
            raise InputError(f"unknown request mapper {policy!r}")

    def replica(self, r: RequestState) -> int:
        p = self.policy
        if p == "rr":
            k = self.rr
            self.rr = (self.rr + 1) % len(self.pipes)
            return k
        if p == "si":
            return 0
        if p == "wrr":
            return self.iwrr.pick()
        if p == "assignment":
            r.cls = workload_class(r.inp, r.out)
            it = self.by_cls.get(r.cls)
            if it is None:  # a class the planner saw no request of: the largest replica
                return max(range(len(self.pipes)), key=lambda k: self.m.col.replicas[k].rate)
            return it.pick()
        k, r.work, r.pred_out = self.mapper.assign(r.inp)
        return k

    def done(self, r: RequestState) -> None:
        if self.policy in ("os", "mb") and r.replica >= 0 and r.work:
            self.mapper.release(r.replica, r.work, r.inp, r.pred_out)
            r.work = 0.0


def _classes(params: dict) -> list[str]:
    return list(params.get("classes", {}).keys())
