"""Figures in the style of the paper's Fig. 7-10 (matplotlib, no display needed), each as a
PNG at ``DPI`` and an SVG beside it; every function returns the paths it wrote.

Made to be read: planners whose curves coincide (the baselines often do) are all drawn, one
over the other with their own dash pattern and hollow markers of decreasing size, and the
legend says which coincide; an axis whose values span more than ``LOG_SPAN`` is logarithmic
(distserve-paper's latencies are 600x the others'); latencies are in ms with the mean as a
bar and the p90 as a mark in the planner's colour; reference lines (SLA, target) are labelled
outside the plotting area, and legends sit outside it too, so nothing is drawn over them; the
aggregation-throughput figure draws each scheme the cost model prices, not only the plans'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

STYLE = {
    "heroserve": ("tab:red", "o"),
    "distserve": ("tab:blue", "s"),
    "ds-atp": ("tab:green", "^"),
    "ds-switchml": ("tab:orange", "D"),
    "distserve-paper": ("tab:purple", "v"),
    "exhaustive": ("tab:gray", "x"),
}
DASHES = ["-", "--", ":", "-."]
LOG_SPAN = 10.0  # an axis whose positive values span more than this is logarithmic
DPI = 150
COINCIDE_REL = 0.005  # curves closer than 0.5 % everywhere are drawn as coinciding
MS = 1e3


def coinciding(curves: dict[str, Sequence[tuple[float, float]]]) -> list[list[str]]:
    """Groups (of two or more) of series whose points are equal to ``COINCIDE_REL``: same
    number of points, same x and y each (relative to the larger magnitude)."""

    def same(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
        if len(a) != len(b):
            return False
        for p, q in zip(sorted(a), sorted(b), strict=True):
            for u, v in zip(p, q, strict=True):
                if not math.isclose(u, v, rel_tol=COINCIDE_REL, abs_tol=1e-12):
                    return False
        return True

    groups: list[list[str]] = []
    for name, pts in curves.items():
        for grp in groups:
            if same(curves[grp[0]], pts):
                grp.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def _labels(names: Sequence[str], groups: list[list[str]]) -> dict[str, str]:
    out = {n: n for n in names}
    for grp in groups:
        for n in grp[1:]:
            out[n] = f"{n} (= {grp[0]}, drawn over it)"
    return out


def _lines(
    ax: plt.Axes, curves: dict[str, Sequence[tuple[float, float]]], yscale: float = 1.0
) -> list[list[str]]:
    """Plot each series; a series that coincides with one drawn before gets the next dash
    pattern and a smaller hollow marker, so every one stays visible."""
    groups = coinciding(curves)
    labels = _labels(list(curves), groups)
    rank = {n: grp.index(n) for grp in groups for n in grp}
    for name, pts in curves.items():
        pts = sorted(pts)
        c, m = STYLE.get(name, ("black", "."))
        k = rank.get(name, 0)
        ax.plot(
            [p[0] for p in pts],
            [yscale * p[1] for p in pts],
            marker=m,
            color=c,
            linestyle=DASHES[k % len(DASHES)],
            markersize=7 - 1.5 * k,
            markerfacecolor=c if k == 0 else "none",
            linewidth=1.6 - 0.3 * k,
            label=labels[name],
        )
    return groups


def _save(fig: plt.Figure, path: Path) -> list[Path]:
    """``path`` (PNG at ``DPI``) and the same figure as SVG; the bounding box takes in the
    legends and labels drawn outside the axes."""
    svg = path.with_suffix(".svg")
    for f in (path, svg):
        fig.savefig(f, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return [path, svg]


def log_if_wide(ax: plt.Axes, axis: str, values: Sequence[float]) -> bool:
    """Make ``axis`` ("x" or "y") logarithmic when the positive ``values`` span more than
    ``LOG_SPAN``; True when it did."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if not pos or max(pos) / min(pos) <= LOG_SPAN:
        return False
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    side = ax.xaxis if axis == "x" else ax.yaxis
    side.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # 1, 2, 5 per decade
    side.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 0.05, not 10^-1
    side.set_minor_formatter(ticker.NullFormatter())
    return True


def _reference(ax: plt.Axes, y: float, text: str) -> None:
    """A horizontal reference line labelled in the right margin, outside the data."""
    ax.axhline(y, color="gray", linestyle="--", linewidth=1)
    ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0),
                textcoords="offset points", va="center", ha="left", fontsize=7, color="gray",
                annotation_clip=False)  # fmt: skip


def _legend_below(fig: plt.Figure, ax: plt.Axes, ncol: int = 2) -> None:
    """One legend under the figure, outside every plotting area."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
               fontsize=7, frameon=False)  # fmt: skip


def attainment(
    curves: dict[str, list[tuple[float, float]]], target: float, title: str, path: Path
) -> list[Path]:
    """Fig. 7a/8: SLA attainment (%) against per-GPU rate, one line per planner; the rate
    axis is logarithmic when the planners' rates span more than ``LOG_SPAN``."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    _lines(ax, curves, yscale=100)
    _reference(ax, 100 * target, f"target {target:.0%}")
    if log_if_wide(ax, "x", [x for pts in curves.values() for x, _ in pts]):
        ax.set_xlabel("per-GPU rate (req/s, log scale)")
    else:
        ax.set_xlabel("per-GPU rate (req/s)")
    ax.set_ylabel("SLA attainment (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title, fontsize=9)
    _legend_below(fig, ax)
    fig.tight_layout()
    return _save(fig, path)


def latency_bars(
    rows: list[dict], title: str, path: Path, sla: tuple[float, float] | None = None
) -> list[Path]:
    """Fig. 7b/d: TTFT and TPOT per planner at each fixed per-GPU rate, in ms: a bar for the
    mean and a diamond in the planner's colour for the p90; ``sla`` (TTFT, TPOT seconds) as
    labelled lines; a panel whose values span more than ``LOG_SPAN`` is logarithmic. One
    legend for both panels, under them."""
    rates = sorted({r["rate_per_gpu_nominal"] for r in rows})
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    width = 0.8 / max(1, len(planners))
    for ax, key, label, bound in (
        (axes[0], "ttft", "TTFT (ms)", sla[0] if sla else None),
        (axes[1], "tpot", "TPOT (ms)", sla[1] if sla else None),
    ):
        values = [MS * bound] if bound is not None else []
        for i, p in enumerate(planners):
            xs, means, p90s = [], [], []
            for j, rate in enumerate(rates):
                hit = [r for r in rows if r["planner"] == p and r["rate_per_gpu_nominal"] == rate]
                if hit:
                    xs.append(j + i * width)
                    means.append(MS * hit[0][f"{key}_mean_s"])
                    p90s.append(MS * hit[0][f"{key}_p90_s"])
            values += means + p90s
            c, _ = STYLE.get(p, ("black", "."))
            ax.bar(xs, means, width, color=c, alpha=0.75, label=p)
            ax.scatter(xs, p90s, marker="D", s=28, color=c, edgecolors="black", linewidths=0.6,
                       zorder=3)  # fmt: skip
        if bound is not None:
            _reference(ax, MS * bound, f"SLA\n{MS * bound:g} ms")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rates))])
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.set_xlabel("per-GPU rate (req/s)")
        if log_if_wide(ax, "y", values):
            pos = [v for v in values if v > 0]
            ax.set_ylim(min(pos) / 2, max(pos) * 2)
            ax.set_ylabel(label.replace(")", ", log scale)"))
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylabel(label)
    _legend_below(fig, axes[0], ncol=3)
    fig.suptitle(f"{title} (bar: mean; diamond: p90)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


SCHEME_LINES = {  # scheme of ina.SCHEMES -> (what the legend says, line style, marker)
    "fastest": ("each group's fastest", "-", "o"),
    "ina": ("INA", "--", "^"),
    "ring": ("ring", ":", "s"),
}


def _share(rows: list[dict]) -> str:
    shares = {round(float(r.get("ina_share", 0.0)), 3) for r in rows}
    if len(shares) != 1:
        return f"INA on {min(shares):.0%}-{max(shares):.0%} of groups"
    share = shares.pop()
    if share <= 0:
        return "all ring"
    return "all INA" if share >= 1 else f"INA on {share:.0%} of groups, ring the rest"


def ina_throughput(rows: list[dict], title: str, path: Path) -> list[Path]:
    """Fig. 9: aggregation throughput (GB/s) against message size, a line per deployment and
    scheme (``scheme`` of ``controller.evaluation.ina.SCHEMES``; rows without one are the
    fastest option): colour names the deployment (planners simulated as one are named
    together), the line style the scheme; the legend says how many groups ran INA."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    reps = list(dict.fromkeys(r.get("simulated_as", r["planner"]) for r in rows))
    values = []
    for rep in reps:
        mine = [r for r in rows if r.get("simulated_as", r["planner"]) == rep]
        twins = [p for p in dict.fromkeys(r["planner"] for r in mine) if p != rep]
        name = rep + (f" (= {', '.join(twins)})" if twins else "")
        c, _ = STYLE.get(rep, ("black", "."))
        for k, scheme in enumerate(dict.fromkeys(r.get("scheme", "fastest") for r in mine)):
            sel = [r for r in mine if r["planner"] == rep and r.get("scheme", "fastest") == scheme]
            pts = sorted((r["message_mb"], r["throughput_GBps"]) for r in sel)
            what, ls, m = SCHEME_LINES.get(scheme, (scheme, "-", "."))
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=c, linestyle=ls, marker=m,
                    markersize=7 - 1.5 * k, markerfacecolor=c if k == 0 else "none",
                    label=f"{name}: {what} ({_share(sel)})")  # fmt: skip
            values += [y for _, y in pts]
    ax.set_xscale("log", base=2)
    sizes = sorted({r["message_mb"] for r in rows})
    ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
    log = log_if_wide(ax, "y", values)
    if not log:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("all-reduce message per GPU (MB)")
    ax.set_ylabel("aggregation throughput (GB/s" + (", log scale)" if log else ")"))
    ax.set_title(title + "\nevery group all-reduces at once; one line per scheme", fontsize=9)
    _legend_below(fig, ax, ncol=1)
    fig.tight_layout()
    return _save(fig, path)


def kv_memory(series: dict[str, list[tuple[float, float]]], title: str, path: Path) -> list[Path]:
    """Fig. 10: KV-cache memory in use (% of the decode instances' room) over simulated time."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (p, pts) in enumerate(series.items()):
        c, _ = STYLE.get(p, ("black", "."))
        ax.plot([t for t, _ in pts], [100 * u for _, u in pts], color=c, label=p,
                linewidth=1, linestyle=DASHES[k % len(DASHES)])  # fmt: skip
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV-cache memory in use (%)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    _legend_below(fig, ax, ncol=3)
    fig.tight_layout()
    return _save(fig, path)
