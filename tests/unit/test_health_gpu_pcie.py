"""The GPU's own PCIe link report (``nvidia-smi -q -x``'s GPU Link Info, replay counter) read and judged.

Real captures (tests/data/SOURCES.md): a Tesla V100-PCIE at 91 % utilisation on Gen 3 x16 of Gen 3 x16, and a
GTX 1660 Ti idle in P8 at Gen 1 of 3 (the power-saving drop nvidia-smi(1) warns of), both from GuanceCloud/datakit's
test data. The degraded links are the busy V100's XML with ``current_link_width`` / ``current_link_gen`` edited in
memory; the lspci capture is Neuropoly's 4 x RTX A6000 (tests/unit/test_lspci.py). As text (``nvidia-smi -q``):
an idle L4 at Gen 1 of 4 and x8 of x16, and 8 x H100 SXM with PCIe replays on three GPUs (thamada/nvidia-smi)."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.lspci import parse_lspci_vv
from hpcwatch.sources.nvidia_smi import (
    parse_nvidia_smi_q,
    parse_nvidia_smi_xml,
    read_nvidia_smi_q,
    read_nvidia_smi_xml,
)
from hpcwatch.store import Store
from tests.conftest import DATA

V100_BUSY = DATA / "nvidia_smi" / "nvidia_smi_q_v100_busy_gen3_x16_datakit.xml"
GTX_IDLE = DATA / "nvidia_smi" / "nvidia_smi_q_gtx1660ti_idle_gen1_datakit.xml"
NEUROPOLY = DATA / "lspci" / "lspci_vvd_10de_4x_rtx_a6000_neuropoly.txt"
X16 = "<current_link_width>16x</current_link_width>"
GEN3 = "<current_link_gen>3</current_link_gen>"


def _node(samples, node="gpu07", config=HealthConfig()):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, config=config).node(node)


def _fired(node_health) -> list[tuple[str, str]]:
    return sorted((c.rule, c.verdict) for c in node_health.checks if c.verdict != "ok")


def _v100(text: str | None = None):
    return parse_nvidia_smi_xml(text or V100_BUSY.read_text(), path=str(V100_BUSY), hostname="gpu07")


def test_the_link_info_and_replay_counter_become_dcgm_named_samples():
    got = {s.metric: s.value for s in read_nvidia_smi_xml(GTX_IDLE, hostname="gpu07") if "PCIE" in s.metric}
    assert got == {
        vocab.DCGM_FI_DEV_PCIE_LINK_GEN: 1.0,
        vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN: 3.0,
        vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH: 16.0,
        vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH: 16.0,
        vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: 0.0,
    }


def test_real_busy_gpu_at_its_max_link_and_real_idle_gpu_at_gen1_are_well():
    """The idle GTX sits at Gen 1 of 3 by design; the busy V100 trained to all it can."""
    for path in (V100_BUSY, GTX_IDLE):
        node = _node(read_nvidia_smi_xml(path, hostname="gpu07"))
        assert node.verdict == "ok", _fired(node)
        assert {c.rule for c in node.checks} >= {"pcie_width", "pcie_gen", "pcie_replay"}  # looked, found well


def test_a_busy_gpu_at_x8_of_x16_drains_naming_its_bus_id():
    text = V100_BUSY.read_text()
    assert text.count(X16) == 1
    node = _node(_v100(text.replace(X16, "<current_link_width>8x</current_link_width>")))
    assert _fired(node) == [("pcie_width", "drain")]
    (check,) = [c for c in node.checks if c.rule == "pcie_width"]
    assert check.evidence["width"] == 8 and check.evidence["width_max"] == 16
    assert check.evidence["pci_bus_id"] == "00000000:21:01.0" and check.evidence["gpu_util_pct"] == 91
    assert "x8 of x16 at 91 %" in check.title


def test_a_busy_gpu_at_gen1_of_gen3_warns():
    text = V100_BUSY.read_text().replace(GEN3, "<current_link_gen>1</current_link_gen>")
    assert _fired(_node(_v100(text))) == [("pcie_gen", "warn")]


def test_a_degraded_link_below_the_busy_threshold_is_not_judged():
    """At 91 % the V100 counts as busy; with the threshold raised past it, its readings are not judged."""
    text = V100_BUSY.read_text().replace(X16, "<current_link_width>8x</current_link_width>")
    assert _fired(_node(_v100(text), config=HealthConfig(pcie_busy_util_pct=95.0))) == []


def test_a_busy_threshold_outside_0_to_100_names_the_field():
    with pytest.raises(ConfigError, match="pcie_busy_util_pct must be in"):
        HealthConfig(pcie_busy_util_pct=150.0)


def test_a_gpu_narrow_in_both_lspci_and_nvidia_smi_is_one_check():
    """lspci's GPU 01:00.0 at x8 and the GPU's own report of bus 00000000:01:00.0 at x8: one link, one check."""
    lspci = NEUROPOLY.read_text().replace(
        "LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)", "LnkSta: Speed 2.5GT/s (downgraded), Width x8", 1
    )
    smi = V100_BUSY.read_text().replace("00000000:21:01.0", "00000000:01:00.0")
    smi = smi.replace(X16, "<current_link_width>8x</current_link_width>")
    node = _node([*parse_lspci_vv(lspci, node="gpu07", t=1663250002.0), *_v100(smi)])
    (check,) = [c for c in node.checks if c.rule == "pcie_width" and c.verdict != "ok"]
    assert check.evidence["bdf"] == "01:00.0" and check.evidence["reported_by_gpu"]["width"] == 8


def test_a_gpu_on_another_bus_than_lspci_names_is_its_own_check():
    lspci = NEUROPOLY.read_text().replace(
        "LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)", "LnkSta: Speed 2.5GT/s (downgraded), Width x8", 1
    )
    smi = V100_BUSY.read_text().replace(X16, "<current_link_width>8x</current_link_width>")
    node = _node([*parse_lspci_vv(lspci, node="gpu07", t=1663250002.0), *_v100(smi)])
    narrow = {
        c.evidence.get("bdf") or c.evidence["pci_bus_id"]: c.verdict for c in node.checks if c.rule == "pcie_width"
    }
    # the busy V100 on bus 21:01.0 drains; it says nothing of 01:00.0's utilisation, so lspci's narrow GPU warns
    assert narrow == {"00000000:21:01.0": "drain", "01:00.0": "warn"}


def test_replays_rising_in_the_window_warn_with_the_dcgm_rate():
    first = list(_v100())
    later = V100_BUSY.read_text().replace("Thu Sep 15 13:53:22 2022", "Thu Sep 15 13:54:22 2022")
    later = later.replace("<replay_counter>0</replay_counter>", "<replay_counter>12</replay_counter>")
    node = _node([*first, *_v100(later)])
    (check,) = [c for c in node.checks if c.rule == "pcie_replay"]
    assert check.verdict == "warn" and check.evidence["increase"] == 12
    assert check.evidence["per_min"] == 12 and check.evidence["over_dcgm_limit"] is True


def test_a_link_width_that_is_not_a_number_is_one_line_naming_file_and_line():
    text = V100_BUSY.read_text().replace(X16, "<current_link_width>wide</current_link_width>")
    with pytest.raises(ParseError) as err:
        list(_v100(text))
    message = str(err.value)
    assert "\n" not in message and str(V100_BUSY) in message
    wide = next(i for i, line in enumerate(text.splitlines(), 1) if "<current_link_width>wide" in line)
    assert err.value.line == wide


# -- nvidia-smi -q as text ------------------------------------------------------------------------------------

L4_IDLE = DATA / "nvidia_smi" / "nvidia_smi_q_l4_idle_gen1_x8_thamada.txt"
H100_X8 = DATA / "nvidia_smi" / "nvidia_smi_q_h100sxm_x8_replays_thamada.txt"
L4_UTIL = "        Gpu                               : 0 %"


def test_the_text_report_gives_the_same_link_samples_and_versions_as_the_xml():
    samples = list(read_nvidia_smi_q(L4_IDLE, hostname="l4"))
    got = {s.metric: s.value for s in samples}
    assert got[vocab.DCGM_FI_DEV_PCIE_LINK_GEN] == 1 and got[vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN] == 4
    assert got[vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH] == 8 and got[vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH] == 16
    assert got[vocab.DCGM_FI_DEV_GPU_UTIL] == 0 and got[vocab.DCGM_FI_DEV_POWER_USAGE] == 16.47
    assert samples[0].labels == {
        "gpu": "0",
        "Hostname": "l4",
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        "cuda_version": "12.4",
        "pci_bus_id": "00000000:01:00.0",
        "UUID": "GPU-453f8851-d1a3-e72d-4d85-3ef04418205b",
        "modelName": "NVIDIA L4",
        "DCGM_FI_DEV_VBIOS_VERSION": "95.04.29.00.06",
    }


def test_the_real_idle_l4_at_x8_and_gen1_is_not_judged_but_busy_it_would_drain():
    """The L4 idles at Gen 1 of 4 and x8 of x16: NVIDIA's power saving, width included. Made busy in memory,
    the same readings are a degraded link."""
    assert _fired(_node(read_nvidia_smi_q(L4_IDLE, hostname="gpu07"))) == []
    text = L4_IDLE.read_text()
    assert text.count(L4_UTIL) == 1
    busy = text.replace(L4_UTIL, "        Gpu                               : 97 %")
    assert _fired(_node(parse_nvidia_smi_q(busy, hostname="gpu07"))) == [("pcie_gen", "warn"), ("pcie_width", "drain")]


def test_the_h100_replay_counters_are_read_per_gpu():
    samples = list(read_nvidia_smi_q(H100_X8, hostname="h100"))
    replays = {s.labels["gpu"]: s.value for s in samples if s.metric == vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER}
    assert replays == {"0": 7, "1": 0, "2": 0, "3": 0, "4": 0, "5": 4, "6": 15, "7": 0}


def test_text_that_is_not_nvidia_smi_q_is_one_line_naming_file_and_line():
    with pytest.raises(ParseError) as err:
        list(parse_nvidia_smi_q("Driver Version : 550\n", path="smi.txt"))
    assert str(err.value).startswith("smi.txt:1: not nvidia-smi -q output") and "\n" not in str(err.value)
