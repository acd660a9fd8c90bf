"""``chronyc tracking`` read and judged: the clock's offset from NTP time, and chrony not synchronised.

Real captures (tests/data/SOURCES.md): the example of chrony's own manual (synchronised, 6.5 µs slow) and an
unsynchronised client from LiaoSirui's notes (reference 00000000, stratum 0). The far-off clock is the manual's
output with its System time line edited in memory."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.chrony import parse_chronyc_tracking, read_chronyc_tracking
from hpcwatch.store import Store
from tests.conftest import DATA

NORMAL = DATA / "chrony" / "chronyc_tracking_normal_chrony_doc.txt"
UNSYNCED = DATA / "chrony" / "chronyc_tracking_not_synchronised_liaosirui.txt"
SYSTEM_TIME = "System time     : 0.000006523 seconds slow of NTP time"


def _node(samples, config=HealthConfig(), node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, config=config).node(node)


def _fired(node_health) -> dict[str, str]:
    return {c.rule: c.verdict for c in node_health.checks if c.verdict != "ok"}


def test_the_offset_is_signed_slow_negative_and_the_leap_status_is_a_number():
    samples = {s.metric: s for s in read_chronyc_tracking(NORMAL, node="gpu07")}
    assert samples[vocab.CHRONY_TRACKING_SYSTEM_TIME_SECONDS].value == pytest.approx(-6.523e-6)
    assert samples[vocab.CHRONY_TRACKING_LAST_OFFSET_SECONDS].value == pytest.approx(-6.747e-6)
    assert samples[vocab.CHRONY_TRACKING_STRATUM].value == 3
    leap = samples[vocab.CHRONY_TRACKING_LEAP_STATUS]
    assert leap.value == 0 and leap.labels["leap"] == "Normal"
    assert leap.labels["reference"] == "CB00710F (ntp1.example.net)" and leap.labels["node"] == "gpu07"


def test_real_synchronised_clock_is_ok_and_real_unsynchronised_one_warns():
    node = _node(read_chronyc_tracking(NORMAL, node="gpu07"))
    assert node.verdict == "ok" and {c.rule for c in node.checks} == {"clock_offset", "clock_unsynchronised"}
    node = _node(read_chronyc_tracking(UNSYNCED, node="gpu07"))
    assert _fired(node) == {"clock_unsynchronised": "warn"}
    assert next(c for c in node.checks if c.rule == "clock_unsynchronised").evidence["reference"] == "00000000 ()"


def test_a_clock_2_s_fast_warns_and_10_min_slow_drains():
    text = NORMAL.read_text()
    fast = text.replace(SYSTEM_TIME, "System time     : 2.000000000 seconds fast of NTP time")
    node = _node(parse_chronyc_tracking(fast, node="gpu07"))
    assert _fired(node) == {"clock_offset": "warn"} and "2 s ahead of NTP time" in node.reason()
    slow = text.replace(SYSTEM_TIME, "System time     : 600.000000000 seconds slow of NTP time")
    node = _node(parse_chronyc_tracking(slow, node="gpu07"))
    assert _fired(node) == {"clock_offset": "drain"} and "behind" in node.reason()
    assert _fired(_node(parse_chronyc_tracking(fast, node="gpu07"), config=HealthConfig(clock_offset_warn_s=5))) == {}


def test_bad_lines_are_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "tracking.txt"
    path.write_text(NORMAL.read_text().replace(SYSTEM_TIME, "System time     : soon seconds slow of NTP time"))
    with pytest.raises(ParseError) as err:
        list(read_chronyc_tracking(path))
    assert str(err.value).startswith(f"{path}:4: System time is not")
    path.write_text(NORMAL.read_text() + "garbage without a colon\n")
    with pytest.raises(ParseError, match=r":14: not a chronyc tracking line"):
        list(read_chronyc_tracking(path))
    bad: list[ParseError] = []
    assert len(list(read_chronyc_tracking(path, on_bad_line=bad.append))) == 4 and len(bad) == 1


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="clock_offset_warn_s"):
        HealthConfig(clock_offset_warn_s=600)
