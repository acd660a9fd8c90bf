"""``ipmitool sel elist`` read and judged: GCM's critical events drain, correctable ECC warns, deasserted is history.

Real input (tests/data/SOURCES.md): GCM's SEL fixture (an Upper Non-critical voltage, then an asserted Critical
Interrupt Bus Fatal Error). The ECC and PSU lines are that file's lines with the sensor and event edited in memory."""

from __future__ import annotations

import pytest

from hpcwatch.analysis.health import health_report
from hpcwatch.errors import ParseError
from hpcwatch.sources.ipmitool import parse_ipmitool_sel, read_ipmitool_sel
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind
from tests.conftest import DATA

SEL = DATA / "ipmitool" / "ipmitool_sel_elist_bus_fatal_asserted_gcm.txt"
BUS_FATAL = "Critical Interrupt #0x90 | Bus Fatal Error"


def _node(events, node="gpu07"):
    with Store(":memory:") as store:
        table = store.samples()
    return health_report(table, list(events)).node(node)


def test_each_entry_is_an_event_with_its_sensor_and_direction():
    events = list(read_ipmitool_sel(SEL, node="gpu07"))
    assert [
        (e.kind, e.attrs["record"], e.attrs["sensor_type"], e.attrs["event"], e.attrs["direction"]) for e in events
    ] == [
        (EventKind.IPMI_SEL, 1, "Voltage", "Upper Non-critical going high", "Asserted"),
        (EventKind.IPMI_SEL, 2, "Critical Interrupt", "Bus Fatal Error", "Asserted"),
    ]
    assert events[1].t == 1674053370.0  # 01/18/2023 14:49:30, the BMC's clock read as UTC


def test_a_real_asserted_bus_fatal_error_drains_and_deasserted_is_history():
    node = _node(read_ipmitool_sel(SEL, node="gpu07"))
    (check,) = [c for c in node.checks if c.rule == "ipmi_sel"]
    assert check.verdict == "drain" and check.evidence["entries"] == [BUS_FATAL]
    past = SEL.read_text().replace("Bus Fatal Error | Asserted", "Bus Fatal Error | Deasserted")
    node = _node(parse_ipmitool_sel(past, node="gpu07"))
    assert node.verdict == "ok" and [c.rule for c in node.checks] == ["ipmi_sel"]  # looked, nothing asserted


def test_memory_ecc_and_psu_failure():
    text = SEL.read_text()
    ce = text.replace(f"{BUS_FATAL} | Asserted", "Memory #0x53 | Correctable ECC | Asserted | CPU 1 DIMM A1")
    (event,) = [e for e in parse_ipmitool_sel(ce, node="gpu07") if e.attrs["record"] == 2]
    assert event.attrs["detail"] == "CPU 1 DIMM A1" and event.attrs["direction"] == "Asserted"
    assert _node(parse_ipmitool_sel(ce, node="gpu07")).verdict == "warn"
    ue = text.replace(BUS_FATAL, "Memory #0x53 | Uncorrectable ECC")
    assert _node(parse_ipmitool_sel(ue, node="gpu07")).verdict == "drain"
    psu = text.replace(BUS_FATAL, "Power Supply PSU2_Status | Failure detected")
    assert _node(parse_ipmitool_sel(psu, node="gpu07")).verdict == "drain"


def test_bad_line_is_one_line(tmp_path):
    path = tmp_path / "sel.txt"
    path.write_text(SEL.read_text() + "   3 | only | three\n")
    with pytest.raises(ParseError) as err:
        list(read_ipmitool_sel(path))
    assert str(err.value).startswith(f"{path}:3: not an ipmitool sel line")
    bad: list[ParseError] = []
    assert len(list(read_ipmitool_sel(path, on_bad_line=bad.append))) == 2 and len(bad) == 1
