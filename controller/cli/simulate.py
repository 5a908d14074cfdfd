"""``heroserve simulate``: run a plan in the simulator and print what it is worth.

Bad input (a missing or malformed plan, a plan for another topology, a rate of 0 or below,
more work than the bounds of controller/inputs/limits.py allow) prints one line naming the
problem and exits with status 2."""

from __future__ import annotations

import argparse
import json
import sys

from controller.cli.common import offered_work
from controller.cli.config import SimulateCommand
from controller.errors import InputError
from controller.inputs.args import write_text
from controller.inputs.flags import add_flags


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Simulate a plan on its cluster: SLA attainment, TTFT/TPOT percentiles, "
        "INA throughput, peak KV-cache memory."
    )
    add_flags(p, SimulateCommand)


def run(a: argparse.Namespace) -> int:
    from controller.cli.common import plan_and_workload, profile_compute, say_extrapolated
    from controller.cli.related import run_colocated
    from controller.inputs.plan_checks import load_plan
    from controller.models import model_spec
    from controller.sim import SimOptions, build_model, simulator_for

    plan = load_plan(a.plan)
    if plan.layout == "colocated":  # the seed planners' plans (controller/related/colocated/)
        return run_colocated(a, plan)
    g, w = plan_and_workload(plan, a.topology, a.workload, a.plan)
    compute, fit = profile_compute(a.profile, model_spec(plan.model), g)
    say_extrapolated(fit, plan, w)
    model = build_model(plan, g, w, compute)
    rate, reqs = offered_work(a, plan, w, model.gpus_used)
    print(
        f"simulating {a.requests} {w.name} requests at {rate:.4g} req/s "
        f"({rate / model.gpus_used:.4g} per GPU, {model.gpus_used} GPUs) on {g.name}, "
        f"plan by {plan.planner}{', online scheduler on' if a.online_scheduler else ''}",
        file=sys.stderr,
    )
    if a.fast and (a.exact or a.online_scheduler):
        raise InputError("--fast runs neither --exact nor --online-scheduler")
    opts = SimOptions(
        online_scheduler=a.online_scheduler, seed=a.seed, shortcuts=not a.exact, fast=a.fast
    )
    res = simulator_for(model, opts).run(reqs)
    print(report(res))
    if a.json:
        write_text(a.json, json.dumps(res.to_dict(), indent=1) + "\n", "--json")
        print(f"result written to {a.json}")
    return 0


def report(res) -> str:
    """The result for a reader: every figure with its unit; times of the simulated cluster
    are labelled "simulated", the simulator's own run time "wall-clock"."""
    ms = 1e3
    lines = [
        f"requests          {res.finished}/{res.requests} finished in {res.duration_s:.1f} s "
        f"simulated time (offered {res.offered_rate:.4g} req/s, "
        f"{res.offered_rate / res.gpus_used:.4g} req/s per GPU)",
        f"SLA attainment    {res.attainment:.1%} (TTFT <= {res.sla['ttft_s']} s and "
        f"TPOT <= {res.sla['tpot_s']} s)",
    ]
    for name, d in (("TTFT", res.ttft_s), ("TPOT", res.tpot_s), ("KV xfer", res.kv_transfer_s)):
        lines.append(
            f"{name + ' (ms)':<17} mean {d['mean'] * ms:8.1f}  p50 {d['p50'] * ms:8.1f}  "
            f"p90 {d['p90'] * ms:8.1f}  p99 {d['p99'] * ms:8.1f}"
        )
    lines += [
        f"INA throughput    {res.ina_throughput_Bps / 1e9:.3f} GB/s of all-reduce messages "
        f"(all schemes {res.allreduce_throughput_Bps / 1e9:.3f} GB/s)",
        f"policies          {', '.join(f'{k} x{v}' for k, v in res.policy_use.items()) or 'none'}",
        f"peak KV cache     {res.peak_kv_bytes_per_gpu / 1e9:.2f} GB per GPU "
        f"({res.peak_kv_fraction:.0%} of the room)",
        f"Ethernet util     mean {res.ethernet_util['mean']:.1%}  "
        f"max {res.ethernet_util['max']:.1%}  cv {res.ethernet_util['cv']:.2f}",
        f"simulator         {res.events} events in {res.wall_s:.2f} s wall-clock "
        f"({res.requests_per_wall_s:.0f} requests per wall-clock second)",
    ]
    return "\n".join(lines)
