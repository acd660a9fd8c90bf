"""``systemctl --failed --output=json`` read and judged: a failed unit warns, a failed unit the node needs drains.

Real input (tests/data/SOURCES.md): ubuntu-tool's ``systemctl list-units --output=json`` fixture (cron active,
nginx failed, apt-daily inactive). The failed slurmd is that listing with nginx renamed in memory."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.errors import ParseError
from hpcwatch.reports.health import health_rules
from hpcwatch.sources.systemd_units import parse_systemctl_json, read_systemctl_json
from hpcwatch.store import Store
from tests.conftest import DATA

UNITS = DATA / "systemd" / "systemctl_list_units_json_nginx_failed_ubuntu_tool.json"


def _node(samples, config=HealthConfig(), node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, config=config).node(node)


def test_each_unit_is_a_sample_and_the_failed_ones_are_counted():
    samples = list(read_systemctl_json(UNITS, node="gpu07"))
    per_unit = {s.labels["unit"]: s.value for s in samples if s.metric == vocab.SYSTEMD_UNIT_FAILED}
    assert per_unit == {"cron.service": 0, "nginx.service": 1, "apt-daily.service": 0}
    (count,) = [s for s in samples if s.metric == vocab.SYSTEMD_UNITS_FAILED]
    assert count.value == 1 and count.labels == {"node": "gpu07"}


def test_a_real_failed_unit_warns_and_a_failed_slurmd_drains():
    node = _node(read_systemctl_json(UNITS, node="gpu07"))
    (check,) = [c for c in node.checks if c.rule == "failed_units"]
    assert check.verdict == "warn" and check.evidence["units"] == ["nginx.service"] and check.evidence["critical"] == []
    slurmd = UNITS.read_text().replace('"nginx.service"', '"slurmd.service"')
    node = _node(parse_systemctl_json(slurmd, node="gpu07"))
    assert node.verdict == "drain" and "slurmd.service" in node.reason()


def test_an_empty_listing_is_looked_at_and_fine():
    node = _node(parse_systemctl_json("[]\n", node="gpu07"))
    assert node.verdict == "ok" and [c.rule for c in node.checks] == ["failed_units"]


def test_the_listing_names_the_critical_units():
    (rule,) = [r for r in health_rules() if r["id"] == "failed_units"]
    assert "slurmd.service, munge.service" in rule["threshold"]


def test_bad_input_is_one_line(tmp_path):
    path = tmp_path / "failed.json"
    path.write_text('{"unit": "x"}')
    with pytest.raises(ParseError, match="want an array of units"):
        list(read_systemctl_json(path))
    path.write_text('[{"unit": "x"')
    with pytest.raises(ParseError) as err:
        list(read_systemctl_json(path))
    assert str(err.value).startswith(f"{path}:1: not JSON")
