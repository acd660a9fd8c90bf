"""EDAC memory error counters read and judged: corrected errors past mcelog's trigger warn, any uncorrected one drains.

Real captures (tests/data/SOURCES.md): a server whose DIMM CPU_SrcID#0_MC#2_Chan#0_DIMM#0 corrected 7836 errors, as
``edac-util -v`` and as the sysfs ``csrow*/ch*_ce_count`` files print it (LiaoSirui's notes); the per-rank
``dimm_ce_count`` files and ``edac-util --report=full`` of edac-utils issue 15 (one CE on mc0 rank4, which
edac-util misses); ``edac-util -v`` of a healthy ie31200 board (linux-edac list). The uncorrected errors are the
real outputs edited in memory."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.edac import parse_edac, read_edac
from hpcwatch.store import Store
from tests.conftest import DATA

E = DATA / "edac"
UTIL_7836 = E / "edac_util_v_mc2_7836_ce_liaosirui.txt"
SYSFS_7836 = E / "sysfs_csrow_ch_ce_count_mc2_7836_liaosirui.txt"
SYSFS_RANKS = E / "sysfs_rank_dimm_ce_count_edac_utils_15.txt"
FULL_REPORT = E / "edac_util_report_full_noinfo_edac_utils_15.txt"
HEALTHY = E / "edac_util_v_ie31200_no_errors_lkml.txt"


def _node(samples, config=HealthConfig(), node="gpu07"):
    with Store(":memory:") as store:
        store.add(list(samples))
        table = store.samples()
    return health_report(table, config=config).node(node)


def _fired(node_health) -> dict[str, str]:
    return {c.rule: c.verdict for c in node_health.checks if c.verdict != "ok"}


def _totals(samples, metric) -> dict[str, float]:
    return {s.labels["controller"]: s.value for s in samples if s.metric == metric}


def test_edac_util_and_sysfs_give_the_same_controller_totals():
    by_util = list(read_edac(UTIL_7836, node="gpu07"))
    by_sysfs = list(read_edac(SYSFS_7836, node="gpu07"))
    ce = vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL
    assert _totals(by_util, ce) == {"0": 0, "1": 0, "2": 7836, "3": 0}
    assert _totals(by_sysfs, ce) == {"0": 0, "2": 7836}
    assert _totals(by_util, vocab.NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL) == {"0": 0, "1": 0, "2": 0, "3": 0}
    (dimm,) = [s for s in by_util if s.metric == vocab.EDAC_LOCATION_CORRECTABLE_ERRORS_TOTAL and s.value]
    assert dimm.labels["dimm_label"] == "CPU_SrcID#0_MC#2_Chan#0_DIMM#0" and dimm.labels["node"] == "gpu07"


def test_per_rank_counters_add_up_where_edac_util_saw_nothing():
    ranks = list(read_edac(SYSFS_RANKS, node="gpu07"))
    assert _totals(ranks, vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL) == {"0": 1, "1": 0, "2": 0, "3": 0}
    full = list(read_edac(FULL_REPORT, node="gpu07"))  # the same host: its rank counters are not in the report
    assert set(_totals(full, vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL).values()) == {0}


def test_the_controller_s_own_count_wins_over_its_parts():
    text = "/sys/devices/system/edac/mc/mc0/ce_count:5\n/sys/devices/system/edac/mc/mc0/dimm0/dimm_ce_count:3\n"
    text += "/sys/devices/system/edac/mc/mc0/mc_name:Skylake Socket#0 IMC#0\n"
    assert _totals(parse_edac(text), vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL) == {"0": 5}
    simple = "mc0: Correctable errors:   12\nmc0: Uncorrectable errors: 0\nTotal CE: 12\nTotal UE: 0\n"
    assert _totals(parse_edac(simple), vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL) == {"0": 12}


def test_real_7836_corrected_errors_warn_naming_the_dimm():
    node = _node(read_edac(UTIL_7836, node="gpu07"))
    assert _fired(node) == {"memory_corrected": "warn"}
    check = next(c for c in node.checks if c.rule == "memory_corrected")
    assert check.evidence["controller"] == "2" and check.evidence["count"] == 7836
    assert "CPU_SrcID#0_MC#2_Chan#0_DIMM#0" in node.reason()


def test_real_healthy_counters_are_ok_and_one_corrected_error_is_under_the_trigger():
    for path in (HEALTHY, FULL_REPORT):
        node = _node(read_edac(path, node="gpu07"))
        assert node.verdict == "ok" and {"memory_corrected", "memory_uncorrected"} <= {c.rule for c in node.checks}
    node = _node(read_edac(SYSFS_RANKS, node="gpu07"))  # only CE files were printed: UE was not looked at
    assert node.verdict == "ok" and "memory_uncorrected" not in {c.rule for c in node.checks}
    assert _fired(_node(read_edac(SYSFS_RANKS, node="gpu07"), config=HealthConfig(edac_ce_warn=1))) == {
        "memory_corrected": "warn"
    }


def test_one_uncorrected_error_drains():
    text = UTIL_7836.read_text().replace("mc2: csrow1: 0 Uncorrected Errors", "mc2: csrow1: 1 Uncorrected Errors")
    node = _node(parse_edac(text, node="gpu07"))
    assert _fired(node) == {"memory_uncorrected": "drain", "memory_corrected": "warn"}
    assert "mc2: 1 uncorrected errors" in node.reason()
    sysfs = "/sys/devices/system/edac/mc/mc1/ue_count:2\n/sys/devices/system/edac/mc/mc1/ce_count:0\n"
    assert _fired(_node(parse_edac(sysfs, node="gpu07"))) == {"memory_uncorrected": "drain"}


def test_bad_lines_are_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "edac.txt"
    path.write_text(UTIL_7836.read_text().replace("7836 Corrected", "many Corrected"))
    with pytest.raises(ParseError) as err:
        list(read_edac(path))
    assert str(err.value).startswith(f"{path}:14: EDAC error count is not") and "\n" not in str(err.value)
    path.write_text(SYSFS_7836.read_text() + "mc9 is on fire\n")
    with pytest.raises(ParseError, match=r":9: not an EDAC counter or edac-util line"):
        list(read_edac(path))
    bad: list[ParseError] = []
    assert len(list(read_edac(path, on_bad_line=bad.append))) == 2 + 8 and len(bad) == 1  # totals, locations


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="edac_ce_warn"):
        HealthConfig(edac_ce_warn=0)
