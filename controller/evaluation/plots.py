"""PNG figures in the style of the paper's Fig. 7-10 (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "heroserve": ("tab:red", "o"),
    "distserve": ("tab:blue", "s"),
    "ds-atp": ("tab:green", "^"),
    "ds-switchml": ("tab:orange", "D"),
    "exhaustive": ("tab:gray", "x"),
}


def attainment(
    curves: dict[str, list[tuple[float, float]]], target: float, title: str, path: Path
) -> None:
    """Fig. 7a/8: SLA attainment (%) against per-GPU rate, one line per planner."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for planner, pts in curves.items():
        pts = sorted(pts)
        c, m = STYLE.get(planner, ("black", "."))
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=m, color=c, label=planner)
    ax.axhline(100 * target, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("per-GPU rate (req/s)")
    ax.set_ylabel("SLA attainment (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latency_bars(rows: list[dict], title: str, path: Path) -> None:
    """Fig. 7b/d: mean TTFT and TPOT per planner at each fixed per-GPU rate."""
    rates = sorted({r["rate_per_gpu_nominal"] for r in rows})
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    width = 0.8 / max(1, len(planners))
    for ax, key, label in (
        (axes[0], "ttft_mean_s", "TTFT (s)"),
        (axes[1], "tpot_mean_s", "TPOT (s)"),
    ):
        for i, p in enumerate(planners):
            ys = []
            for rate in rates:
                hit = [
                    r[key] for r in rows if r["planner"] == p and r["rate_per_gpu_nominal"] == rate
                ]
                ys.append(hit[0] if hit else 0.0)
            c, _ = STYLE.get(p, ("black", "."))
            ax.bar([j + i * width for j in range(len(rates))], ys, width, color=c, label=p)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rates))])
        ax.set_xticklabels([f"{r:g}" for r in rates])
        ax.set_xlabel("per-GPU rate (req/s)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ina_throughput(rows: list[dict], title: str, path: Path) -> None:
    """Fig. 9: aggregation throughput (GB/s) against message size, one line per planner."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for p in dict.fromkeys(r["planner"] for r in rows):
        pts = sorted((r["message_mb"], r["throughput_GBps"]) for r in rows if r["planner"] == p)
        c, m = STYLE.get(p, ("black", "."))
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=m, color=c, label=p)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (MB)")
    ax.set_ylabel("aggregation throughput (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kv_memory(series: dict[str, list[tuple[float, float]]], title: str, path: Path) -> None:
    """Fig. 10: KV-cache memory in use (% of the decode instances' room) over time."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for p, pts in series.items():
        c, _ = STYLE.get(p, ("black", "."))
        ax.plot([t for t, _ in pts], [100 * u for _, u in pts], color=c, label=p, linewidth=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV-cache memory in use (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
