"""What INA is worth on the built-in `l40s-rack` (docs/ina-map.md): the simulated maximum
SLA-meeting rate of three plans per seed, over several seeds, with their spread.

- ``heroserve``: HeroServe's plan (INA or ring per group, as the planner chose);
- ``heroserve-ring``: the same plan with every INA group (flat or hierarchical) run as NCCL's
  ring: the same layout, batches and GPUs, so the ratio to it is INA's share alone;
- ``distserve``: DistServe's plan (NCCL ring, TP inside a server), the ring-only baseline.

Each seed draws its own workload sample and plans again; each plan's maximum rate is found
as `heroserve compare` finds it (``related.compare.sla_rate``: doubling then bisection, each
point's arrivals lasting ``--lives`` request lives at the SLA, within [300, 20000] requests;
``--steps`` bisection steps). Every plan of a seed meets the same arrivals at a given rate.
A rate is known to its bracket: the highest rate that met the SLA and the lowest above it
that did not. A ratio is called a gain only when, on every seed, the numerator's rate over the
top of the denominator's bracket exceeds 1 (the ratio's least value the runs allow).

    PYTHONPATH=. .venv/bin/python benchmarks/ina_rack.py [--model OPT-175B] [--seeds 0,1,2]
        [--ina-lanes NAME] [--lives 10]

``--ina-lanes`` takes the names of the cost model's ``INA_LANES``
(controller/costmodel/netparams.py), default ``DEFAULT_INA_LANES``.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time

PLANS = ("heroserve", "heroserve-ring", "distserve")


def ring_only(plan):
    """A copy of ``plan`` whose INA groups (flat or hierarchical) run NCCL's ring."""
    out = copy.deepcopy(plan)
    for gr in out.prefill.groups + out.decode.groups:
        if gr.scheme != "ring":
            gr.scheme, gr.switch, gr.slots, gr.rails = "ring", None, None, []
            gr.allreduce_s = gr.ring_s
            gr.reason = "INA removed (benchmarks/ina_rack.py)"
    return out


def parser() -> argparse.ArgumentParser:
    """The command line; ``--ina-lanes`` offers exactly the cost model's lane formats."""
    from controller.costmodel.netparams import DEFAULT_INA_LANES, INA_LANES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="l40s-rack")
    ap.add_argument("--model", default="OPT-175B")
    ap.add_argument("--workload", default="chatbot", choices=("chatbot", "summarization"))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (at least 3)")
    ap.add_argument("--ina-lanes", default=DEFAULT_INA_LANES, choices=tuple(INA_LANES))
    ap.add_argument("--lives", type=int, default=10, help="request lives per simulated point")
    ap.add_argument("--steps", type=int, default=9, help="bisection steps (6: compare's)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    from controller.cli.planners import REGISTRY, Options
    from controller.costmodel.netparams import NetParams
    from controller.errors import InputError
    from controller.models import model_spec
    from controller.planner.options import PlannerOptions
    from controller.related.compare import attainment_at_rate, sla_rate
    from controller.topology import resolve_topology
    from controller.workload import default_sla, resolve_workload

    try:
        seeds = [int(s) for s in a.seeds.split(",")]
        g = resolve_topology(a.topology)
        model = model_spec(a.model)
    except (ValueError, InputError) as e:
        print(f"ina_rack: {e}", file=sys.stderr)
        return 2
    if len(seeds) < 3 or not 1 <= a.lives <= 1000 or not 1 <= a.steps <= 30:
        print(
            "ina_rack: give at least 3 seeds, --lives in 1..1000, --steps in 1..30", file=sys.stderr
        )
        return 2
    sla = default_sla(a.workload)
    net = NetParams(ina_lanes=a.ina_lanes)
    print(
        f"{g.name}, {model.name}, {a.workload}, SLA TTFT {sla.ttft_s} s / TPOT {sla.tpot_s} s, "
        f"INA lanes {a.ina_lanes}, {a.lives} request lives per point"
    )
    rates: dict[str, list[float]] = {k: [] for k in PLANS}
    tops: dict[str, list[float]] = {k: [] for k in PLANS}  # the lowest failing rate above
    t0 = time.perf_counter()
    for seed in seeds:
        workload = resolve_workload(a.workload, seed=seed)
        life = float(workload.mean_output) * sla.tpot_s

        def count(rate: float, life: float = life) -> int:
            return int(min(20000, max(300, math.ceil(rate * a.lives * life))))

        opts = Options(planner=PlannerOptions(seed=seed, net=net))
        hero = REGISTRY["heroserve"].plan(g, model, workload, sla, opts)
        plans = {
            "heroserve": hero,
            "heroserve-ring": ring_only(hero),
            "distserve": REGISTRY["distserve"].plan(g, model, workload, sla, opts),
        }
        ina = sum(gr.scheme != "ring" for gr in hero.prefill.groups + hero.decode.groups)
        line = [f"seed {seed}: heroserve has {ina} INA group(s)"]
        for name, p in plans.items():
            at = attainment_at_rate(p, g, workload, count, seed, sla.attainment)
            tried: dict[float, float] = {}

            def seen(rate: float, at=at, tried=tried) -> float:
                tried[rate] = at(rate)
                return tried[rate]

            rate, _ = sla_rate(seen, p.predicted.rate, sla.attainment, a.steps)
            rates[name].append(rate)
            tops[name].append(min((r for r, v in tried.items() if r > rate and v < sla.attainment),
                                  default=math.inf))  # fmt: skip
            pred = "" if name == "heroserve-ring" else f" (predicted {p.predicted.rate:.3f})"
            line.append(f"{name} {rate:.3f}-{tops[name][-1]:.3f}{pred}")
        print("  " + "; ".join(line), flush=True)
    print(
        f"\nmaximum SLA-meeting rate, req/s, over seeds {a.seeds} "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    for name in PLANS:
        r = rates[name]
        print(
            f"  {name:15} mean {statistics.mean(r):.3f}  min {min(r):.3f}  max {max(r):.3f}  "
            f"sd {statistics.stdev(r):.3f}"
        )
    for base in ("heroserve-ring", "distserve"):
        ratios = [h / b for h, b in zip(rates["heroserve"], rates[base], strict=True)]
        least = [h / t for h, t in zip(rates["heroserve"], tops[base], strict=True)]
        verdict = "a gain" if min(least) > 1 else "not shown to be a gain"
        print(
            f"  heroserve / {base}: per seed "
            + ", ".join(f"{x:.3f}" for x in ratios)
            + f"; mean {statistics.mean(ratios):.3f}, range [{min(ratios):.3f}, "
            f"{max(ratios):.3f}]; least the brackets allow {min(least):.3f}: {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
