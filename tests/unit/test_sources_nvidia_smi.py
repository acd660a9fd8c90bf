"""nvidia-smi XML and CSV from a real H200, renamed to DCGM fields; compute processes as events."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Sample
from hpcwatch.sources.nvidia_smi import (
    parse_nvidia_smi_csv,
    parse_nvidia_smi_xml,
    read_nvidia_smi_csv,
    read_nvidia_smi_xml,
)
from tests.conftest import DATA

SMI = DATA / "nvidia_smi"
UUID = "GPU-75d41c9c-c88d-f13f-2c5b-d3c423e9d7cc"


def _metrics(records):
    return {r.metric: r for r in records if isinstance(r, Sample)}


def test_xml_readings_of_the_real_h200():
    got = _metrics(read_nvidia_smi_xml(SMI / "nvidia_smi_q.xml", hostname="h200-1"))
    assert got["DCGM_FI_DEV_POWER_USAGE"].value == 77.97  # instant_power_draw
    assert got["DCGM_FI_DEV_FB_USED"].value == 4.0  # MiB
    assert got["DCGM_FI_DEV_GPU_TEMP"].value == 35.0
    assert got["DCGM_FI_DEV_SM_CLOCK"].value == 345.0
    assert got["DCGM_FI_DEV_GPU_UTIL"].value == 0.0
    labels = got["DCGM_FI_DEV_GPU_UTIL"].labels
    assert labels == {
        "gpu": "0",
        "UUID": UUID,
        "modelName": "NVIDIA H200",
        "Hostname": "h200-1",
        "pci_bus_id": "00000000:00:06.0",
        "DCGM_FI_DRIVER_VERSION": "580.159.04",
        "DCGM_FI_DEV_VBIOS_VERSION": "96.00.A5.00.1A",
        "cuda_version": "13.0",
    }
    assert got["DCGM_FI_DEV_GPU_UTIL"].t == datetime(2026, 11, 29, 22, 14, 45, tzinfo=UTC).timestamp()


def test_xml_compute_processes_become_events():
    events = [
        r
        for r in read_nvidia_smi_xml(SMI / "nvidia_smi_q_with_processes.xml", hostname="h200-1")
        if isinstance(r, Event)
    ]
    assert [e.kind for e in events] == ["gpu_process", "gpu_process"]
    assert events[0].attrs["pid"] == 48213 and events[0].attrs["used_memory_bytes"] == 61234 * 2**20
    assert events[1].attrs["process_name"] == "/tmp/.x/miner" and events[1].attrs["uuid"] == UUID
    assert events[1].attrs["host"] == "h200-1" and events[1].attrs["gpu"] == "0"


def test_real_query_csv_with_units_and_header():
    got = _metrics(read_nvidia_smi_csv(SMI / "nvidia_smi_query.csv"))
    assert got["DCGM_FI_DEV_POWER_USAGE"].value == 77.88 and got["DCGM_FI_DEV_MEM_CLOCK"].value == 3201
    assert got["DCGM_FI_DEV_FB_USED"].labels["UUID"] == UUID
    assert got["DCGM_FI_DEV_FB_USED"].t == datetime(2026, 11, 29, 22, 14, 46, 82000, tzinfo=UTC).timestamp()


def test_noheader_nounits_csv_needs_the_columns():
    columns = ["index", "uuid", "name", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu", "clocks.sm"]
    samples = list(read_nvidia_smi_csv(SMI / "nvidia_smi_query_noheader_nounits.csv", columns=columns, t=9.0))
    util = {s.labels["gpu"]: s.value for s in samples if s.metric == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {"0": 97.0, "1": 0.0}
    power = {s.labels["gpu"]: s.value for s in samples if s.metric == "DCGM_FI_DEV_POWER_USAGE"}
    assert power == {"0": 612.4}  # GPU 1 said [N/A]
    assert all(s.t == 9.0 for s in samples)


def test_units_csv_skips_not_supported():
    samples = list(read_nvidia_smi_csv(SMI / "nvidia_smi_query_units.csv", hostname="n1", t=1.0))
    assert {(s.metric, s.labels["gpu"]) for s in samples if s.metric == "DCGM_FI_DEV_POWER_USAGE"} == {
        ("DCGM_FI_DEV_POWER_USAGE", "0")
    }
    assert all(s.labels["Hostname"] == "n1" for s in samples)


BAD_XML = [
    # truncated XML: the line where it broke
    ("<nvidia_smi_log>\n<gpu>\n", 3, "not XML"),
    # XML of something else
    ("<html></html>", 1, "not an nvidia-smi log"),
    # a reading that is not a number
    (
        "<nvidia_smi_log><timestamp>Sun Nov 29 22:14:45 2026</timestamp>\n<gpu><utilization>\n<gpu_util>lots</gpu_util>"
        "</utilization></gpu></nvidia_smi_log>",
        3,
        "not a reading",
    ),
    # a timestamp in another shape
    ("<nvidia_smi_log>\n  <timestamp>yesterday</timestamp></nvidia_smi_log>", 2, "timestamp"),
    # an empty document
    ("", 1, "not XML"),
    # a "billion laughs" entity bomb: expat's amplification limit stops it
    (
        '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
        + "".join(f'<!ENTITY {n} "{("&" + p + ";") * 10}">' for p, n in zip("abcdefg", "bcdefgh"))
        + "]><nvidia_smi_log><timestamp>&h;</timestamp></nvidia_smi_log>",
        1,
        "amplification",
    ),
]


@pytest.mark.parametrize("text,line,what", BAD_XML)
def test_bad_xml(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_nvidia_smi_xml(text, path="q.xml"))
    assert err.value.line == line and what in err.value.what


BAD_CSV = [
    # a header that names no query field
    ("foo, bar\n1, 2\n", 1, "not an nvidia-smi --query-gpu header"),
    # a row with a missing value
    ("index, utilization.gpu [%]\n0\n", 2, "1 values for 2 columns"),
    # a reading that is not a number
    ("timestamp, index, utilization.gpu [%]\n2026/11/29 22:14:46.082, 0, busy\n", 2, "not a reading"),
    # no timestamp column and no time given
    ("index, utilization.gpu [%]\n0, 5 %\n", 2, "no timestamp"),
]


@pytest.mark.parametrize("text,line,what", BAD_CSV)
def test_bad_csv(text, line, what):
    with pytest.raises(ParseError) as err:
        list(parse_nvidia_smi_csv(text, path="q.csv"))
    assert err.value.line == line and what in err.value.what


MIG = SMI / "nvidia_smi_q_a100_mig_ceems.xml"  # real A100-PCIE-40GB nodes, two GPUs in MIG mode (CEEMS)


def test_mig_instances_are_rows_of_their_own_tied_to_the_parent():
    """Before: the <mig_devices> were skipped (the file gave no sample at all). Now one row per instance."""
    samples = [r for r in read_nvidia_smi_xml(MIG, hostname="n1") if isinstance(r, Sample)]
    rows = {
        (s.labels["gpu"], s.labels["GPU_I_ID"], s.labels["GPU_CI_ID"], s.labels["mig_device"], s.metric): s.value
        for s in samples
    }
    # gpu 00000000:21:00.0 (index 2): instances 1, 5, 13 with 37/19968, 12/9856, 12/4864 MiB used/total
    assert rows[("2", "1", "0", "0", "DCGM_FI_DEV_FB_USED")] == 37.0
    assert rows[("2", "1", "0", "0", "DCGM_FI_DEV_FB_TOTAL")] == 19968.0
    assert rows[("2", "5", "0", "1", "DCGM_FI_DEV_FB_FREE")] == 9843.0
    assert rows[("2", "13", "0", "2", "DCGM_FI_DEV_FB_TOTAL")] == 4864.0
    # gpu 00000000:81:00.0 (index 3): instances 1, 5, 6
    assert {(g, i) for g, i, _, _, _ in rows} == {
        ("2", "1"),
        ("2", "5"),
        ("2", "13"),
        ("3", "1"),
        ("3", "5"),
        ("3", "6"),
    }
    assert rows[("3", "6", "0", "2", "DCGM_FI_DEV_FB_USED")] == 12.0
    parent = next(s for s in samples if s.labels["gpu"] == "2")
    assert parent.labels["UUID"] == "GPU-956348bc-d43d-23ed-53d4-857749fa2b67"
    assert parent.labels["pci_bus_id"] == "00000000:21:00.0" and "GPU_I_PROFILE" not in parent.labels


def test_mig_process_names_its_instance():
    events = [r for r in read_nvidia_smi_xml(MIG, hostname="n1") if isinstance(r, Event)]
    by_gpu = {e.attrs["gpu"]: e.attrs for e in events}
    assert by_gpu["2"]["gpu_instance_id"] == 5 and by_gpu["2"]["compute_instance_id"] == 0
    assert "gpu_instance_id" not in by_gpu["0"]  # whole GPU: N/A


def test_a_mig_device_without_its_instance_id_is_a_parse_error():
    text = MIG.read_text().replace("<gpu_instance_id>13</gpu_instance_id>", "", 1)
    with pytest.raises(ParseError, match="without gpu_instance_id"):
        list(parse_nvidia_smi_xml(text, path="q.xml"))
