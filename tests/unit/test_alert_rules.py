"""deploy/prometheus/hpcwatch-alerts.yml: promtool checks it and runs its unit tests; every alert has a
severity, says what and where, points at its runbook section, reads only what the exporter publishes; every
health rule and action has its alert; the sample alertmanager.yml routes them as its comments say.

promtool and amtool come with Debian's ``prometheus`` and ``prometheus-alertmanager`` (scripts/install-system):
without them these tests are skipped, except under CI (CI=true) or HPCWATCH_REQUIRE_SERVICES=1, where a
missing tool fails the run, as tests/integration/conftest.py ``need`` does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hpcwatch.exporter import METRIC_NAMES
from hpcwatch.reports.health import VERDICT_NUMBERS

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "hpcwatch-alerts.yml"
RECORDING = PROMETHEUS_DIR / "hpcwatch-rules.yml"
RULES_TEST = PROMETHEUS_DIR / "tests" / "hpcwatch-alerts.test.yml"
ALERTMANAGER = PROMETHEUS_DIR / "alertmanager.yml"
RUNBOOK = ROOT / "docs" / "alerts.md"
SEVERITY_LABELS = ("critical", "warning")
#: Alert name -> the action of the health verdict it carries (HpcwatchNode<Action>).
HEALTH_ALERTS = {"drain": "HpcwatchNodeDrain", "warn": "HpcwatchNodeWarn"}
#: Series that are Prometheus' own, not the exporter's.
PROMETHEUS_SERIES = {"up"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is not None:
        return path
    reason = f"{name} is not installed (Debian's prometheus / prometheus-alertmanager: run scripts/install-system)"
    if os.environ.get("HPCWATCH_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"CI / HPCWATCH_REQUIRE_SERVICES=1, but {reason}")
    pytest.skip(reason)


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60, cwd=cwd)


def _alerts() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


# -- promtool ----------------------------------------------------------------------------------------


def test_promtool_accepts_the_alerting_and_recording_rules():
    result = _run(_tool("promtool"), "check", "rules", ALERTS, RECORDING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_promtool_unit_tests_of_the_alerts_pass():
    result = _run(_tool("promtool"), "test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_fails_a_unit_test_whose_expectation_is_wrong(tmp_path):
    """The runner above could pass by testing nothing: a test that expects the drain one evaluation early fails."""
    doc = yaml.safe_load(RULES_TEST.read_text())
    doc["rule_files"] = [str(ALERTS)]
    doc["tests"] = doc["tests"][:1]
    doc["tests"][0]["alert_rule_test"][0]["exp_alerts"] = [{"exp_labels": {"severity": "critical"}}]
    broken = tmp_path / "broken.test.yml"
    broken.write_text(yaml.safe_dump(doc))
    result = _run(_tool("promtool"), "test", "rules", broken)
    assert result.returncode != 0 and "HpcwatchNodeDrain" in result.stdout + result.stderr


def _health_rules() -> list[tuple[str, tuple[str, ...]]]:
    """(rule id, actions) of every health rule, from the one table (analysis.health_rules.HEALTH_RULES)."""
    try:
        from hpcwatch.analysis.health_rules import HEALTH_RULES
    except ImportError:
        pytest.skip("analysis.health_rules.HEALTH_RULES is not on this branch yet")
    return [(rule.id, tuple(rule.actions)) for rule in HEALTH_RULES]


def test_every_health_rule_and_action_fires_its_alert_with_the_rule_as_a_label(tmp_path):
    """For each rule of the health table and each action it can take, the exporter's series at that verdict's
    number (reports.health.VERDICT_NUMBERS) fires HpcwatchNode<Action> naming the node and the rule."""
    promtool = _tool("promtool")
    series, expected = [], {name: [] for name in HEALTH_ALERTS.values()}
    for rule, actions in _health_rules():
        for action in actions:
            if action not in HEALTH_ALERTS:
                continue  # ok: nothing to alert
            node = f"node-{rule}-{action}"
            labels = {"job": "hpcwatch", "instance": "head1:9977", "node": node, "rule": rule}
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            series.append({"series": f"hpcwatch_health_verdict{{{text}}}", "values": f"{VERDICT_NUMBERS[action]}x20"})
            expected[HEALTH_ALERTS[action]].append({"alertname": HEALTH_ALERTS[action], "action": action, **labels})
    assert expected["HpcwatchNodeDrain"] and expected["HpcwatchNodeWarn"], "the table has drain and warn rules"
    by_name = {rule["alert"]: rule for rule in _alerts()}
    tests = [
        {
            "eval_time": "15m",
            "alertname": name,
            "exp_alerts": [
                {
                    "exp_labels": {**labels, "severity": by_name[name]["labels"]["severity"]},
                    "exp_annotations": _rendered(by_name[name]["annotations"], labels),
                }
                for labels in expected[name]
            ],
        }
        for name in HEALTH_ALERTS.values()
    ]
    doc = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "30s",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
    }
    generated = tmp_path / "health.test.yml"
    generated.write_text(yaml.safe_dump(doc))
    result = _run(promtool, "test", "rules", generated)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def _rendered(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """The annotations with ``{{ $labels.x }}`` filled in (the only template the health alerts use)."""
    out = {}
    for key, text in annotations.items():
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        assert "{{" not in out[key], f"{key}: a template this test cannot fill: {text}"
    return out


# -- the rules as data ---------------------------------------------------------------------------------


def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook_section():
    anchors = _anchors(RUNBOOK.read_text())
    for rule in _alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITY_LABELS, name
        notes = rule["annotations"]
        assert notes["summary"].strip() and notes["description"].strip(), name
        doc, _, anchor = notes["runbook_url"].partition("#")
        assert doc == "docs/alerts.md" and anchor == name.lower(), (name, notes["runbook_url"])
        assert anchor in anchors, f"{name}: docs/alerts.md has no section '{name}'"


def test_every_alert_reads_only_what_the_exporter_publishes():
    known = set(METRIC_NAMES) | PROMETHEUS_SERIES
    for rule in _alerts():
        # the expression, and the queries an annotation runs (the findings alerts list their detector rules)
        text = " ".join([rule["expr"], *rule.get("annotations", {}).values()])
        names = set(re.findall(r"\b(hpcwatch_[a-z_]+)\b", text)) | set(re.findall(r"\bup(?=\{)", rule["expr"]))
        assert names, rule["alert"]
        assert names <= known, f"{rule['alert']}: {sorted(names - known)} not in exporter.METRIC_NAMES"


def test_every_alert_is_unit_tested_firing():
    doc = yaml.safe_load(RULES_TEST.read_text())
    fired = {case["alertname"] for test in doc["tests"] for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert {rule["alert"] for rule in _alerts()} <= fired


# -- Alertmanager --------------------------------------------------------------------------------------


def test_amtool_accepts_the_sample_alertmanager_config():
    result = _run(_tool("amtool"), "check-config", ALERTMANAGER)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "labels, receivers",
    [
        # a drain pages the operators
        ({"alertname": "HpcwatchNodeDrain", "severity": "critical", "node": "node2"}, "operators-page"),
        # a warning goes to the operators' queue
        ({"alertname": "HpcwatchNodeWarn", "severity": "warning", "node": "node2"}, "operators"),
        # a critical finding reaches security and pages the operators
        ({"alertname": "HpcwatchSecurityFindingCritical", "severity": "critical"}, "security,operators-page"),
        # a high one reaches security only
        ({"alertname": "HpcwatchSecurityFindingHigh", "severity": "warning"}, "security"),
        ({"alertname": "HpcwatchExporterDown", "severity": "critical"}, "operators-page"),
    ],
)
def test_the_sample_routes_send_each_alert_where_its_comments_say(labels, receivers):
    argv = [_tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}"]
    result = _run(*argv, f"--verify.receivers={receivers}", *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stdout + result.stderr
