"""perfquery and ibstat: real switch counters (treydock/infiniband_exporter fixtures), data counters x4."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.infiniband import parse_ibstat, parse_perfquery, read_ibstat, read_perfquery
from tests.conftest import DATA

IB = DATA / "infiniband"


def _values(samples):
    return {(s.metric, s.labels["port"]): s.value for s in samples}


def test_extended_data_counters_are_words_times_four():
    values = _values(read_perfquery(IB / "perfquery_x_switch_2ports.out", node="ib-i1l1s01", t=1.0))
    assert values[("ib_PortXmitData_bytes", "1")] == 36298026860928 * 4
    assert values[("ib_PortRcvData_bytes", "2")] == 39078804993378 * 4
    assert values[("ib_PortXmitPkts", "1")] == 101733204203
    assert values[("ib_PortXmitWait", "2")] == 36510964
    assert ("ib_PortSelect", "1") not in values and ("ib_CounterSelect", "1") not in values


def test_labels_carry_node_lid_and_port():
    sample = next(iter(read_perfquery(IB / "perfquery_x_switch_port1.out", node="ib-i4l1s01", device="sw", t=2.0)))
    assert sample.labels == {"node": "ib-i4l1s01", "device": "sw", "lid": "2052", "port": "1"} and sample.t == 2.0


def test_error_counters_of_the_real_switch_port():
    values = _values(read_perfquery(IB / "perfquery_x_switch_port1.out", t=0))
    assert values[("ib_LinkDownedCounter", "1")] == 1
    assert values[("ib_PortXmitDiscards", "1")] == 20046
    assert values[("ib_PortRcvSwitchRelayErrors", "1")] == 7


def test_empty_perfquery_output_gives_nothing():
    assert list(read_perfquery(IB / "perfquery_x_empty.out")) == []


def test_basic_counters_without_x():
    values = _values(read_perfquery(IB / "perfquery_basic_hca.txt", t=0))
    assert values[("ib_PortXmitData_bytes", "1")] == 4294967295 * 4
    assert values[("ib_PortRcvPkts", "1")] == 55591


def test_ibstat_ports_up_down_rate():
    samples = list(read_ibstat(IB / "ibstat_two_cas.txt", node="gpu07", t=3.0))
    up = {s.labels["device"]: s.value for s in samples if s.metric == "ib_port_up"}
    rate = {s.labels["device"]: s.value for s in samples if s.metric == "ib_port_rate_gbps"}
    assert up == {"mlx5_0": 1.0, "mlx5_1": 0.0} and rate == {"mlx5_0": 400.0, "mlx5_1": 10.0}
    down = next(s for s in samples if s.labels["device"] == "mlx5_1" and s.metric == "ib_port_up")
    assert down.labels["state"] == "Down" and down.labels["physical_state"] == "Polling"
    assert down.labels["node"] == "gpu07" and down.labels["port"] == "1"


BAD_PERFQUERY = [
    # a counter before any header: which port would it be?
    ("PortXmitData:....1\n", 1, "before any"),
    # a header that is not perfquery's
    ("# Port stats of something\n", 1, "not a perfquery header"),
    # a negative counter
    ("# Port counters: Lid 1 port 1 (CapMask: 0x0)\nPortXmitData:....-5\n", 2, "not a counter value"),
    # a line without the dotted separator
    ("# Port counters: Lid 1 port 1 (CapMask: 0x0)\nPortXmitData 5\n", 2, "not a perfquery counter line"),
]


@pytest.mark.parametrize("text,line,what", BAD_PERFQUERY)
def test_bad_perfquery(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_perfquery(text, path="p.out"))
    assert err.value.line == line and what in err.value.what


BAD_IBSTAT = [
    # a port before any CA
    ("Port 1:\n\tState: Active\n", 1, "before any CA"),
    # a line that is not Key: value
    ("CA 'mlx5_0'\n\tgarbage\n", 2, "not an ibstat line"),
    # a rate that is not a number (reported at the port's line)
    ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: fast\n", 2, "Rate is not a number"),
]


@pytest.mark.parametrize("text,line,what", BAD_IBSTAT)
def test_bad_ibstat(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_ibstat(text, path="i.txt"))
    assert err.value.line == line and what in err.value.what


def test_saved_file_name_gives_node_and_device(tmp_path):
    folder = tmp_path / "perfquery" / "node2"
    folder.mkdir(parents=True)
    (folder / "mlx5_3.1.txt").write_bytes((IB / "perfquery_x_switch_port1.out").read_bytes())
    sample = next(iter(read_perfquery(folder / "mlx5_3.1.txt", t=0)))
    assert (sample.labels["node"], sample.labels["device"], sample.labels["port"]) == ("node2", "mlx5_3", "1")
    # the real fixtures are named by GUID: nothing is guessed
    assert "node" not in next(iter(read_perfquery(IB / "perfquery_x_switch_port1.out", t=0))).labels


def test_real_ibpanic_line_is_a_vanished_device_sample():
    samples = list(read_ibstat(IB / "ibstat_a100_ibpanic_mlx5_8_gpud.txt", node="gpu07", t=5.0))
    gone = [s for s in samples if s.metric == "ib_device_up"]
    assert [(s.labels, s.value) for s in gone] == [
        ({"node": "gpu07", "device": "mlx5_8", "error": "No such file or directory"}, 0.0)
    ]
    up = {s.labels["device"] for s in samples if s.metric == "ib_port_up" and s.value == 1.0}
    assert up == {f"mlx5_{i}" for i in range(8)}  # the eight HCAs read before the panic


@pytest.mark.parametrize(
    "prompt", ["$ ibstat", "user@host:~$ ibstat", "[root@node045 ~]# ibstat mlx5_0", "~$ sudo ibstat"]
)
def test_shell_prompt_lines_are_skipped_and_sniffed(prompt):
    from hpcwatch.sources.infiniband import is_ibstat

    text = f"{prompt}\n" + (IB / "ibstat_two_cas.txt").read_text()
    assert is_ibstat(text)
    assert list(parse_ibstat(text, t=1.0)) == list(read_ibstat(IB / "ibstat_two_cas.txt", t=1.0))


def test_real_pasted_capture_is_recognised_by_the_registry():
    from hpcwatch.sources.registry import read_input

    records = list(read_input(IB / "ibstat_pasted_prompt_ibpanic_azhpc_diagnostics59.txt", host="n1"))
    assert {(r.metric, r.labels["device"]) for r in records} >= {
        ("ib_device_up", "mlx5_an0"),
        ("ib_port_up", "mlx5_ib0"),
    }
