"""Helix on its 24-node cluster (§6.2: 4 A100, 8 L4, 12 T4, one GPU per node, 10 Gb/s;
LLaMA-2-70B): the placement MILP's result, its bound and its time, and the simulated offline
throughput of Helix against its baselines Swarm and separate pipelines (and Petals' placement).

Offline throughput as Helix §6.3 measures it: every request is queued at the start (arrivals
at ``--offered`` times the plan's predicted rate), the run stops at ``--horizon`` simulated
seconds, and the figure is output tokens per second after a warm-up of a fifth of the horizon.
Every planner's plan is simulated on the same requests by controller/related/colocated/.

    .venv/bin/python benchmarks/helix24.py [--time-limit 60] [--horizon 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

from controller.models import model_spec
from controller.related.clusters import helix24
from controller.related.colocated import ColocatedOptions, simulate_colocated
from controller.related.common import RelatedOptions
from controller.related.helix import plan_baseline, plan_helix
from controller.sim import make_requests
from controller.workload import SLA, chatbot

SLA_LOOSE = SLA(5.0, 0.5)  # offline throughput: no latency bound is asked of any planner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="MILP time limit, s")
    ap.add_argument("--horizon", type=float, default=300.0, help="simulated seconds")
    ap.add_argument("--offered", type=float, default=2.0, help="arrivals / predicted rate")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    g = helix24()
    model = model_spec("LLaMA-2-70B")
    w = chatbot(n=5000, seed=a.seed)
    opts = RelatedOptions(time_limit_s=a.time_limit, helix_nodes="gpu", seed=a.seed)

    t0 = time.perf_counter()
    helix = plan_helix(g, model, w, SLA_LOOSE, opts)
    wall = time.perf_counter() - t0
    s = helix.colocated.solver  # type: ignore[union-attr]
    print(f"Helix MILP on helix24 (24 nodes, {model.name}), OR-Tools CP-SAT")
    print(f"  status            {s['status']}")
    print(f"  max flow          {s['objective_tokens_per_s']:.1f} tokens/s")
    print(f"  solver bound      {s['bound_tokens_per_s']:.1f} tokens/s")
    print(f"  compute bound     {s['upper_bound_tokens_per_s']:.1f} tokens/s (Helix's Eq. bound)")
    print(f"  solve time        {s['time_s']:.1f} s (limit {a.time_limit:g} s), plan {wall:.1f} s")
    print(f"  connections       {s['links']} of {s['links_before_pruning']} after pruning")
    heur = ", ".join(f"{k} {v:.0f}" for k, v in s["heuristics_tokens_per_s"].items())
    print(f"  heuristics        {heur} tokens/s (warm start {s['warm_start']})")
    print()

    plans = {"helix": helix}
    for name in ("swarm", "helix-sp", "helix-petals"):
        plans[name] = plan_baseline(name, g, model, w, SLA_LOOSE, opts)
    rate = a.offered * max(p.predicted.rate for p in plans.values())
    n = int(rate * a.horizon) + 1
    reqs = make_requests(w, rate, n, a.seed)
    sim = ColocatedOptions(seed=a.seed, horizon_s=a.horizon, window_after_s=a.horizon / 5)
    print(f"offline throughput: {n} requests at {rate:.2f} req/s, {a.horizon:g} s simulated")
    print(f"{'planner':<14}{'max flow tok/s':>16}{'sim out tok/s':>15}{'vs swarm':>10}"
          f"{'vs sp':>8}{'preempt':>9}{'wall s':>8}")  # fmt: skip
    got, rows = {}, []
    for name, p in plans.items():
        t = time.perf_counter()
        res = simulate_colocated(p, g, w, reqs, sim)
        got[name] = res.window_decode_tokens_per_s
        rows.append((name, p, res, time.perf_counter() - t))
    for name, p, res, took in rows:
        flow = p.colocated.tokens_per_s  # type: ignore[union-attr]
        print(
            f"{name:<14}{flow:>16.0f}{got[name]:>15.1f}{got[name] / got['swarm']:>10.2f}"
            f"{got[name] / got['helix-sp']:>8.2f}{res.preemptions:>9}{took:>8.1f}"
        )
    best = max(got["swarm"], got["helix-sp"])
    print(f"\nhelix / best of swarm and separate pipelines: {got['helix'] / best:.2f}")


if __name__ == "__main__":
    main()
