"""How a prefill instance admits requests, against the planner's TTFT: for each scenario, at
fractions of HeroServe's predicted H, the planner's 90th-percentile TTFT (one request a pass
through a FIFO pipeline, ``combine.deployed_ttft``) beside the simulator's under each
admission rule (``SimOptions.prefill_admission``, docs/simulator.md "Prefill"):

- ``one/pass``: one request a batch, a batch whenever the first stage is free (the
  planner's model, as a simulator run: a token budget of 1);
- ``stage``: the simulator's default, everything waiting up to 2,048 tokens when the first
  stage is free;
- ``engine``: vLLM's engine core (at most PP batches in flight) under the export's request
  limit, ``--max-num-seqs`` at least PP and 256 (``models.engines.in_flight``);
- ``engine N``: the same with ``--max-num-seqs N`` (``--limits``).

Each point prints the SLA's attainment and the p90 and mean TTFT (s), 30 request lives.

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_admission.py
        [--scenarios testbed-chatbot,8tracks-chatbot:16] [--loads 0.8,1.0] [--limits 12,48]
"""

from __future__ import annotations

import argparse
import time

from controller.evaluation.scenarios import SCENARIOS
from controller.planner import PlannerOptions, plan
from controller.planner.combine import deployed_ttft
from controller.planner.evaluate import Evaluator
from controller.planner.heroserve import POLICY as HEROSERVE
from controller.planner.options import Problem
from controller.sim import SimOptions, Simulator, build_model, make_requests


def rules(limits: list[int]) -> dict[str, SimOptions]:
    out = {
        "one/pass": SimOptions(prefill_token_budget=1, prefill_admission="stage"),
        "stage": SimOptions(prefill_admission="stage"),
        "engine": SimOptions(prefill_admission="engine"),
    }
    for n in limits:
        out[f"engine {n}"] = SimOptions(prefill_admission="engine", prefill_max_requests=n)
    return out


def scenario(spec: str) -> tuple:
    """``name`` or ``name:servers``: the scenario planned, its prefill instances priced, H,
    the simulator's model of the plan and the requests a point; prints the table's head."""
    name, _, servers = spec.partition(":")
    base = SCENARIOS[name]
    sc = type(base)(**{**base.__dict__, "servers": int(servers)}) if servers else base
    g, load = sc.cluster(), sc.load()
    p = plan(g, sc.model_spec(), load, sc.sla(), PlannerOptions())
    ev = Evaluator(Problem(g, sc.model_spec(), load, sc.sla()), HEROSERVE)
    chosen = [ev.prefill_instance(i.stages) for i in p.prefill.instances]
    h, model = p.predicted.rate, build_model(p, g, load)
    n = sc.requests_at(h)
    print(
        f"{spec}: H {h:.3f} req/s, {len(chosen)} prefill instance(s) TP {p.prefill.tp} x PP "
        f"{p.prefill.pp}, {n} requests a point",
        flush=True,
    )
    return sc, p, chosen, h, model, n, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default="testbed-chatbot,8tracks-chatbot:16")
    ap.add_argument("--loads", default="0.8,1.0", help="fractions of H")
    ap.add_argument("--limits", default="", help="other --max-num-seqs to try")
    a = ap.parse_args()
    limits = [int(x) for x in a.limits.split(",") if x]
    for spec in a.scenarios.split(","):
        sc, p, chosen, h, model, n, load = scenario(spec)
        for f in (float(x) for x in a.loads.split(",")):
            pred = deployed_ttft(chosen, f * h, sc.sla().ttft_s)
            print(f"  {f:.2f} H  planner      ttft p90 {pred:8.3f}", flush=True)
            for label, opts in rules(limits).items():
                t0 = time.process_time()
                r = Simulator(model, opts).run(make_requests(load, f * h, n, seed=0))
                print(
                    f"  {f:.2f} H  {label:12s} ttft p90 {r.ttft_s['p90']:8.3f} mean "
                    f"{r.ttft_s['mean']:8.3f}  attainment {r.attainment:.4f}  "
                    f"({time.process_time() - t0:.0f} CPU s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
