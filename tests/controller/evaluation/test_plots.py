"""Figures a reader can use (controller/evaluation/plots.py): coinciding curves all drawn
and said to coincide, latency in ms with p90 and a labelled SLA, throughput from 0 with the
scheme named."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from controller.evaluation import plots


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures the plot functions close, kept for inspection."""
    kept: list = []
    close = plt.close
    monkeypatch.setattr(plots.plt, "close", kept.append)
    yield kept
    for f in list(kept):
        close(f)


def test_coinciding_groups_equal_series_only() -> None:
    a = [(0.1, 1.0), (0.2, 0.9)]
    curves = {
        "heroserve": [(0.1, 1.0), (0.2, 0.95)],
        "distserve": a,
        "ds-atp": [(0.2, 0.9), (0.1, 1.0)],  # same points, other order
        "ds-switchml": [(0.1, 1.0), (0.2, 0.9 * 1.001)],  # within 0.5 %
    }
    assert plots.coinciding(curves) == [["distserve", "ds-atp", "ds-switchml"]]
    assert plots.coinciding({"a": a, "b": [(0.1, 1.0)]}) == []


def test_attainment_draws_every_coinciding_series_visibly(tmp_path: Path, figures: list) -> None:
    same = [(0.1, 1.0), (0.2, 0.8)]
    plots.attainment({"heroserve": [(0.1, 1.0), (0.3, 0.9)], "distserve": same, "ds-atp": same},
                     0.9, "t", tmp_path / "a.png")  # fmt: skip
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    (ax,) = figures[0].axes
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) == {"heroserve", "distserve", "ds-atp (= distserve, drawn over it)"}
    first, second = lines["distserve"], lines["ds-atp (= distserve, drawn over it)"]
    assert first.get_linestyle() != second.get_linestyle()
    assert second.get_markersize() < first.get_markersize()
    assert second.get_markerfacecolor() == "none"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ds-atp (= distserve, drawn over it)" in legend


def test_latency_in_ms_with_p90_and_labelled_sla(tmp_path: Path, figures: list) -> None:
    rows = [
        {"planner": p, "rate_per_gpu_nominal": 0.1, "ttft_mean_s": 0.12, "ttft_p90_s": 0.25,
         "tpot_mean_s": 0.06, "tpot_p90_s": 0.07}
        for p in ("heroserve", "distserve")
    ]  # fmt: skip
    plots.latency_bars(rows, "t", tmp_path / "l.png", sla=(2.5, 0.15))
    ttft, tpot = figures[0].axes
    assert ttft.get_ylabel() == "TTFT (ms)" and tpot.get_ylabel() == "TPOT (ms)"
    assert [b.get_height() for b in ttft.patches] == pytest.approx([120, 120])
    p90 = [y for c in ttft.collections for y in c.get_offsets()[:, 1]]  # one per planner
    assert p90 == pytest.approx([250, 250])
    assert any(t.get_text() == "SLA 2500 ms" for t in ttft.texts)
    assert any(t.get_text() == "SLA 150 ms" for t in tpot.texts)
    assert "p90" in [t.get_text() for t in ttft.get_legend().get_texts()]
    assert ttft.get_ylim()[0] == 0


def test_throughput_names_the_scheme_and_starts_at_zero(tmp_path: Path, figures: list) -> None:
    rows = [
        {"planner": p, "message_mb": mb, "throughput_GBps": 100 + mb + k, "ina_share": share}
        for k, (p, share) in enumerate((("heroserve", 0.5), ("distserve", 0.0)))
        for mb in (4, 8, 16)
    ]
    plots.ina_throughput(rows, "t", tmp_path / "i.png")
    (ax,) = figures[0].axes
    assert ax.get_ylim()[0] == 0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["heroserve: INA 50% of groups, ring the rest", "distserve: ring"]
    assert "scheme" in ax.get_title()
