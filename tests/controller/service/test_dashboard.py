"""The Grafana dashboard docs/grafana/heroserve-controller.json (docs/control-plane.md,
"Metrics"): a valid dashboard whose every query names only metrics the controller exports
(controller/service/metrics.py), and which shows every one of them."""

from __future__ import annotations

import json
import re

import pytest
from support import ROOT

from controller.service.metrics import Metrics

DASHBOARD = ROOT / "docs" / "grafana" / "heroserve-controller.json"

# PromQL words that are not metric names: functions are told by the "(" after them.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: the identifiers left once strings,
    label matchers, ranges, grouping label lists and Grafana variables are taken out, but
    those called as functions and PromQL's keywords."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges and subqueries
    e = re.sub(r"\$\w+|\$\{[^}]*\}", "", e)  # Grafana variables
    e = _GROUPING.sub("", e)
    e = re.sub(r"\b(\d+(ms|[smhdwy]))+\b", "", e)  # durations (offset 5m, @ ... 1h30m)
    e = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?\b", "", e)  # numbers
    names = set()
    for m in _NAME.finditer(e):
        rest = e[m.end() :].lstrip()
        if not rest.startswith("(") and m.group(0).lower() not in KEYWORDS:
            names.add(m.group(0))
    return names


def exported() -> set[str]:
    """Every series name the controller's registry exposes (a counter's ``_total`` and
    ``_created``, a histogram's ``_bucket``, ``_count``, ``_sum``, ``_created``)."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
                "histogram": ("_bucket", "_count", "_sum", "_created")}  # fmt: skip
    return {fam.name + s for fam in Metrics().registry.collect() for s in suffixes[fam.type]}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _targets() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p["targets"]]


def test_metric_names_parses_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate(heroserve_plan_apply_seconds_bucket"
        '{job="x"}[$__rate_interval]))) / on(instance) group_left(version) up offset 5m'
    )
    assert metric_names(expr) == {"heroserve_plan_apply_seconds_bucket", "up"}
    assert metric_names("count(a < scalar(b)) or vector(0)") == {"a", "b"}


def test_the_dashboard_is_a_valid_grafana_dashboard() -> None:
    d = _dashboard()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    assert d["title"] and d["uid"] and d["panels"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in d["templating"]["list"] if v["type"] == "datasource"}
    for p in d["panels"]:
        assert p["type"] in ("timeseries", "stat", "table", "gauge", "bargauge"), p["title"]
        assert p["datasource"]["type"] == "prometheus"
        assert p["datasource"]["uid"].strip("${}") in variables
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"])


@pytest.mark.parametrize(("title", "expr"), _targets())
def test_every_query_names_a_metric_the_controller_exports(title: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{title}: {expr} selects no metric"
    assert names <= exported(), f"{title}: not exported: {sorted(names - exported())}"


def test_every_exported_metric_has_a_panel() -> None:
    shown = set().union(*(metric_names(e) for _, e in _targets()))
    families = {fam.name for fam in Metrics().registry.collect()}
    missing = {f for f in families if not any(n.startswith(f) for n in shown)}
    assert missing == set()
