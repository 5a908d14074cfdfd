"""``heroserve simulate``: run a plan in the simulator and print what it is worth.

Bad input (a missing or malformed plan, a plan for another topology, a rate of 0 or below)
prints one line naming the problem and exits with status 2."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from controller.errors import InputError


class _Parser(argparse.ArgumentParser):
    """argparse that raises InputError (one line, exit 2) instead of printing usage."""

    def error(self, message: str):  # type: ignore[override]
        raise InputError(message)


def _number(kind: type, what: str, positive: bool = True):
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {s!r} is not a {kind.__name__}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{what} must be finite, got {s}")
        if positive and v <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, got {s}")
        return v

    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="heroserve simulate",
        description="Simulate a plan on its cluster: SLA attainment, TTFT/TPOT percentiles, "
        "INA throughput, peak KV-cache memory.",
    )
    p.add_argument("--plan", required=True, help="a plan JSON file (heroserve plan --json)")
    p.add_argument("--rate", required=True, type=_number(float, "rate"), help="requests/s")
    p.add_argument("--per-gpu", action="store_true", help="--rate is per GPU used by the plan")
    p.add_argument("--requests", type=_number(int, "--requests"), default=2000)
    p.add_argument(
        "--workload",
        default=None,
        help="chatbot | summarization | a .csv/.json trace (default: the plan's workload)",
    )
    p.add_argument("--topology", default=None, help="default: the plan's topology")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cv", type=_number(float, "--cv"), default=1.0, help="inter-arrival CV (1: Poisson)"
    )
    p.add_argument(
        "--online-scheduler", action="store_true", help="run the online scheduler (DESIGN §8)"
    )
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    return p


def load_plan(path: str):
    from controller.plan import Plan

    p = Path(path)
    if not p.is_file():
        raise InputError(f"plan file {path!r} does not exist")
    try:
        return Plan.load(p)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise InputError(f"{path}: not a plan ({type(e).__name__}: {e})") from None


def resolve_for_plan(plan, topology: str | None, workload: str | None):
    from controller.topology import resolve_topology
    from controller.workload import resolve_workload

    topo = topology or plan.topology
    try:
        g = resolve_topology(topo)
    except InputError as e:
        if topology is None:
            raise InputError(f"plan's topology {topo!r} is not built in: pass --topology") from e
        raise
    w = resolve_workload(workload or (plan.workload if plan.workload else "chatbot"))
    return g, w


def run(argv: Sequence[str]) -> int:
    from controller.sim import SimOptions, build_model, make_requests
    from controller.sim.engine import Simulator

    a = parser().parse_args(list(argv))
    plan = load_plan(a.plan)
    if plan.layout == "colocated":  # the seed planners' plans (controller/sim/colocated.py)
        from controller.related.cli import run_colocated

        return run_colocated(a, plan)
    g, w = resolve_for_plan(plan, a.topology, a.workload)
    model = build_model(plan, g, w)
    rate = a.rate * model.gpus_used if a.per_gpu else a.rate
    reqs = make_requests(w, rate, a.requests, a.seed, a.cv)
    print(
        f"simulating {a.requests} {w.name} requests at {rate:.4g} req/s "
        f"({rate / model.gpus_used:.4g} per GPU, {model.gpus_used} GPUs) on {g.name}, "
        f"plan by {plan.planner}{', online scheduler on' if a.online_scheduler else ''}",
        file=sys.stderr,
    )
    res = Simulator(model, SimOptions(online_scheduler=a.online_scheduler, seed=a.seed)).run(reqs)
    print(report(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res.to_dict(), indent=1) + "\n")
        print(f"result written to {a.json}")
    return 0


def report(res) -> str:
    ms = 1e3
    lines = [
        f"requests        {res.finished}/{res.requests} finished in {res.duration_s:.1f} s "
        f"(offered {res.offered_rate:.4g} req/s, {res.offered_rate / res.gpus_used:.4g} per GPU)",
        f"SLA attainment  {res.attainment:.1%} (TTFT <= {res.sla['ttft_s']} s and "
        f"TPOT <= {res.sla['tpot_s']} s)",
    ]
    for name, d in (("TTFT", res.ttft_s), ("TPOT", res.tpot_s), ("KV xfer", res.kv_transfer_s)):
        lines.append(
            f"{name:<15} mean {d['mean'] * ms:8.1f} ms  p50 {d['p50'] * ms:8.1f}  "
            f"p90 {d['p90'] * ms:8.1f}  p99 {d['p99'] * ms:8.1f}"
        )
    lines += [
        f"INA throughput  {res.ina_throughput_Bps / 1e9:.3f} GB/s of all-reduce messages "
        f"(all schemes {res.allreduce_throughput_Bps / 1e9:.3f} GB/s)",
        f"policies        {', '.join(f'{k} x{v}' for k, v in res.policy_use.items()) or 'none'}",
        f"peak KV cache   {res.peak_kv_bytes_per_gpu / 1e9:.2f} GB per GPU "
        f"({res.peak_kv_fraction:.0%} of the room)",
        f"Ethernet util   mean {res.ethernet_util['mean']:.1%}  max {res.ethernet_util['max']:.1%}"
        f"  cv {res.ethernet_util['cv']:.2f}",
        f"simulated       {res.events} events in {res.wall_s:.2f} s "
        f"({res.requests_per_wall_s:.0f} requests per wall second)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    try:
        return run(argv)
    except InputError as e:
        print(f"heroserve simulate: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("heroserve simulate: interrupted", file=sys.stderr)
        return 130
