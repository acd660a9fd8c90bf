"""deploy/grafana/hpcwatch.json: a Grafana 10+ dashboard whose queries name only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hpcwatch.exporter import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hpcwatch.json"

# PromQL words that are not metric names (aggregations may put "by (...)" before their parenthesis).
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, groupings, strings and ranges removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range / subquery durations
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        following = expr[m.end() :].lstrip()[:1]
        if following != "(" and m.group(0).lower() not in KEYWORDS:
            names.add(m.group(0))
    return names


def exprs(node) -> list[str]:
    """Every PromQL expression in panels and template variables."""
    out = []
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            out.append(node["expr"])
        for value in node.values():
            out += exprs(value)
    elif isinstance(node, list):
        for value in node:
            out += exprs(value)
    return out


def variable_queries(dashboard: dict) -> list[str]:
    queries = []
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            queries.append(inner.group(1) if inner else q)
    return queries


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def twin_metrics() -> set[str]:
    """Series names the twin's dcgm-exporter and node-exporter endpoints emit, as Prometheus stores them."""
    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.twin import Twin

    twin = Twin(reference_cluster(), seed=0)
    text = twin.dcgm_text("node1") + twin.node_exporter_text("node1")
    list(text_string_to_metric_families(text))  # it parses as exposition text
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_:][\w:]*)[{ ]", text, re.MULTILINE)}


def test_schema_and_variables(dashboard):
    assert dashboard["schemaVersion"] >= 38
    assert dashboard["uid"] and dashboard["title"]
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"job", "user", "account", "datasource"} <= names
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]


def test_every_query_names_only_metrics_that_exist(dashboard, twin_metrics):
    known = set(METRIC_NAMES) | twin_metrics
    queries = exprs(dashboard["panels"]) + variable_queries(dashboard)
    assert len(queries) >= 10
    used = set()
    for q in queries:
        unknown = metric_names(q) - known
        assert not unknown, f"{q!r} uses {sorted(unknown)}"
        used |= metric_names(q)
    assert {
        "hpcwatch_job_gpu_hours",
        "hpcwatch_job_energy_joules",
        "hpcwatch_job_idle_gpus",
        "DCGM_FI_DEV_GPU_UTIL",
        "hpcwatch_findings",
    } <= used


def test_job_panels_filter_on_the_template_variables(dashboard):
    for q in exprs(dashboard["panels"]):
        if "hpcwatch_job_" in q:
            assert "$job" in q and "$user" in q and "$account" in q, q


def test_the_name_extractor_is_not_fooled():
    assert metric_names('sum by (hpc_job) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{hpc_job=~"$job"}[5m])) / 1e3') == {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    }
    assert metric_names("a * on (hpc_job) group_left (user) b_info offset 5m") == {"a", "b_info"}
