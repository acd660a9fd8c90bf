"""``ipmitool sdr list`` / ``sdr elist`` / ``sensor`` read and judged by the BMC's own thresholds and states.

Real inputs (tests/data/SOURCES.md): a Dell R320 with two fans at 0 RPM in critical (``sdr list full``), an HP
DL360 G7 whose Power Supply 1 asserts Failure detected under an ``ok`` status (``sdr elist full``), a Supermicro
fan at its upper non-critical threshold and a healthy Supermicro board (``sensor``)."""

from __future__ import annotations

import pytest

from hpcwatch.analysis.health import health_report, worst
from hpcwatch.errors import ParseError
from hpcwatch.sources.ipmitool_sdr import parse_ipmitool_sdr, read_ipmitool_sdr
from hpcwatch.store import Store
from hpcwatch.vocab import IPMI_SENSOR_READING, IPMI_SENSOR_STATE, IPMI_SENSOR_STATUS
from tests.conftest import DATA

DIR = DATA / "ipmitool"
DELL_FANS = DIR / "ipmitool_sdr_list_full_dell_r320_fans_cr_ha_issue52.txt"
HP_PSU = DIR / "ipmitool_sdr_elist_full_hp_dl360g7_psu_failure_collegeboreal.txt"
SM_NC = DIR / "ipmitool_sensor_supermicro_bpn_fan2_nc_issue1.txt"
SM_OK = DIR / "ipmitool_sensor_supermicro_ok_fancontrol_issue1.txt"


def _node(samples, node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, []).node(node)


def _verdicts(node):
    """rule -> its worst verdict on the node (a rule may give one check per verdict)."""
    rules = {c.rule for c in node.checks if c.rule.startswith("bmc_")}
    return {r: worst(c.verdict for c in node.checks if c.rule == r) for r in rules}


def test_sdr_list_gives_each_sensor_its_status_and_reading():
    samples = list(read_ipmitool_sdr(DELL_FANS, node="gpu07", t=5.0))
    status = {s.labels["sensor"]: s.value for s in samples if s.metric == IPMI_SENSOR_STATUS}
    assert len(status) == 17 and status["Fan3B"] == 2.0 and status["Fan3A"] == 0.0
    (fan,) = [s for s in samples if s.metric == IPMI_SENSOR_READING and s.labels["sensor"] == "Fan1A"]
    assert fan.value == 7560.0 and fan.labels == {"node": "gpu07", "sensor": "Fan1A", "unit": "RPM"} and fan.t == 5.0


def test_real_fans_in_critical_drain_naming_them():
    node = _node(read_ipmitool_sdr(DELL_FANS, node="gpu07", t=5.0))
    (check,) = [c for c in node.checks if c.rule == "bmc_sensor"]
    assert check.verdict == "drain" and [s["sensor"] for s in check.evidence["sensors"]] == ["Fan3B", "Fan4B"]
    assert "critical" in check.title and _verdicts(node)["bmc_psu_fan"] == "ok"


def test_real_psu_failure_drains_though_its_status_says_ok():
    samples = list(read_ipmitool_sdr(HP_PSU, node="gpu07", t=5.0))
    (psu,) = [s for s in samples if s.metric == IPMI_SENSOR_STATUS and s.labels["sensor"] == "Power Supply 1"]
    assert psu.labels["entity"] == "10.1" and psu.labels["states"] == "Presence detected, Failure detected"
    node = _node(samples)
    assert node.verdict == "drain" and _verdicts(node) == {"bmc_psu_fan": "drain", "bmc_sensor": "ok"}
    (drain,) = [c for c in node.checks if c.rule == "bmc_psu_fan" and c.verdict == "drain"]
    assert drain.evidence["sensors"] == ["Power Supply 1: Presence detected, Failure detected"]
    (warn,) = [c for c in node.checks if c.rule == "bmc_psu_fan" and c.verdict == "warn"]
    assert warn.evidence["sensors"] == ["Power Supplies: Non-Redundant: Sufficient from Redundant"]


def test_the_same_psu_healthy_again_is_ok():
    healed = (
        HP_PSU.read_text()
        .replace(", Failure detected", "")
        .replace("Non-Redundant: Sufficient from Redundant", "Fully Redundant")
    )
    node = _node(parse_ipmitool_sdr(healed, node="gpu07", t=5.0))
    assert node.verdict == "ok"


def test_real_sensor_at_its_upper_non_critical_threshold_warns_with_the_bmcs_thresholds():
    node = _node(read_ipmitool_sdr(SM_NC, node="gpu07", t=5.0))
    (check,) = [c for c in node.checks if c.rule == "bmc_sensor"]
    (sensor,) = check.evidence["sensors"]
    assert check.verdict == "warn" and sensor["sensor"] == "BPN-FAN2" and sensor["status"] == "nc"
    assert (sensor["unc"], sensor["ucr"], sensor["unr"]) == ("13300", "13400", "13500")


def test_real_healthy_board_is_ok_and_sensors_without_reading_are_not_faults():
    samples = list(read_ipmitool_sdr(SM_OK, node="gpu07", t=5.0))
    assert {s.labels["sensor"] for s in samples if s.value == -1.0} == {"M2NVMeSSD Temp1", "M2NVMeSSD Temp2"}
    node = _node(samples)
    assert node.verdict == "ok" and _verdicts(node) == {"bmc_sensor": "ok", "bmc_psu_fan": "ok"}


def test_newest_listing_wins_and_non_recoverable_drains():
    fixed = DELL_FANS.read_text().replace("0 RPM             | cr", "7200 RPM          | ok")
    samples = [*read_ipmitool_sdr(DELL_FANS, node="gpu07", t=5.0), *parse_ipmitool_sdr(fixed, node="gpu07", t=9.0)]
    assert _node(samples).verdict == "ok"
    hot = SM_OK.read_text().replace("| 31.000     | degrees C  | ok ", "| 96.000     | degrees C  | unr")
    (check,) = [c for c in _node(parse_ipmitool_sdr(hot, node="gpu07", t=5.0)).checks if c.rule == "bmc_sensor"]
    assert check.verdict == "drain" and check.evidence["sensors"][0]["level"] == "non-recoverable"


def test_discrete_sensor_lines_keep_their_state_bits():
    (state,) = parse_ipmitool_sdr("PS1 Status | 0x1 | discrete | 0x0100| na | na | na | na | na | na")
    assert state.metric == IPMI_SENSOR_STATE and state.labels == {"sensor": "PS1 Status", "state": "0x0100"}


def test_bad_line_is_one_line(tmp_path):
    path = tmp_path / "sdr.txt"
    path.write_text(DELL_FANS.read_text() + "Fan6A | 7000 RPM\n")
    with pytest.raises(ParseError) as err:
        list(read_ipmitool_sdr(path))
    message = str(err.value)
    assert f"{path}:18:" in message and "\n" not in message and "want 3 columns" in message
    bad: list[ParseError] = []
    assert len(list(read_ipmitool_sdr(path, on_bad_line=bad.append))) == 34 and len(bad) == 1
