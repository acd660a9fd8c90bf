"""``smartctl --json`` read and judged: NVMe critical warning, spare, wear, media errors, SMART status.

Real captures (tests/data/SOURCES.md): smartctl_exporter's Samsung MZWLL3T2HAJQ (Critical Warning 0x10,
SMART failed), its Intel SSDPE2KX020T7 (75 % used, healthy) and WDC WD20EFRX (SATA, passed); GCM's nvme9 fixture
(spare 0 % under an 11 % threshold)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from click.testing import CliRunner

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.cli import app
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.records import Sample
from hpcwatch.sources.smartctl import parse_smartctl_json, read_smartctl_json
from hpcwatch.store import Store
from tests.conftest import DATA

SMART = DATA / "smartctl"
SAMSUNG = SMART / "nvme_samsung_mzwll3t2hajq_critical_warning_0x10.json"
INTEL = SMART / "nvme_intel_ssdpe2kx020t7_used_75.json"
WDC = SMART / "sat_wdc_wd20efrx_passed.json"
GCM_NVME9 = SMART / "nvme_gcm_learn_bad_nvme9_spare_below_threshold.json"


def _node(samples, config=HealthConfig(), node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, config=config).node(node)


def _fired(node_health) -> dict[str, str]:
    return {c.rule: c.verdict for c in node_health.checks if c.verdict != "ok"}


def test_the_nvme_log_becomes_samples_named_as_smartctl_exporter_names_them():
    samples = {s.metric: s for s in read_smartctl_json(SAMSUNG, node="gpu07")}
    assert samples[vocab.SMARTCTL_DEVICE_CRITICAL_WARNING].value == 16
    assert samples[vocab.SMARTCTL_DEVICE_SMART_STATUS].value == 0
    assert samples[vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE].value == 100
    assert samples[vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE_THRESHOLD].value == 10
    assert samples[vocab.SMARTCTL_DEVICE_TEMPERATURE].value == 40
    one = samples[vocab.SMARTCTL_DEVICE_MEDIA_ERRORS]
    assert one.t == 1234567890  # local_time.time_t: when smartctl ran (redacted upstream)
    assert one.labels["node"] == "gpu07" and one.labels["device"] == "nvme0"
    assert one.labels["model_name"] == "SAMSUNG MZWLL3T2HAJQ-00005" and one.labels["device_type"] == "nvme"


def test_a_sata_drive_gives_its_status_and_temperature_only():
    metrics = {s.metric for s in read_smartctl_json(WDC, node="gpu07")}
    assert metrics == {vocab.SMARTCTL_DEVICE_SMART_STATUS, vocab.SMARTCTL_DEVICE_TEMPERATURE}


def test_real_critical_warning_0x10_drains_naming_the_failed_backup():
    node = _node(read_smartctl_json(SAMSUNG, node="gpu07"))
    assert node.verdict == "drain" and _fired(node) == {"nvme_critical_warning": "drain"}
    (check,) = [c for c in node.checks if c.rule == "nvme_critical_warning"]
    assert check.evidence["bits"] == ["volatile_memory_backup_failed"] and check.evidence["device"] == "nvme0"
    # its SMART status failed too, but an NVMe drive is judged by its bits: one reason, not two
    assert {c.rule for c in node.checks if c.verdict == "ok"} >= {"nvme_spare", "nvme_wear", "nvme_media_errors"}


def test_real_spare_under_its_threshold_drains():
    node = _node(read_smartctl_json(GCM_NVME9, node="gpu07"))
    assert _fired(node) == {"nvme_spare": "drain"}
    (check,) = [c for c in node.checks if c.rule == "nvme_spare"]
    assert check.evidence["available_spare_pct"] == 0 and check.evidence["threshold_pct"] == 11


def test_a_real_drive_at_75_percent_used_is_ok_at_80_and_warns_at_70():
    assert _node(read_smartctl_json(INTEL, node="gpu07")).verdict == "ok"
    node = _node(read_smartctl_json(INTEL, node="gpu07"), config=HealthConfig(nvme_used_warn_pct=70))
    assert _fired(node) == {"nvme_wear": "warn"}
    node = _node(
        read_smartctl_json(INTEL, node="gpu07"), config=HealthConfig(nvme_used_warn_pct=70, nvme_used_drain_pct=75)
    )
    assert _fired(node) == {"nvme_wear": "drain"}


def _with(samples, metric: str, value: float, *, dt: float = 0.0) -> list[Sample]:
    return [dataclasses.replace(s, value=value, t=s.t + dt) if s.metric == metric else s for s in samples]


def test_media_errors_warn_when_old_and_drain_when_they_grow():
    healthy = list(read_smartctl_json(INTEL, node="gpu07"))
    old = _with(healthy, vocab.SMARTCTL_DEVICE_MEDIA_ERRORS, 3)
    assert _fired(_node(old)) == {"nvme_media_errors": "warn"}
    later = _with(healthy, vocab.SMARTCTL_DEVICE_MEDIA_ERRORS, 5, dt=60)
    node = _node(old + later)
    assert _fired(node) == {"nvme_media_errors": "drain"}
    (check,) = [c for c in node.checks if c.rule == "nvme_media_errors"]
    assert check.evidence["increase"] == 2 and check.evidence["media_errors"] == 5


def test_temperature_bit_warns_with_the_temperature_and_a_failed_sata_drive_drains():
    hot = _with(list(read_smartctl_json(INTEL, node="gpu07")), vocab.SMARTCTL_DEVICE_CRITICAL_WARNING, 0x02)
    node = _node(hot)
    assert _fired(node) == {"nvme_temperature": "warn"}
    assert next(c for c in node.checks if c.rule == "nvme_temperature").evidence["temperature_c"] == 19
    failing = _with(list(read_smartctl_json(WDC, node="gpu07")), vocab.SMARTCTL_DEVICE_SMART_STATUS, 0)
    assert _fired(_node(failing)) == {"smart_status": "drain"}


def test_a_device_smartctl_could_not_open_yields_nothing():
    doc = {
        "json_format_version": [1, 0],
        "smartctl": {"exit_status": 2, "messages": [{"string": "Smartctl open device: /dev/sdz failed"}]},
    }
    assert list(parse_smartctl_json(orjson.dumps(doc).decode())) == []


def test_bad_input_is_one_line_naming_the_file_and_line(tmp_path):
    text = SAMSUNG.read_text().replace('"media_errors": 0', '"media_errors": "many"')
    path = tmp_path / "nvme0.json"
    path.write_text(text)
    line = next(i for i, row in enumerate(text.split("\n"), 1) if '"media_errors"' in row)
    with pytest.raises(ParseError) as err:
        list(read_smartctl_json(path))
    assert str(err.value).startswith(f"{path}:{line}: nvme_smart_health_information_log.media_errors is not a number")
    path.write_text('{"smartctl": {"exit_status": 0}, "json_format_version": [1, 0]')
    with pytest.raises(ParseError, match="not JSON"):
        list(read_smartctl_json(path))


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="nvme_used_warn_pct"):
        HealthConfig(nvme_used_warn_pct=90, nvme_used_drain_pct=80)


def test_ingest_then_health_drains_the_node_through_the_cli(tmp_path):
    db = str(tmp_path / "store")
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", "--db", db, "--host", "gpu07", str(SAMSUNG), str(INTEL)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["health", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    (node,) = orjson.loads(result.output)["nodes"]
    assert node["node"] == "gpu07" and node["verdict"] == "drain"
    assert "nvme_critical_warning: NVMe nvme0 critical warning 0x10" in node["reason"]
