"""Figures a reader can use (controller/evaluation/plots.py): coinciding curves all drawn
and said to coincide, latency in ms with p90 in the planner's colour and a labelled SLA, log
axes where values span more than 10x, reference labels and legends outside the plotting
area, SVG beside a 150-dpi PNG, throughput per scheme with the scheme named."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba
from PIL import Image

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
    legend = [t.get_text() for t in figures[0].legends[0].get_texts()]
    assert "ds-atp (= distserve, drawn over it)" in legend


def _outside(fig, ax, text: str) -> bool:
    """The text artist ``text`` of ``ax`` lies wholly outside the plotting area."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    (t,) = [t for t in ax.texts if t.get_text() == text]
    return not t.get_window_extent(r).overlaps(ax.get_window_extent(r))


def _latency_rows(tpot_paper_s: float) -> list[dict]:
    rows = [
        {"planner": p, "rate_per_gpu_nominal": 0.1, "ttft_mean_s": 0.12, "ttft_p90_s": 0.25,
         "tpot_mean_s": 0.038, "tpot_p90_s": 0.04}
        for p in ("heroserve", "distserve")
    ]  # fmt: skip
    rows.append({"planner": "distserve-paper", "rate_per_gpu_nominal": 0.1,
                 "ttft_mean_s": 0.5, "ttft_p90_s": 0.9,
                 "tpot_mean_s": tpot_paper_s, "tpot_p90_s": tpot_paper_s})  # fmt: skip
    return rows


def test_latency_in_ms_with_p90_and_labelled_sla(tmp_path: Path, figures: list) -> None:
    written = plots.latency_bars(_latency_rows(0.05), "t", tmp_path / "l.png", sla=(2.5, 0.15))
    assert written == [tmp_path / "l.png", tmp_path / "l.svg"]
    ttft, tpot = figures[0].axes
    # TTFT spans 120 to 2,500 ms (the SLA): 21x, log; TPOT 38 to 150 ms: linear from 0
    assert ttft.get_ylabel() == "TTFT (ms, log scale)" and tpot.get_ylabel() == "TPOT (ms)"
    assert [b.get_height() for b in ttft.patches] == pytest.approx([120, 120, 500])
    p90 = [y for c in ttft.collections for y in c.get_offsets()[:, 1]]  # one per planner
    assert p90 == pytest.approx([250, 250, 900])
    assert any(t.get_text() == "SLA\n2500 ms" for t in ttft.texts)
    assert _outside(figures[0], tpot, "SLA\n150 ms")  # nothing is drawn over it
    assert tpot.get_ylim()[0] == 0 and tpot.get_yscale() == "linear"


def test_latency_p90_marks_carry_the_planners_colour(tmp_path: Path, figures: list) -> None:
    plots.latency_bars(_latency_rows(0.05), "t", tmp_path / "l.png", sla=(2.5, 0.15))
    for ax in figures[0].axes:
        faces = [tuple(c.get_facecolor()[0]) for c in ax.collections]
        want = [to_rgba(plots.STYLE[p][0]) for p in ("heroserve", "distserve", "distserve-paper")]
        assert faces == want


def test_latency_panel_spanning_over_10x_is_logarithmic(tmp_path: Path, figures: list) -> None:
    """distserve-paper's TPOT of 25 s against 38 ms and a 150 ms SLA: the TPOT panel is log,
    the TTFT panel as well; one legend for both panels, outside them."""
    plots.latency_bars(_latency_rows(25.0), "t", tmp_path / "l.png", sla=(2.5, 0.15))
    fig = figures[0]
    ttft, tpot = fig.axes
    assert tpot.get_yscale() == "log" and ttft.get_yscale() == "log"
    lo, hi = tpot.get_ylim()
    assert lo < 38 and hi > 25_000  # every bar and the SLA line inside the panel
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert [t.split(":")[0] for t in texts] == ["heroserve", "distserve", "distserve-paper"]
    assert ttft.get_legend() is None and tpot.get_legend() is None


def test_attainment_rate_axis_log_when_rates_span_over_10x(tmp_path: Path, figures: list) -> None:
    near = {"heroserve": [(0.1, 1.0), (0.3, 0.9)], "distserve": [(0.09, 1.0), (0.2, 0.8)]}
    plots.attainment(near, 0.9, "t", tmp_path / "a.png")
    plots.attainment(near | {"distserve-paper": [(0.001, 1.0), (0.002, 0.5)]}, 0.9, "t",
                     tmp_path / "b.png")  # fmt: skip
    (linear,), (log,) = figures[0].axes, figures[1].axes
    assert linear.get_xscale() == "linear" and log.get_xscale() == "log"
    assert _outside(figures[1], log, "target 90%")
    assert log.get_ylim()[1] > 100  # the 100 % points are not on the frame


def test_png_at_150_dpi_and_svg_beside_it(tmp_path: Path, figures: list) -> None:
    plots.kv_memory({"heroserve": [(0.0, 0.1), (1.0, 0.5)]}, "t", tmp_path / "k.png")
    with Image.open(tmp_path / "k.png") as im:
        assert min(im.info["dpi"]) >= 150
    assert (tmp_path / "k.svg").read_text().lstrip().startswith("<?xml")


def test_throughput_draws_each_scheme_and_names_it(tmp_path: Path, figures: list) -> None:
    rows = [
        {"planner": p, "simulated_as": "heroserve", "scheme": scheme, "message_mb": mb,
         "throughput_GBps": (200 if scheme == "ina" else 100) + mb, "ina_share": share}
        for p in ("heroserve", "distserve")
        for scheme, share in (("fastest", 0.0), ("ina", 0.5), ("ring", 0.0))
        for mb in (4, 8, 16)
    ]  # fmt: skip
    plots.ina_throughput(rows, "t", tmp_path / "i.png")
    fig = figures[0]
    (ax,) = fig.axes
    assert ax.get_ylim()[0] == 0  # 104 to 216 GB/s: linear, from 0
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "heroserve (= distserve): each group's fastest (all ring)",
        "heroserve (= distserve): INA (INA on 50% of groups, ring the rest)",
        "heroserve (= distserve): ring (all ring)",
    ]
    ina = [ln for ln in ax.get_lines() if "INA (" in str(ln.get_label())][0]
    assert list(ina.get_ydata()) == [204, 208, 216]
