"""PNG figures in the style of the paper's Fig. 7-10 (matplotlib, no display needed).

Made to be read: planners whose curves coincide (the baselines often do) are all drawn, one
over the other with their own dash pattern and hollow markers of decreasing size, and the
legend says which coincide; latencies are in ms with the mean and the p90 and the SLA
labelled; the aggregation-throughput figure names the schemes it measured and starts at 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "heroserve": ("tab:red", "o"),
    "distserve": ("tab:blue", "s"),
    "ds-atp": ("tab:green", "^"),
    "ds-switchml": ("tab:orange", "D"),
    "distserve-paper": ("tab:purple", "v"),
    "exhaustive": ("tab:gray", "x"),
}
DASHES = ["-", "--", ":", "-."]
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


def attainment(
    curves: dict[str, list[tuple[float, float]]], target: float, title: str, path: Path
) -> None:
    """Fig. 7a/8: SLA attainment (%) against per-GPU rate, one line per planner."""
    fig, ax = plt.subplots(figsize=(5.6, 3.9))
    _lines(ax, curves, yscale=100)
    ax.axhline(100 * target, color="gray", linestyle="--", linewidth=1)
    ax.annotate(
        f"target {target:.0%}",
        xy=(0.01, 100 * target),
        xycoords=("axes fraction", "data"),
        va="bottom",
        fontsize=7,
        color="gray",
    )
    ax.set_xlabel("per-GPU rate (req/s)")
    ax.set_ylabel("SLA attainment (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latency_bars(
    rows: list[dict], title: str, path: Path, sla: tuple[float, float] | None = None
) -> None:
    """Fig. 7b/d: TTFT and TPOT per planner at each fixed per-GPU rate, in ms: a bar for the
    mean and a black tick for the p90; ``sla`` (TTFT, TPOT seconds) as labelled lines."""
    rates = sorted({r["rate_per_gpu_nominal"] for r in rows})
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    width = 0.8 / max(1, len(planners))
    for ax, key, label, bound in (
        (axes[0], "ttft", "TTFT (ms)", sla[0] if sla else None),
        (axes[1], "tpot", "TPOT (ms)", sla[1] if sla else None),
    ):
        for i, p in enumerate(planners):
            xs, means, p90s = [], [], []
            for j, rate in enumerate(rates):
                hit = [r for r in rows if r["planner"] == p and r["rate_per_gpu_nominal"] == rate]
                if hit:
                    xs.append(j + i * width)
                    means.append(MS * hit[0][f"{key}_mean_s"])
                    p90s.append(MS * hit[0][f"{key}_p90_s"])
            c, _ = STYLE.get(p, ("black", "."))
            ax.bar(xs, means, width, color=c, label=f"{p} mean")
            ax.scatter(xs, p90s, marker="_", s=220, color="black", zorder=3,
                       label="p90" if i == 0 else None)  # fmt: skip
        if bound is not None:
            ax.axhline(MS * bound, color="gray", linestyle="--", linewidth=1)
            ax.annotate(f"SLA {MS * bound:g} ms", xy=(0.01, MS * bound),
                        xycoords=("axes fraction", "data"), va="bottom", fontsize=7,
                        color="gray")  # fmt: skip
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rates))])
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.set_xlabel("per-GPU rate (req/s)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _scheme_note(rows: list[dict], planner: str) -> str:
    shares = {r.get("ina_share") for r in rows if r["planner"] == planner}
    shares.discard(None)
    if len(shares) != 1:
        return "each group's planned scheme"
    share = float(shares.pop())
    if share <= 0:
        return "ring"
    if share >= 1:
        return "INA"
    return f"INA {share:.0%} of groups, ring the rest"


def ina_throughput(rows: list[dict], title: str, path: Path) -> None:
    """Fig. 9: aggregation throughput (GB/s) against message size, one line per planner;
    the legend names the scheme each planner's groups used (its plan's, all at once)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.9))
    curves = {
        p: [(r["message_mb"], r["throughput_GBps"]) for r in rows if r["planner"] == p]
        for p in dict.fromkeys(r["planner"] for r in rows)
    }
    groups = _lines(ax, curves)
    for line in ax.get_lines():
        name = str(line.get_label()).split(" (")[0]
        line.set_label(f"{line.get_label()}: {_scheme_note(rows, name)}")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["message_mb"] for r in rows})
    ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("all-reduce message per GPU (MB)")
    ax.set_ylabel("aggregation throughput (GB/s)")
    ax.set_title(title + "\nevery group all-reduces at once with its plan's scheme", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    if groups:
        ax.text(0.01, 0.01, "overlapping lines coincide", transform=ax.transAxes, fontsize=7,
                color="gray")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kv_memory(series: dict[str, list[tuple[float, float]]], title: str, path: Path) -> None:
    """Fig. 10: KV-cache memory in use (% of the decode instances' room) over simulated time."""
    fig, ax = plt.subplots(figsize=(5.6, 3.9))
    for k, (p, pts) in enumerate(series.items()):
        c, _ = STYLE.get(p, ("black", "."))
        ax.plot([t for t, _ in pts], [100 * u for _, u in pts], color=c, label=p,
                linewidth=1, linestyle=DASHES[k % len(DASHES)])  # fmt: skip
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV-cache memory in use (%)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
