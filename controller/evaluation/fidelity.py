"""``heroserve fidelity``: the paper's claims beside the project's figures.

For each claim of the HeroServe paper (Fig. 2's aggregation delays, Fig. 7-8's scalability
ratios, the TPOT reductions, Fig. 9's aggregation throughput) the report gives what the
project's cost model predicts, in both cost modes (``pipelined``, the default, and ``paper``,
the paper's Eqs. 7-11 as written), what the simulator measured where ``heroserve evaluate``
has run (its ``summary.json`` files), the free-INA upper bound (every all-reduce HeroServe may
aggregate in the network costs nothing), the ablation of the ratio, predicted and simulated
(``ablation_report``), and why the figures differ. Nothing here is tuned: the parameters are
the cost model's, each with its source in docs/costmodel.md.

    heroserve fidelity [--out fidelity.md] [--eval-dir eval] [--servers 1200] [--quick]
                       [--workers N] [--ray ADDRESS] [--journal FILE] [--fresh]
                       [--sim-requests 20000] [--requests N]
                       [--section ablation]

Each scenario is planned (every planner, both cost modes) as one job of the runner
(``Runner.call``: local processes, or Ray), and so is each scenario's ablation.

Holds ``Case`` and ``cases`` (the scenarios at the report's size), Fig. 2's figures
(``fig2_delays``, ``fig2_full``), ``report`` and ``ablation_only``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import networkx as nx

from controller.costmodel.ina import collection_time, ina_pattern
from controller.costmodel.netparams import NetParams
from controller.costmodel.network import flow_times
from controller.errors import InputError
from controller.evaluation.ablation_report import replace_section, section, section_span
from controller.evaluation.deployment import deployment_key, simulated_together
from controller.evaluation.scenarios import Scenario, scenario
from controller.evaluation.sweep import Runner
from controller.evaluation.why_text import WHY
from controller.plan import Plan
from controller.planner import BASELINES, PlannerOptions, plan
from controller.planner.options import DEFAULT_TIME_LIMIT_S
from controller.topology.generators import fig2, paper_cores
from controller.units import MB

SIM_REQUESTS = 20_000  # the ablation's budget: most requests a simulation point may run

MODES = ("pipelined", "paper")
SAME_SPACE = ["distserve", "ds-atp", "ds-switchml"]  # the paper's three baselines
ONE_PLAN = " (one plan)"  # the three baselines' plans are one deployment (``one_plan``)
BASELINE_HEAD = " / ".join(SAME_SPACE)


def one_plan(ps: dict[str, Plan | None]) -> bool:
    """Whether the paper's three baselines planned one deployment (``deployment_key``): then
    the tables show them as one column (their INA, allowed on every group as the paper
    integrates ATP and SwitchML into DistServe, won no group of DistServe's placement)."""
    plans = [ps.get(b) for b in SAME_SPACE]
    return all(p is not None for p in plans) and len({deployment_key(p) for p in plans}) == 1


def _baseline_cell(cells: list[str], one: bool) -> str:
    """The three baselines' ratios as one cell: one figure when they are one plan."""
    return cells[0] + ONE_PLAN if one else " / ".join(cells)


PAPER_RATIOS = {
    "testbed-chatbot": {"distserve": 1.53, "ds-atp": 1.42, "ds-switchml": 1.33},
    "testbed-summarization": {"distserve": 1.68, "ds-atp": 1.58, "ds-switchml": 1.35},
    "8tracks": "1.09x-1.83x over the three baselines",
    "2tracks": "1.12x-1.94x over the three baselines",
}


@dataclass(frozen=True)
class Case:
    """A scenario of ``evaluation.scenarios`` at the report's size: its name
    (testbed-chatbot, 2tracks-summarization, ...) and the overrides that size its cluster."""

    name: str
    overrides: dict = field(default_factory=dict)

    def scenario(self) -> Scenario:
        return scenario(self.name, **self.overrides)

    def make(self) -> nx.Graph:
        return self.scenario().cluster()


def _track_servers(servers: int, unit: int) -> int:
    return max(unit, servers // unit * unit)


def cases(servers: int) -> list[Case]:
    """The testbed's two scenarios, then each track cluster's, ``servers`` rounded down to
    whole units of 6 (2tracks) and 16 servers (8tracks), with the paper's core switches
    scaled to that size (``topology.generators.paper_cores``: 27 and 280 at 1,200 servers) but at
    least 4 (2tracks) and 16 (8tracks), so that a small 8tracks keeps its 1:1 core."""
    out = [Case("testbed-chatbot"), Case("testbed-summarization")]
    for topo, (unit, least) in (("2tracks", (6, 4)), ("8tracks", (16, 16))):
        n = _track_servers(servers, unit)
        cores = max(least, paper_cores(topo, n))
        for w in ("chatbot", "summarization"):
            out.append(Case(f"{topo}-{w}", {"servers": n, "cores": cores}))
    return out


def fig2_delays(mode: str) -> tuple[float, float]:
    """Fig. 2: collecting 1 MB from {gn2, gn3} at the core S1 over Ethernet only, and at the
    access switch S2 with gn2 relaying over NVLink (FP16 lanes, no packet headers, as the
    paper counts), in ``mode``. Seconds."""
    net = NetParams(cost_mode=mode, ina_lanes="fp16", ina_overhead_bytes=0)
    g = fig2()
    homo_f, het_f = net.fabric(g, relay=False), net.fabric(g)
    homo = ina_pattern(homo_f, ["gn2", "gn3"], "S1", MB, net)
    het = ina_pattern(het_f, ["gn2", "gn3"], "S2", MB, net)
    if net.as_written:  # Eqs. 9-10: each member's path alone, no latency
        return collection_time(homo_f, homo, MB, net), collection_time(het_f, het, MB, net)
    t_homo = max(flow_times(homo_f, [(p, MB) for p in homo.paths.values()]))
    t_het = max(flow_times(het_f, [(p, MB) for p in het.paths.values()]))
    return t_homo, t_het


def fig2_full(mode: str, lanes: str) -> tuple[float, float]:
    """Fig. 2's two aggregations priced in full, Eq. 8's T_col + T_agg + T_dis (pipelined:
    overlapped, with the host's synchronisation), in ``lanes`` on the wire: ``fp16`` without
    headers, any other lane format with the project's packet framing; the paper's mode counts
    the FP16 message whatever the lanes. Seconds (homogeneous, heterogeneous)."""
    net = NetParams(cost_mode=mode, ina_lanes=lanes)
    if lanes == "fp16":
        net = replace(net, ina_overhead_bytes=0)
    g = fig2()
    homo_f, het_f = net.fabric(g, relay=False), net.fabric(g)
    homo = ina_pattern(homo_f, ["gn2", "gn3"], "S1", MB, net)
    het = ina_pattern(het_f, ["gn2", "gn3"], "S2", MB, net)
    return homo.time(homo_f, MB), het.time(het_f, MB)


def _plans(case: Case, mode: str, free: bool = False) -> dict[str, Plan | None]:
    s = case.scenario()
    g, model, w, sla = s.cluster(), s.model_spec(), s.load(), s.sla()
    opts = PlannerOptions(net=NetParams(cost_mode=mode), free_ina=free)
    names = ["heroserve"] if free else ["heroserve", *BASELINES]
    out: dict[str, Plan | None] = {}
    for n in names:
        try:
            out[n] = plan(g, model, w, sla, opts, planner=n)
        except InputError:
            out[n] = None
    return out


LIMIT_MARK = " (limit)"  # a plan the planner's time limit stopped (``Plan.time_limit_reached``)


def _ratio(a: Plan | None, b: Plan | None) -> str:
    if a is None or b is None or b.predicted.rate <= 0:
        return "-"
    limited = a.time_limit_reached or b.time_limit_reached
    return f"{a.predicted.rate / b.predicted.rate:.2f}x" + (LIMIT_MARK if limited else "")


def _ina_groups(p: Plan | None) -> str:
    if p is None:
        return "-"
    groups = p.prefill.groups + p.decode.groups
    hier = sum(g.scheme == "hier" for g in groups)
    flat = sum(g.scheme == "ina" for g in groups)
    return f"{hier} hier, {flat} flat of {sum(len(g.gpus) > 1 for g in groups)}"


def _ina_group_time(p: Plan) -> str:
    """How the plan's first INA group all-reduces, against the ring, for the lanes text."""
    ina = [g for g in p.decode.groups + p.prefill.groups if g.scheme != "ring"]
    if not ina:
        return "no group chooses INA"
    g, how = ina[0], {"hier": "hierarchically", "ina": "with flat INA"}[ina[0].scheme]
    return (
        f"a TP-{len(g.gpus)} group all-reduces {how} in {g.allreduce_s * 1e6:.1f} us "
        f"against the ring's {g.ring_s * 1e6:.1f}"
    )


def _shape(p: Plan | None) -> str:
    if p is None:
        return "no plan"
    return (
        f"{p.prefill.tp}x{p.prefill.pp} x{len(p.prefill.instances)} / "
        f"{p.decode.tp}x{p.decode.pp} x{len(p.decode.instances)}"
    )


def _measured(
    eval_dir: Path, name: str
) -> tuple[dict[str, tuple[float, float]], list[list[str]]] | None:
    """Simulated max rates of ``heroserve evaluate --scenario name`` (per GPU and in total,
    req/s), if it ran, and the planners whose plans it simulated once as one deployment
    (each list of two or more)."""
    path = eval_dir / name / "summary.json"
    if not path.is_file():
        return None
    try:
        rows = json.loads(path.read_text())["max_rate"]
        rates = {
            str(r["planner"]): (float(r["max_rate_per_gpu"]), float(r["max_rate"])) for r in rows
        }
        together = simulated_together(rows)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return rates, together


def _simulated_row(name: str, measured: dict[str, tuple[float, float]]) -> str:
    """The scalability table's *simulated* row from ``_measured``'s rates: HeroServe's per
    GPU, and its total rate over each baseline's, as the predicted rows take H (a plan may
    leave GPUs idle, so per-GPU ratios would not be theirs)."""
    hero = measured["heroserve"]
    cells = [
        f"{hero[1] / measured[b][1]:.2f}x" if measured.get(b, (0.0, 0.0))[1] > 0 else "-"
        for b in [*SAME_SPACE, "distserve-paper"]
    ]
    one = len({measured.get(b, (0.0, 0.0))[1] for b in SAME_SPACE}) == 1
    cells = [_baseline_cell(cells[:-1], one), cells[-1]]
    return f"| {name} | simulated | max {hero[0]:.4g} req/s/GPU | | " + " | ".join(cells) + " | | |"


def report(
    servers: int = 48,
    eval_dir: Path = Path("eval"),
    quick: bool = False,
    say: Callable[[str], None] = lambda m: None,
    runner: Runner | None = None,
    sim_requests: int = SIM_REQUESTS,
    requests: int | None = None,
) -> str:
    """The whole report; the ablation's plans simulated on ``runner`` (one process if None),
    each point's first run of ``requests`` requests (None: the scenario's, ``requests_at``)."""
    t0 = time.perf_counter()
    lines = ["# Fidelity: the paper's claims beside the project's figures\n"]
    lines.append(
        "Written by `heroserve fidelity` (controller/evaluation/fidelity.py); every figure is "
        "computed by the project's cost model, planners and simulator, with the parameters and "
        "sources of docs/costmodel.md. Nothing is tuned toward the paper. *pipelined* is the "
        "default cost mode (NICs and switches forward packet by packet, INA collection and "
        "distribution overlap); *paper* prices the collectives by Eqs. 7-11 as the paper "
        "writes them: the FP16 message without packet headers, each member's path alone and "
        "no latency terms; INA's collection and distribution store-and-forward on every hop "
        "(Eq. 10), a ring 2(P-1) steps of D/P at its slowest link (Eq. 11; docs/costmodel.md "
        "gives the reading of D_rg). H is Eq. 1's total SLA-meeting rate; ratios are "
        "HeroServe's H over the baseline's on the same cluster.\n"
    )
    lines.append(
        "Where INA pays at all (NCCL's ring against flat and hierarchical INA over NIC rate, "
        "server link, group size and lane format) and `l40s-rack`, a built-in PCIe-only "
        "cluster in that region, with its plans and simulated gain: docs/ina-map.md.\n"
    )
    # -- Fig. 2 ---------------------------------------------------------------------------
    lines.append("## Fig. 2: aggregation delay of 1 MB, Ethernet-only against NVLink-assisted\n")
    lines.append("| | paper | project, paper mode | project, pipelined |")
    lines.append("|---|---|---|---|")
    d = {m: fig2_delays(m) for m in MODES}
    lines.append(
        f"| homogeneous (core S1, two Ethernet hops) | ~160 us | {d['paper'][0] * 1e6:.1f} us | "
        f"{d['pipelined'][0] * 1e6:.1f} us |"
    )
    lines.append(
        f"| heterogeneous (NVLink relay, access S2) | ~90 us | {d['paper'][1] * 1e6:.1f} us | "
        f"{d['pipelined'][1] * 1e6:.1f} us |"
    )
    lines.append(
        "\nIn the paper's mode (its Eqs. 9-10 as written: each path alone, no latency) the "
        f"model gives {d['paper'][0] * 1e6:.1f} and {d['paper'][1] * 1e6:.1f} us, the paper's "
        f"~160 and ~90 (its 43% cut is {(1 - d['paper'][1] / d['paper'][0]) * 100:.0f}% here): "
        "the relay saves a whole copy of the message on the second Ethernet hop. Forwarded "
        "packet by packet, a path costs its slowest hop once plus its latencies, so the relay "
        f"saves one hop's latency and a packet ({(d['pipelined'][0] - d['pipelined'][1]) * 1e6:.1f}"
        " us), not 43%: NVLink's advantage then comes from bandwidth (a group reaching a "
        "switch over several NICs) and from hierarchical INA, not from the hop count.\n"
    )
    net = NetParams()
    lines.append(
        "The paper's figures are the collection alone (T_col, one way). Eq. 8 in full adds "
        "the switch's T_agg (1 us) and the distribution T_dis (the same routes back); the "
        "project's mode overlaps the two, adds the host's synchronisation (4 us) and counts "
        "the bytes on the wire: with its default lanes (int32, what the P4 "
        f"program adds: 4 bytes per FP16 element, {net.ina_frame_bytes:.0f}-byte frames of "
        f"{net.ina_payload_bytes} payload bytes) the wire carries {net.ina_wire_ratio:.2f}x "
        "the FP16 message:\n"
    )
    lines.append("| T_ina of 1 MB (Eq. 8) | paper mode (FP16 message) | pipelined, fp16 | "
                 "pipelined, int32 |")  # fmt: skip
    lines.append("|---|---|---|---|")
    full = {(m, ln): fig2_full(m, ln) for m, ln in
            (("paper", "fp16"), ("pipelined", "fp16"), ("pipelined", "int32"))}  # fmt: skip
    for i, name in enumerate(("homogeneous (S1)", "heterogeneous (S2)")):
        cells = " | ".join(f"{full[k][i] * 1e6:.1f} us" for k in full)
        lines.append(f"| {name} | {cells} |")
    lines.append("")
    # -- scalability ------------------------------------------------------------------------
    lines.append("## Fig. 7 and Fig. 8: scalability ratios\n")
    lines.append(
        f"Track clusters of servers of 8 A100-40GB: 2tracks {_track_servers(servers, 6)} "
        f"servers, 8tracks {_track_servers(servers, 16)} ({servers} rounded down to whole "
        "units of 6 and 16 servers), with the paper's core switches scaled to that size (27 "
        "and 280 at its 1,200 servers; at least 4 and 16). Predicted by the planner; "
        "*simulated* is the maximum rate at 90% attainment measured by `heroserve "
        "evaluate` where it ran (`--eval-dir`): HeroServe's per GPU, and the ratios of the "
        "total rates, as the predicted rows' ratios of H.\n"
    )
    head = f"| scenario | mode | HeroServe plan | INA groups | vs {BASELINE_HEAD} | "
    lines.append(head + "vs distserve-paper | free-INA bound | paper |")
    lines.append("|" + "---|" * 8)
    todo = [c for c in cases(servers) if not quick or c.name.startswith("testbed")]
    run = runner or Runner(1, progress=say)
    say(f"fidelity 1/2: planning {len(todo)} scenarios in both cost modes on {run.workers} "
        "worker(s)")  # fmt: skip
    planned = run.call(_case_rows, todo, "fidelity: scenarios planned")
    tpot_rows: list[tuple[str, str, float, float, float]] = []
    shared: list[str] = []  # planners simulated once, as one deployment, per scenario
    for case, (rows, tpots) in zip(todo, planned, strict=True):
        lines += rows
        tpot_rows += tpots
        found = _measured(eval_dir, case.name)
        measured = found[0] if found else {}
        if found and found[1]:
            shared.append(f"{case.name}: " + "; ".join(", ".join(t) for t in found[1]))
        if "heroserve" in measured:
            lines.append(_simulated_row(case.name, measured))
    lines.append(
        "\n*free-INA bound*: HeroServe's H when every all-reduce it may aggregate in the network "
        "costs nothing, over its H: no INA scheme can lift it further on that cluster. "
        f"*{LIMIT_MARK.strip()}*: a plan on either side of the ratio is the best its planner "
        f"found within the planner's time limit ({DEFAULT_TIME_LIMIT_S:g} CPU-s), not the "
        "end of its search.\n"
    )
    if shared:
        lines.append(
            "*Simulated once*: plans that are the same deployment (every field the simulator "
            "reads equal) share one search of the maximum rate, so their simulated ratio is "
            "exactly 1: " + "; ".join(shared) + ".\n"
        )
    try:
        lines += _ablation_section(servers, quick, say, run, sim_requests, requests)
    finally:
        if runner is None:
            run.close()
    # -- TPOT ---------------------------------------------------------------------------------
    lines.append("## TPOT (the paper: 18.6%-49.2% lower on the testbed)\n")
    lines.append("| scenario | baseline | its TPOT | HeroServe's TPOT | reduction |")
    lines.append("|---|---|---|---|---|")
    for name, b, t_b, t_hero, red in tpot_rows:
        lines.append(f"| {name} | {b} | {t_b * 1e3:.1f} ms | {t_hero * 1e3:.1f} ms | {red:+.1%} |")
    lines.append(
        "\nPredicted TPOT at each planner's own operating point (the SLA percentile, "
        "docs/planner.md); both planners run at their maximum H, so a plan serving more "
        "requests may show a longer TPOT within the bound.\n"
    )
    lines.append(_why())
    took = time.perf_counter() - t0
    lines.append(f"\n*Computed in {took:.0f} s of wall time{run.resumed()} by "
                 f"`{_command(servers, quick, sim_requests, requests)}`.*")  # fmt: skip
    say(f"fidelity: done in {took:.0f} s")
    return "\n".join(lines) + "\n"


def _case_rows(case: Case) -> tuple[list[str], list[tuple[str, str, float, float, float]]]:
    """One scenario's rows of the scalability table, both cost modes, and its TPOT rows
    (scenario, baseline, its TPOT, HeroServe's, reduction): every planner planned here, so
    that ``Runner.call`` plans scenarios on separate cores (a summarization scenario at
    1,200 servers takes minutes per planner)."""
    lines: list[str] = []
    tpot_rows = []
    for mode in MODES:
        ps = _plans(case, mode)
        hero = ps["heroserve"]
        free = _plans(case, mode, free=True)["heroserve"]
        bound = _ratio(free, hero)
        paper = PAPER_RATIOS.get(case.name) or PAPER_RATIOS.get(case.name.split("-")[0], "")
        if isinstance(paper, dict):
            paper = ", ".join(f"{k} {v}x" for k, v in paper.items())
        one = one_plan(ps)
        cells = [_ratio(hero, ps.get(b)) for b in [*SAME_SPACE, "distserve-paper"]]
        cells = [_baseline_cell(cells[:-1], one), cells[-1]]
        lines.append(
            f"| {case.name} | {mode} | {_shape(hero)} | {_ina_groups(hero)} | "
            + " | ".join(cells)
            + f" | {bound} of HeroServe's H | {paper} |"
        )
        if mode == "pipelined" and hero is not None:
            for b in SAME_SPACE[:1] if one else SAME_SPACE:
                other = ps.get(b)
                if other is not None and other.predicted.tpot_s > 0:
                    t_hero = hero.predicted.tpot_s
                    red = 1 - t_hero / other.predicted.tpot_s
                    who = BASELINE_HEAD + ONE_PLAN if one else b
                    tpot_rows.append((case.name, who, other.predicted.tpot_s, t_hero, red))
    return lines, tpot_rows


def _ablation_section(
    servers: int,
    quick: bool,
    say: Callable[[str], None],
    runner: Runner,
    sim_requests: int,
    requests: int | None = None,
) -> list[str]:
    """The ablation of every scenario (``evaluation.ablation_report``), predicted and
    simulated; ``requests`` (if given) the requests of each point's first run."""
    more = {"requests": requests} if requests else {}
    todo = [(c.name, {**c.overrides, **more}) for c in cases(servers)
            if not quick or c.name.startswith("testbed")]  # fmt: skip
    command = _command(servers, quick, sim_requests, requests, True)
    return section(todo, runner, sim_requests, say, command, requests)


def _command(
    servers: int, quick: bool, sim_requests: int, requests: int | None = None, only: bool = False
) -> str:
    return (f"heroserve fidelity --servers {servers}{' --quick' if quick else ''}"
            f" --sim-requests {sim_requests}{f' --requests {requests}' if requests else ''}"
            f"{' --section ablation' if only else ''}")  # fmt: skip


def ablation_only(
    text: str,
    servers: int,
    quick: bool,
    say: Callable[[str], None],
    runner: Runner,
    sim_requests: int = SIM_REQUESTS,
    requests: int | None = None,
) -> str:
    """``text`` (a report this module wrote) with its ablation section computed again."""
    section_span(text)  # a report without the section fails now, not after the work
    lines = _ablation_section(servers, quick, say, runner, sim_requests, requests)
    return replace_section(text, lines)


def _h(p: Plan | None) -> float:
    return p.predicted.rate if p is not None else 0.0


def _why() -> str:
    """The explanations, with the numbers they quote computed here."""
    tb = cases(48)[0]
    fixed = replace(tb, overrides={"fixed_roles": True})
    fixed_ps, free_ps = _plans(fixed, "pipelined"), _plans(tb, "pipelined")
    fixed_h, free_h = fixed_ps["heroserve"], free_ps["heroserve"]
    ds_fixed, ds_free = fixed_ps["distserve"], free_ps["distserve"]
    s = tb.scenario()
    g, model, w, sla = s.cluster(), s.model_spec(), s.load(), s.sla()
    lanes = {}
    for fmt in ("fp16", "bfp16"):
        opts = PlannerOptions(net=NetParams(ina_lanes=fmt))
        hero = plan(g, model, w, sla, opts)
        lanes[f"{fmt}_ratio"] = _ratio(hero, plan(g, model, w, sla, opts, planner="distserve"))
        lanes[f"{fmt}_group"] = _ina_group_time(hero)
    net = NetParams()
    return WHY.format(
        fixed_h=_h(fixed_h),
        free_h=_h(free_h),
        ds_fixed=_h(ds_fixed),
        ds_free=_h(ds_free),
        ds_lift=_h(ds_free) / _h(ds_fixed) if _h(ds_fixed) > 0 else math.nan,
        hero_lift=_h(free_h) / _h(fixed_h) if _h(fixed_h) > 0 else math.nan,
        fixed_ratio=_ratio(fixed_h, ds_fixed),
        free_ratio=_ratio(free_h, ds_free),
        payload=net.ina_payload_bytes,
        overhead=net.ina_overhead_bytes,
        wire=net.ina_wire_ratio,
        **lanes,
    )
