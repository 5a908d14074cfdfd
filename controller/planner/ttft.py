"""The plan's TTFT as the engines serve it: the deployed prefill instances as one pool behind
the router, each admitting prompts as vLLM's engine core does (``costmodel.prefill_pool``),
run over a fixed sample of Poisson arrivals (docs/costmodel.md, "The engines' admission").

The search ranks deployments by ``combine.deployed_ttft``, the closed form of one FIFO
pipeline per instance: thousands of candidates, microseconds each. The closed form leaves out
two things the engines do, in opposite directions: vLLM starts a batch whenever one of its PP
slots is free, so prompts that come while every slot holds a small batch wait a whole pass
(8tracks-16 chatbot at 0.85 H: 0.41 s closed form, 1.53 s simulated), and the router sends a
prompt to the least loaded instance, which pools their queues (8tracks-16 summarization at
0.95 H: 5.1 s closed form, 2.6 s simulated). The chosen deployment is then checked here,
once; DistServe's low-affinity layouts, a few dozen, are each checked before one is kept
(``colocated.colocated_search``), since their deep pipelines lose most in the check:

- ``pool_ttft``: the SLA's percentile of TTFT at a rate, for given prefill instances;
- ``checked_ttft``: the combination with its TTFT at H from the pool, and H lowered to the
  largest rate at which the pool meets the SLA where it does not at H.
"""

from __future__ import annotations

from dataclasses import replace

from controller.costmodel.prefill_pool import PoolSample, pool_max_rate, pool_ttft_quantile
from controller.models.engines import engine_profile, prefill_admission
from controller.planner.combine import Combination, best_prefill
from controller.planner.evaluate import Evaluator
from controller.planner.results import PhaseResult

# requests of the pool's sample: at least this many, and this many per instance, so that
# each instance serves a few hundred past the warm-up. The 90th percentile of 20,000
# requests has a standard error of about 1% of it (binomial, sqrt(0.9 x 0.1 / 20,000) of
# the probability, over the density there)
POOL_REQUESTS = 20_000
POOL_REQUESTS_PER_INSTANCE = 400


def pool_ttft(ev: Evaluator, stages: list[list[list[str]]], rate: float) -> float:
    """The SLA's percentile of TTFT (s) at ``rate`` requests/s into the prefill instances
    ``stages`` (one list of stages each) as the engines run them; inf where they fall
    behind. O(requests x (stages + log batches)); tens of milliseconds on the testbed."""
    costs, admission, sample = _pool(ev, stages)
    return pool_ttft_quantile(rate, ev.problem.sla.attainment, sample, costs, admission)


def checked_ttft(ev: Evaluator, pre: PhaseResult, comb: Combination) -> Combination:
    """``comb`` with its TTFT at H from the pool of its deployed prefill instances; where
    that misses the SLA's TTFT, with H lowered to the largest rate at which it meets it
    (the decode side keeps its counts: it serves the lower rate too)."""
    stages = [x.stages for x in best_prefill(pre, comb.n_prefill)]
    costs, admission, sample = _pool(ev, stages)
    sla = ev.problem.sla
    ttft = pool_ttft_quantile(comb.rate, sla.attainment, sample, costs, admission)
    if ttft <= sla.ttft_s:
        return replace(comb, ttft_s=ttft)
    rate = pool_max_rate(sla.ttft_s, sla.attainment, sample, costs, admission, comb.rate)
    ttft = pool_ttft_quantile(rate, sla.attainment, sample, costs, admission)
    return replace(comb, rate=rate, rate_per_gpu=rate / comb.gpus_used, ttft_s=ttft)


def _pool(ev: Evaluator, stages: list[list[list[str]]]) -> tuple:
    profile = engine_profile(ev.problem.options.engine or "vllm")
    costs = [ev.stage_cost(ev.prefill_stage_times(s)) for s in stages]
    admission = prefill_admission(profile, len(stages[0]))
    n = max(POOL_REQUESTS, POOL_REQUESTS_PER_INSTANCE * len(stages))
    x, share = ev.input_lengths
    return costs, admission, PoolSample.draw(x, share, n, ev.problem.options.seed)
