"""The health rules are declared once (analysis.health_rules.HEALTH_RULES): checks, listings and readers agree."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import get_args

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch.analysis.health import Check, HealthConfig
from hpcwatch.analysis.health_rules import FAMILIES, HEALTH_RULE_IDS, HEALTH_RULES, HealthRuleId, health_rule
from hpcwatch.cli import app
from hpcwatch.cli.common import console
from hpcwatch.reports.health import health_rules
from hpcwatch.sources.registry import formats

SRC = Path(__file__).resolve().parents[2] / "src" / "hpcwatch"
#: Calls that make a health check (or a rule that becomes one), and the ``rule=`` expressions that pass an id on
#: rather than naming one: (file, call, expression). A new non-literal one must be added here by hand, on purpose.
_MAKERS = {"Check", "NcclRule", "_check_threshold", "FleetSource"}
_PASSED_ON = {
    ("analysis/health.py", "Check", "rule"),  # _check_threshold's own parameter
    ("analysis/health.py", "Check", "r.rule"),  # an NcclRule becoming a check
    ("analysis/health.py", "Check", "r"),  # judge's "nothing found" for a rule that looked
}


def _rule_arguments() -> list[tuple[str, str, ast.expr]]:
    """Every ``rule=`` given to a call that makes a check, anywhere in the package."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in _MAKERS:
                continue
            for kw in node.keywords:
                if kw.arg == "rule":
                    out.append((path.relative_to(SRC).as_posix(), name, kw.value))
    return out


def test_the_type_and_the_table_name_the_same_rules_once():
    assert len(HEALTH_RULE_IDS) == len(set(HEALTH_RULE_IDS))
    assert set(HEALTH_RULE_IDS) == set(get_args(HealthRuleId))
    assert {r.family for r in HEALTH_RULES} <= set(FAMILIES)


def test_every_rule_a_code_path_can_emit_is_in_the_table():
    arguments = _rule_arguments()
    literal = {a.value for _, _, a in arguments if isinstance(a, ast.Constant)}
    assert literal, "found no rule= literal: the scan is broken"
    assert literal <= set(HEALTH_RULE_IDS), sorted(literal - set(HEALTH_RULE_IDS))
    passed_on = {(f, call, ast.unparse(a)) for f, call, a in arguments if not isinstance(a, ast.Constant)}
    assert passed_on <= _PASSED_ON, f"a check whose rule the table cannot vouch for: {sorted(passed_on - _PASSED_ON)}"


def _mapped_rule_ids() -> set[str]:
    """Rule ids that are values of a ``dict[..., HealthRuleId]`` table (an event kind -> the rule judging it)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.AnnAssign)
                and "HealthRuleId" in ast.unparse(node.annotation)
                and isinstance(node.value, ast.Dict)
            ):
                found |= {v.value for v in node.value.values if isinstance(v, ast.Constant)}
    return found


def test_no_rule_in_the_table_is_dead():
    """Each row is emitted by some code path (else --list-rules promises a check nobody runs): named by a
    ``rule=`` literal, or by a kind -> rule table whose values a ``Check(rule=rule)`` passes on."""
    literal = {a.value for _, _, a in _rule_arguments() if isinstance(a, ast.Constant)}
    assert set(HEALTH_RULE_IDS) - literal - _mapped_rule_ids() == set()
    assert _mapped_rule_ids() <= set(HEALTH_RULE_IDS)


def test_a_check_under_an_unknown_rule_or_verdict_is_refused():
    with pytest.raises(ValueError, match="unknown health rule 'xdi'"):
        Check(node="n1", rule="xdi", verdict="drain", title="typo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not one of its actions"):
        Check(node="n1", rule="ecc_dbe", verdict="warn", title="ecc_dbe only drains")
    assert Check(node="n1", rule="ecc_dbe", verdict="ok", title="nothing found").rule == "ecc_dbe"


def test_every_source_is_a_registered_format_and_every_threshold_field_is_a_config_field():
    names = {f.name for f in formats()}
    fields = {f.name for f in dataclasses.fields(HealthConfig)}
    for rule in HEALTH_RULES:
        assert rule.sources and set(rule.sources) <= names, (rule.id, rule.sources)
        assert set(rule.config_fields) <= fields, (rule.id, rule.config_fields)
        assert rule.citation and rule.threshold and rule.signal


def test_the_listing_fills_thresholds_from_the_config_it_is_given():
    listed = health_rules()
    assert [r["id"] for r in listed] == list(HEALTH_RULE_IDS)
    assert all("{" not in r["threshold"] for r in listed)
    (replay,) = [r for r in listed if r["id"] == "pcie_replay"]
    assert ">= 10 " in replay["threshold"] and replay["config_fields"] == ["pcie_replay_warn"]
    (replay,) = [r for r in health_rules(HealthConfig(pcie_replay_warn=3)) if r["id"] == "pcie_replay"]
    assert ">= 3 " in replay["threshold"]
    assert health_rule("ib_write_bw").active and not health_rule("ib_port").active


def test_cli_lists_every_rule_as_json_and_as_a_table(monkeypatch):
    # The console is made once per process, by whichever test prints first: COLUMNS would come too late.
    monkeypatch.setattr(console, "width", 250)
    runner = CliRunner()
    result = runner.invoke(app, ["health", "--list-rules", "--json"])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert [r["id"] for r in doc["rules"]] == list(HEALTH_RULE_IDS)
    first = doc["rules"][0]
    assert {"id", "family", "sources", "severity", "actions", "threshold", "citation"} <= set(first)
    result = runner.invoke(app, ["health", "--list-rules"])
    assert result.exit_code == 0, result.output
    for rule_id in HEALTH_RULE_IDS:
        assert f" {rule_id} " in result.output, rule_id
