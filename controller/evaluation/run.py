"""One scenario of the evaluation end to end: plan with every planner, find each plan's max
per-GPU rate at the SLA percentile, trace attainment against rate, measure latency at fixed
rates, aggregation throughput (Fig. 9) and KV memory over time (Fig. 10); write CSV, PNG and
a note that sets the measured ratios next to the paper's."""

from __future__ import annotations

import csv
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from controller.errors import InputError
from controller.evaluation import plots
from controller.evaluation.deployment import deployment_key, simulated_together
from controller.evaluation.ina import MB, SCHEMES, SIZES_MB, aggregation_throughput
from controller.evaluation.scenarios import LIVES, MIN_REQUESTS, PAPER_CLAIMS, Scenario
from controller.evaluation.sweep import Point, Runner, max_rates
from controller.plan import Plan


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    if not rows:
        path.write_text("")
        return path
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def make_plans(s: Scenario, say: Callable[[str], None]) -> tuple[dict, dict[str, str]]:
    from controller.planner import PlannerOptions, plan

    g, model, w, sla = s.cluster(), s.model_spec(), s.load(), s.sla()
    plans, failed = {}, {}
    for i, name in enumerate(s.planners, 1):
        t0 = time.perf_counter()
        # a stage line (cli/progress.py): "planner 2/5: distserve (testbed-chatbot on testbed)"
        say(f"planner {i}/{len(s.planners)}: {name} ({s.name} on {g.name})")
        try:
            plans[name] = plan(g, model, w, sla, PlannerOptions(), planner=name)
        except InputError as e:
            failed[name] = str(e)  # a planner without a feasible plan is a result
            continue
        say(
            f"  {name}: planned in {time.perf_counter() - t0:.1f}s, "
            f"predicted {plans[name].predicted.rate_per_gpu:.4g} req/s per GPU"
        )
    if not plans:
        raise InputError(f"no planner found a feasible plan for {s.name}: {failed}")
    return plans, failed


def evaluate(
    s: Scenario,
    out: Path,
    runner: Runner,
    say: Callable[[str], None] = lambda m: None,
    seed: int = 0,
    online_scheduler: bool = False,
    fast: bool = False,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plans").mkdir(exist_ok=True)
    plans, failed = make_plans(s, say)
    written: list[Path] = []  # every file this run writes, for the summary and the CLI
    for name, p in plans.items():
        p.save(out / "plans" / f"{name}.json")
        written.append(out / "plans" / f"{name}.json")
    overrides = {"servers": s.servers} if s.servers else {}
    dicts = {n: p.to_dict() for n, p in plans.items()}
    twin_of = same_deployments(plans, online_scheduler)
    if len(set(twin_of.values())) < len(twin_of):
        say("simulating each deployment once: " + "; ".join(
            f"{n} as {r}" for n, r in twin_of.items() if n != r))  # fmt: skip
    gpus = {n: p.predicted.gpus_used for n, p in plans.items()}
    target = s.sla().attainment

    def point(planner: str, rate: float, **extra) -> Point:
        opts = {"online_scheduler": online_scheduler and planner == "heroserve", **extra}
        if fast:  # the simulator's fast path (SimOptions.fast), what 1,200 servers need
            opts["fast"] = True
        return (s.name, overrides, planner, dicts[planner], rate, s.requests_at(rate), seed, opts)

    # 1. max rate at the SLA percentile (Fig. 7a/c, 8)
    sims = [n for n in plans if twin_of[n] == n]  # the planners whose plans are simulated
    say(f"sweep 1/3: max rate at {target:.0%} attainment, bisection for {len(sims)} "
        "deployment(s)")  # fmt: skip
    found = max_rates(runner, point, {n: plans[n].predicted.rate for n in sims}, target)
    br = {n: found[twin_of[n]] for n in plans}
    ref = "heroserve" if "heroserve" in br else next(iter(br))
    ref_rate = br[ref].lo / gpus[ref]
    max_rows = []
    for n, b in br.items():
        per_gpu = b.lo / gpus[n]
        max_rows.append(
            {
                "planner": n,
                "gpus_used": gpus[n],
                "max_rate": b.lo,
                "max_rate_per_gpu": per_gpu,
                "attainment_at_max": b.att_lo,
                "first_miss_rate_per_gpu": b.hi / gpus[n] if math.isfinite(b.hi) else math.inf,
                "predicted_rate_per_gpu": plans[n].predicted.rate_per_gpu,
                f"{ref}_over_this": ref_rate / per_gpu if per_gpu > 0 else math.inf,
                "prefill": _shape(plans[n].prefill),
                "decode": _shape(plans[n].decode) + f" B={plans[n].decode.batch_size}",
                "ina_groups": sum(  # flat or hierarchical: aggregated in switches
                    g.scheme in ("ina", "hier")
                    for ph in (plans[n].prefill, plans[n].decode)
                    for g in ph.groups
                ),
                "simulated_as": twin_of[n],
            }
        )
    written.append(_write_csv(out / "max_rate.csv", max_rows))

    # 2. attainment against per-GPU rate
    fr = [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5][: s.curve_points]
    pts = [
        point(n, br[n].lo * f if br[n].lo > 0 else plans[n].predicted.rate * f)
        for n in sims
        for f in fr
    ]
    say(f"sweep 2/3: attainment curves, {len(pts)} points")
    res = _for_twins(runner.map(pts, "attainment curve"), twin_of)
    curve_rows, curves = [], {}
    for r in res:
        curve_rows.append(_row(r))
        curves.setdefault(r["planner"], []).append((r["rate_per_gpu"], r["attainment"]))
    written.append(_write_csv(out / "attainment.csv", curve_rows))
    written += plots.attainment(
        curves, target, f"{s.name}: SLA attainment ({s.model})", out / "attainment.png"
    )

    # 3. latency at fixed rates
    pts = [point(n, rpg * gpus[n]) for rpg in s.fixed_rates_per_gpu for n in sims]
    say(f"sweep 3/3: latency at fixed rates, {len(pts)} points")
    lat_rows = []
    for r in _for_twins(runner.map(pts, "latency at fixed rates"), twin_of):
        row = _row(r)
        row["rate_per_gpu_nominal"] = round(r["rate_per_gpu"], 6)
        lat_rows.append(row)
    for row in lat_rows:  # nominal rate as listed by the scenario
        row["rate_per_gpu_nominal"] = min(
            s.fixed_rates_per_gpu, key=lambda x, row=row: abs(x - row["rate_per_gpu"])
        )
    written.append(_write_csv(out / "latency.csv", lat_rows))
    if lat_rows:
        sla = s.sla()
        written += plots.latency_bars(
            lat_rows, f"{s.name}: latency", out / "latency.png", (sla.ttft_s, sla.tpot_s)
        )

    # 4. aggregation throughput against message size (Fig. 9)
    from controller.evaluation.sweep import _model_for

    ina_rows = []
    for n, scheme in itertools.product(br, SCHEMES):
        model, _ = _model_for(s.name, overrides, twin_of[n], dicts[twin_of[n]])
        rows = []
        for mb in SIZES_MB:
            t = aggregation_throughput(model, mb * MB, scheme)
            rows.append(
                {
                    "planner": n,
                    "scheme": scheme,
                    "message_mb": mb,
                    "throughput_GBps": t["throughput_Bps"] / 1e9,
                    "groups": t["groups"],
                    "ina_share": t["ina_share"],
                    "mean_allreduce_s": t["mean_allreduce_s"],
                    "simulated_as": twin_of[n],
                }
            )
        if scheme != "ina" or any(r["ina_share"] > 0 for r in rows):  # INA where priced
            ina_rows += rows
    written.append(_write_csv(out / "ina_throughput.csv", ina_rows))
    written += plots.ina_throughput(
        ina_rows, f"{s.name}: aggregation throughput", out / "ina_throughput.png"
    )

    # 5. KV memory over time (Fig. 10)
    kv_rows = []
    if s.kv_rate_per_gpu > 0:
        pts = [point(n, s.kv_rate_per_gpu * gpus[n], keep_timeline=True) for n in sims]
        series = {}
        for r in _for_twins(runner.map(pts, "KV memory timeline"), twin_of):
            series[r["planner"]] = r["kv_timeline"]
            kv_rows += [
                {"planner": r["planner"], "time_s": t, "kv_fraction": u}
                for t, u in r["kv_timeline"]
            ]
        written.append(_write_csv(out / "kv_memory.csv", kv_rows))
        written += plots.kv_memory(
            series,
            f"{s.name}: KV cache at {s.kv_rate_per_gpu} req/s per GPU",
            out / "kv_memory.png",
        )

    summary = {
        "scenario": asdict(s) | {"cluster": s.cluster().name},
        "failed_planners": failed,
        "max_rate": max_rows,
        "paper": PAPER_CLAIMS.get(s.name) or PAPER_CLAIMS.get(s.topology),
        "online_scheduler": online_scheduler,
        "fast": fast,
        "seed": seed,
    }
    written += [out / "summary.json", out / "notes.md"]
    summary["written"] = sorted(str(f.relative_to(out)) for f in written)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "notes.md").write_text(notes(s, max_rows, lat_rows, ina_rows, failed, ref))
    return summary


def same_deployments(plans: dict[str, Plan], online_scheduler: bool) -> dict[str, str]:
    """Each planner mapped to the first planner (in ``plans``' order) whose plan is the same
    deployment (``deployment.deployment_key``): one search of the max rate, one attainment
    curve, serves them all. With the online scheduler, HeroServe's points run it and the
    others' do not, so its plan is then no other's twin. O(plans x plan size)."""
    first: dict[tuple[str, bool], str] = {}
    return {
        n: first.setdefault((deployment_key(p), online_scheduler and n == "heroserve"), n)
        for n, p in plans.items()
    }


def _for_twins(results: list[dict[str, Any]], twin_of: dict[str, str]) -> list[dict[str, Any]]:
    """``results`` of the simulated planners, each repeated under the name of every planner
    that ``twin_of`` maps to it (in ``twin_of``'s order, for each simulated planner in turn)."""
    out = []
    for r in results:
        out += [{**r, "planner": n} for n, rep in twin_of.items() if rep == r["planner"]]
    return out


def _shape(phase) -> str:
    return f"{phase.tp}x{phase.pp} x{len(phase.instances)}"


def _order(rows: list[dict]) -> str:
    """Planners best first; equal rates (to 0.1%) joined by '='."""
    rows = sorted(rows, key=lambda r: -r["max_rate_per_gpu"])
    out = ""
    for i, r in enumerate(rows):
        if i:
            prev = rows[i - 1]["max_rate_per_gpu"]
            tie = abs(prev - r["max_rate_per_gpu"]) <= 1e-3 * max(prev, 1e-12)
            out += " = " if tie else " > "
        out += r["planner"]
    return out


def _row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "planner": r["planner"],
        "rate": r["rate"],
        "rate_per_gpu": r["rate_per_gpu"],
        "attainment": r["attainment"],
        "ttft_mean_s": r["ttft_s"]["mean"],
        "ttft_p90_s": r["ttft_s"]["p90"],
        "tpot_mean_s": r["tpot_s"]["mean"],
        "tpot_p90_s": r["tpot_s"]["p90"],
        "kv_xfer_mean_s": r["kv_transfer_s"]["mean"],
        "ina_throughput_GBps": r["ina_throughput_Bps"] / 1e9,
        "peak_kv_fraction": r["peak_kv_fraction"],
        "eth_util_max": r["ethernet_util"]["max"],
        "finished": r["finished"],
        "requests": r["requests"],
    }


def notes(s: Scenario, max_rows, lat_rows, ina_rows, failed, ref: str) -> str:
    by = {r["planner"]: r for r in max_rows}
    lines = [f"# {s.name}: measured against the paper\n"]
    lines.append(
        f"Cluster {s.cluster().name}, {s.model}, {s.workload}, SLA TTFT "
        f"{s.sla().ttft_s} s / TPOT {s.sla().tpot_s} s at {s.sla().attainment:.0%}, "
        + (
            f"{s.requests} requests per point.\n"
            if s.requests
            else f"requests per point: those arriving in {LIVES} request lives "
            f"({s.life_s():.0f} s each) at the point's rate, at least {MIN_REQUESTS}.\n"
        )
    )
    lines.append(
        "| planner | plan (prefill / decode) | GPUs | predicted rate/GPU | "
        f"max rate/GPU at 90% | {ref}/this | paper |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    claims = PAPER_CLAIMS.get(s.name)
    for r in max_rows:
        paper = claims.get(r["planner"], "") if isinstance(claims, dict) else ""
        lines.append(
            f"| {r['planner']} | {r['prefill']} / {r['decode']} | {r['gpus_used']} | "
            f"{r['predicted_rate_per_gpu']:.4g} | {r['max_rate_per_gpu']:.4g} | "
            f"{r[f'{ref}_over_this']:.2f}x | {f'{paper}x' if paper else ''} |"
        )
    order = _order(max_rows)
    twins = simulated_together(max_rows)
    if twins:
        lines.append("\nOne simulation served planners whose plans are the same deployment: "
                     + "; ".join(", ".join(t) for t in twins) + ".")  # fmt: skip
    paper_order = " > ".join(
        p for p in ("heroserve", "ds-switchml", "ds-atp", "distserve") if p in by
    )
    lines.append("")
    lines.append(f"Measured order (best first): {order}.")
    lines.append(f"Paper's order: {paper_order}.")
    if order == paper_order:
        lines.append("The paper's order is reproduced.")
    else:
        why = []
        if twins:
            why.append(
                "planners that produced the same deployment, simulated once, and therefore "
                "the same simulated rate: " + "; ".join(", ".join(t) for t in twins)
            )
        for r in max_rows:
            why.append(
                f"{r['planner']}: {r['ina_groups']} INA group(s), predicted "
                f"{r['predicted_rate_per_gpu']:.4g} req/s/GPU, simulated "
                f"{r['max_rate_per_gpu']:.4g}"
            )
        lines.append("The paper's order is NOT reproduced. Why, in numbers:\n")
        lines += [f"- {w}" for w in why]
    life = s.life_s()
    short = [r["planner"] for r in max_rows
             if r["max_rate"] > 0 and s.requests_at(r["max_rate"]) / r["max_rate"]
             < LIVES * life]  # fmt: skip
    if short:
        lines.append(
            f"\nWARNING: at the max rate, {s.requests} requests arrive within less than "
            f"{LIVES} request lives ({life:.0f} s each) for {', '.join(short)}: the cluster "
            "does not reach steady state and the max rate is overstated; raise --requests."
        )
    if failed:
        lines.append(
            "\nPlanners without a feasible plan: "
            + "; ".join(f"{k}: {v}" for k, v in failed.items())
        )
    if lat_rows and ref in by:
        lines.append("\nTPOT at fixed per-GPU rates (mean; lower is better):\n")
        for rate in sorted({r["rate_per_gpu_nominal"] for r in lat_rows}):
            row = {r["planner"]: r for r in lat_rows if r["rate_per_gpu_nominal"] == rate}
            if ref not in row:
                continue
            cells = []
            for p, r in row.items():
                if p == ref:
                    continue
                red = 1 - row[ref]["tpot_mean_s"] / r["tpot_mean_s"] if r["tpot_mean_s"] else 0.0
                cells.append(f"{p} {r['tpot_mean_s'] * 1e3:.1f} ms ({red:+.1%} by {ref})")
            lines.append(
                f"- {rate:g} req/s/GPU: {ref} {row[ref]['tpot_mean_s'] * 1e3:.1f} ms; "
                + "; ".join(cells)
            )
        lines.append(f"\nPaper: {PAPER_CLAIMS['tpot']}.")
    if ina_rows:
        for scheme, what in (("fastest", "each group's fastest"), ("ina", "INA where priced")):
            at64 = [r for r in ina_rows if r["message_mb"] == 64 and r["scheme"] == scheme]
            if at64:
                lines.append(
                    f"\nAggregation throughput at 64 MB, {what} (GB/s): "
                    + ", ".join(f"{r['planner']} {r['throughput_GBps']:.2f}" for r in at64)
                )
        lines.append(f"Paper: {PAPER_CLAIMS['ina']}.")
    return "\n".join(lines) + "\n"
