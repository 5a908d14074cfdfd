"""Evaluating a placement: the terms of Eqs. 1-15 assembled for instances, phases and plans.

One code path for every planner: planners differ only in how they group GPUs and which
schemes and routes they may use (``Policy``); given groups, ``Evaluator`` prices them the
same way, so their predictions are comparable and the simulator can re-use them.

``Evaluator`` is the entry point: a facade that builds the pricers below, each in its own
module with the caches it owns, and hands every call to the one that owns it (``_On``):

- ``context.PricingContext`` (``ev.ctx``, frozen): the problem, policy, fabrics and shared
  lookups (sizes, compute coefficients, group shapes, pools);
- ``allreduce.AllReducePricer`` (``ev.allreduce``): a group's schemes and all-reduce time
  (Alg. 2, Eqs. 7-11), and the groups forced onto the ring or priced as a made plan chose;
- ``pipeline.PipelinePricer`` (``ev.pipeline``): the pipeline hop (Eq. 6) and chaining groups
  into stages;
- ``instances.InstancePricer`` (``ev.instance``): one instance's TTFT or TPOT side (Eqs.
  2-5, 12-13), from the all-reduce and pipeline pricers;
- ``kvtransfer.KVPricer`` (``ev.kv``): the KV transfer between deployed instances (Eqs.
  14-15);
- ``phases.PhasePricer`` (``ev.phases``): every instance of one role at one (TP, PP) formed
  from a pool's groups and priced (for an engine, those it can place), with the cache of
  twin pods' instances, and phases priced again (at another T_f, under a KV load).

Eq. 1 (which instances to deploy) is ``combine.combine``; the result types are in
``results``.
"""

from __future__ import annotations

from typing import Any

from controller.planner.allreduce import AllReducePricer
from controller.planner.context import PricingContext
from controller.planner.instances import InstancePricer
from controller.planner.kvtransfer import KVPricer
from controller.planner.options import Policy, Problem
from controller.planner.phases import PhasePricer
from controller.planner.pipeline import PipelinePricer


class _On:
    """A facade attribute read from one of its pricers: ``group = _On("allreduce")`` makes
    ``ev.group`` ``ev.allreduce.group``."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.part), self.name)


class Evaluator:
    """Prices groups, instances and phases for one problem and one policy: builds the
    pricing context and the pricers (module docstring) and hands each call to the pricer
    that owns it. Holds no state of its own."""

    def __init__(self, problem: Problem, policy: Policy) -> None:
        self.ctx = ctx = PricingContext.of(problem, policy)
        self.allreduce = AllReducePricer(ctx)
        self.pipeline = PipelinePricer(ctx)
        self.instance = InstancePricer(ctx, self.allreduce, self.pipeline)
        self.kv = KVPricer(ctx)
        self.phases = PhasePricer(ctx, self.allreduce, self.pipeline, self.instance)

    # -- the context: problem, policy, cluster, fabrics, sizes, GPUs, pools ----------------
    problem = _On("ctx")
    policy = _On("ctx")
    g = _On("ctx")
    net = _On("ctx")
    model = _On("ctx")
    ring_fabric = _On("ctx")
    eth_fabric = _On("ctx")
    ina_fabric = _On("ctx")
    mean_in = _On("ctx")
    decode_steps = _On("ctx")
    kv_tokens = _On("ctx")
    kv_share = _On("ctx")
    input_lengths = _On("ctx")
    activation_bytes = _On("ctx")
    prefill_bytes = _On("ctx")
    coeffs = _On("ctx")
    slowest_type = _On("ctx")
    shape = _On("ctx")
    grouping_cache = _On("ctx")
    pool_summary = _On("ctx")
    fit = _On("ctx")

    # -- all-reduce (Alg. 2, Eqs. 7-11) ------------------------------------------------------
    group = _On("allreduce")
    all_ina = _On("allreduce")
    ina_candidates = _On("allreduce")
    ina_bound = _On("allreduce")
    group_cost = _On("allreduce")
    times = _On("allreduce")
    allreduce_time = _On("allreduce")
    planned = _On("allreduce")
    forced_ring = _On("allreduce")
    force_ring = _On("allreduce")
    price_as_planned = _On("allreduce")

    # -- pipeline hops (Eq. 6) ---------------------------------------------------------------
    pipeline_hop_time = _On("pipeline")
    pipeline_hop_times = _On("pipeline")

    # -- instances (Eqs. 2-5, 12-13) ---------------------------------------------------------
    prefill_instance = _On("instance")
    decode_instance = _On("instance")
    decode_step = _On("instance")
    prefill_times = _On("instance")
    prefill_stage_times = _On("instance")
    stage_cost = _On("instance")
    ideal_prefill_rate = _On("instance")
    kv_room_bytes = _On("instance")

    # -- KV transfer (Eqs. 14-15) ------------------------------------------------------------
    kv_transfer = _On("kv")
    kv_pairs = _On("kv")
    kv_load = _On("kv")
    kv_price = _On("kv")
    kv_routed = _On("kv")
    kv_stage_order = _On("kv")

    # -- phases ------------------------------------------------------------------------------
    prefill_phase = _On("phases")
    decode_phase = _On("phases")
    phase_result = _On("phases")
    reevaluate = _On("phases")
    reprice_decode = _On("phases")
    contend_decode = _On("phases")
