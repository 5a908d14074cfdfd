"""Optimality gap of the HeroServe planner against brute force on small random clusters.

Plans 24 seeded random clusters (4-6 servers of 2 GPUs = 8-12 GPUs, 2 or 3 tracks, a GPU type
drawn per server, prefill and decode servers; two-GPU servers make tensor groups of 4 span
servers, so which servers pair up matters) with ``heroserve`` and ``exhaustive`` and prints, per
cluster and overall, the gap of the predicted per-GPU rate: (exhaustive - heroserve) /
exhaustive. Negative gaps mean HeroServe found a better plan than the exhaustive search's
per-phase objective (it maximises each phase's capacity, not the combined rate).

    .venv/bin/python benchmarks/planner_gap.py [--clusters 24] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import networkx as nx

from controller.errors import InputError
from controller.models import model_spec
from controller.planner import PlannerOptions, plan
from controller.topology.generators import add_server
from controller.topology.graph import add_link, add_switch
from controller.units import gbps
from controller.workload import chatbot, default_sla

# small-memory parts so that the models need tensor parallelism and grouping matters
GPU_TYPES = ["T4", "L4", "V100-32GB", "A100-40GB", "L40"]


def random_cluster(rng: random.Random, k: int) -> nx.Graph:
    n_servers = rng.choice([4, 5, 6])
    n_tracks = rng.choice([2, 3])
    g = nx.Graph(name=f"random{k}")
    sw = [f"t{t}" for t in range(n_tracks)]
    for s in sw:
        add_switch(g, s, tier="access")
    add_switch(g, "core", tier="core")
    for s in sw:
        add_link(g, s, "core", link="ethernet", capacity=gbps(rng.choice([100, 200])))
    roles = ["prefill", "decode"] * 2 + [rng.choice(["prefill", "decode"])] * (n_servers - 4)
    for i in range(n_servers):
        gpu_type = rng.choice(GPU_TYPES)
        for j, gid in enumerate(
            add_server(g, f"srv{i}", gpu_type=gpu_type, n_gpus=2, role=roles[i])
        ):
            track = (j + i) % n_tracks  # servers start on different rails
            add_link(g, gid, sw[track], link="ethernet", capacity=gbps(100))
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    gaps = []
    t_hero = t_exh = 0.0
    print(
        f"{'cluster':>8} {'GPUs':>4} {'model':>11} {'heroserve':>10} {'exhaustive':>10} {'gap':>7}"
    )
    k = 0
    while len(gaps) < a.clusters:
        g = random_cluster(rng, k)
        k += 1
        model = model_spec(rng.choice(["OPT-13B", "LLaMA-3-8B", "OPT-66B"]))
        w, sla = chatbot(n=4000, seed=k), default_sla("chatbot")
        opts = PlannerOptions(seed=a.seed)
        try:
            t0 = time.perf_counter()
            hero = plan(g, model, w, sla, opts, planner="heroserve")
            t1 = time.perf_counter()
            exh = plan(g, model, w, sla, opts, planner="exhaustive")
            t2 = time.perf_counter()
        except InputError as e:  # an infeasible draw: say so and draw again
            print(f"{g.name:>8} skipped: {e}", flush=True)
            continue
        t_hero += t1 - t0
        t_exh += t2 - t1
        h, e = hero.predicted.rate_per_gpu, exh.predicted.rate_per_gpu
        gap = (e - h) / e if e > 0 else 0.0
        gaps.append(gap)
        n = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
        print(f"{g.name:>8} {n:>4} {model.name:>11} {h:>10.4f} {e:>10.4f} {gap:>7.2%}", flush=True)
    print(
        f"\n{len(gaps)} clusters: median gap {statistics.median(gaps):.2%}, "
        f"worst gap {max(gaps):.2%}, best {min(gaps):.2%} (target: median <= 5%)"
    )
    print(
        f"planning time: heroserve {t_hero:.1f} s, exhaustive {t_exh:.1f} s "
        f"({t_exh / max(t_hero, 1e-9):.1f}x)"
    )


if __name__ == "__main__":
    main()
