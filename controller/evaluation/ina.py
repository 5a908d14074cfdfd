"""Fig. 9: aggregation throughput against message size (4 MB to 64 MB).

Every tensor-parallel group of a plan (both phases, TP > 1) runs one all-reduce of ``M`` bytes
per GPU at the same moment on the simulator's fluid network (so groups that share links slow
each other down). Each group runs the option among its candidate policies (the plan's scheme
first, then ring, flat and hierarchical INA: ``sim.model``) that ``SCHEMES`` names: the one
fastest alone at ``M`` bytes, as its GPU agent's scheduler picks by message size (Eq. 16),
INA wherever the cost model prices it, or the ring. The plan's own scheme was chosen for the
phase's message size, which for decode is far below 4 MB. The throughput is the bytes
reduced, ``M`` per group, over the time the last group finishes: the rate at which the
deployment as a whole can aggregate, what the paper's Fig. 9 compares between planners (the
baselines without INA aggregate with the ring, which the figure counts the same way)"""

from __future__ import annotations

import itertools

from controller.sim.model import PlanModel
from controller.sim.network import Activity, FluidNetwork

MB = 1e6
SIZES_MB = (4, 8, 16, 32, 64)


SCHEMES = ("fastest", "ina", "ring")  # how a group picks its option (``aggregation_throughput``)


def _pick(options: list, nbytes: float, scheme: str):
    """``fastest``: the option fastest alone at ``nbytes``; ``ina``: the fastest flat or
    hierarchical INA option the cost model prices for the group (its fastest option when it
    has none); ``ring``: the ring."""
    if scheme == "ina":
        options = [o for o in options if o.scheme != "ring"] or options
    elif scheme == "ring":
        options = [o for o in options if o.scheme == "ring"] or options
    return min(options, key=lambda o: o.time(nbytes))


def aggregation_throughput(
    model: PlanModel, nbytes: float, scheme: str = "fastest"
) -> dict[str, float]:
    """Bytes/s aggregated when every group all-reduces ``nbytes`` at once, each on the
    option ``scheme`` picks (:func:`_pick`); also the mean all-reduce time and the share of
    groups on INA (flat or hierarchical) at that size. The figure draws each scheme, not only
    the plans' choices: on the testbed the plans' rings win at every size, and INA is what
    the figure is about."""
    lk = model.links
    lk.reset()
    events: list = []
    seq = itertools.count()
    net = FluidNetwork(lk, events, lambda: next(seq))
    finish: list[float] = []
    n_ina = 0
    stages = [st for inst in model.prefill + model.decode for st in inst.stages if st.options]
    for st in stages:
        opt = _pick(st.options, nbytes, scheme)
        n_ina += opt.scheme != "ring"
        a = Activity(
            opt.const_s,
            nbytes,
            opt.work(1.0),
            None,
            (opt.bytes_per_byte, nbytes),  # its links' load: each busy share of its time
            finish.append,
            opt.links,
            ("it", id(st), 0),
        )
        net.start(a, 0.0)
    net.run_until_idle()
    if not finish:
        return {"groups": 0, "throughput_Bps": 0.0, "mean_allreduce_s": 0.0, "ina_share": 0.0}
    return {
        "groups": len(finish),
        "throughput_Bps": len(finish) * nbytes / max(finish),
        "mean_allreduce_s": sum(finish) / len(finish),
        "ina_share": n_ina / len(stages),
    }
