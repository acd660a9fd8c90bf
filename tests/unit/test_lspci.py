"""``lspci -vv`` read and judged: a GPU or HCA trained on fewer lanes than it can, an HCA slower than it can.

Real captures (tests/data/SOURCES.md): Stelline's ASUS ESC8000A-E12 (4 RTX 6000 Ada idle at 2.5 of 16 GT/s,
2 ConnectX-7 at Gen5 x16, 2 HighPoint RAID cards at x1 of x2) and Neuropoly's ``lspci -vvd 10DE:`` of 4 RTX
A6000 (idle at 2.5 GT/s, x16). The degraded HCA is the real ConnectX-7 block with its LnkSta edited in memory.

An NVIDIA GPU narrow in lspci drains only when it was busy as lspci read it: an idle GPU may train its link down
(the real idle L4 of tests/data/nvidia_smi reads x8 of x16, at 0 %). Its utilisation comes from the real idle L4
``nvidia-smi -q`` (bus 00000000:01:00.0) and the real dcgm-exporter line of dcgm-exporter issue #568 (an RTX A4000
at 38 %, bus 00000000:41:00.0), both on the bus of a Neuropoly GPU; the busy one is that line with its value
raised in memory."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import health_report
from hpcwatch.errors import ParseError
from hpcwatch.sources.lspci import parse_lspci_vv, read_lspci_vv
from hpcwatch.sources.nvidia_smi import parse_nvidia_smi_q, read_nvidia_smi_q
from hpcwatch.sources.prometheus_text import parse_prometheus_text
from hpcwatch.store import Store
from tests.conftest import DATA

STELLINE = DATA / "lspci" / "lspci_vvv_rtx6000ada_connectx7_stelline.txt"
NEUROPOLY = DATA / "lspci" / "lspci_vvd_10de_4x_rtx_a6000_neuropoly.txt"
CX7_STA = "                LnkSta: Speed 32GT/s, Width x16\n"
A6000_X16 = "LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)"
A6000_X8 = "LnkSta: Speed 2.5GT/s (downgraded), Width x8 (downgraded)"
L4_IDLE = DATA / "nvidia_smi" / "nvidia_smi_q_l4_idle_gen1_x8_thamada.txt"
L4_AT = 1731404911.0  # the L4 report's Timestamp, Tue Nov 12 09:48:31 2024 (UTC)
A4000_UTIL = DATA / "prometheus" / "dcgm_exporter_rtx_a4000_580_gpu_util_issue568.prom"
L4_UTIL = "        Gpu                               : 0 %"


def _node(samples, node="gpu07"):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table).node(node)


def _fired(node_health) -> list[tuple[str, str, str | None]]:
    """(rule, verdict, lspci's bdf or None for the GPU's own report) of each check that fired."""
    return sorted((c.rule, c.verdict, c.evidence.get("bdf")) for c in node_health.checks if c.verdict != "ok")


def _links(samples) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        out.setdefault(s.labels["bdf"], {})[s.metric] = s.value
    return out


def test_each_device_gives_its_trained_and_capable_link():
    samples = list(read_lspci_vv(STELLINE, node="gpu07"))
    links = _links(samples)
    assert links["01:00.0"] == {
        vocab.PCIE_LINK_SPEED_GTS: 2.5,
        vocab.PCIE_LINK_SPEED_MAX_GTS: 16.0,
        vocab.PCIE_LINK_WIDTH: 16.0,
        vocab.PCIE_LINK_WIDTH_MAX: 16.0,
    }
    assert links["21:00.0"][vocab.PCIE_LINK_SPEED_GTS] == 32.0 and links["71:00.0"][vocab.PCIE_LINK_WIDTH] == 1.0
    cx7 = next(s for s in samples if s.labels["bdf"] == "21:00.0")
    assert cx7.labels["vendor"] == "15b3" and cx7.labels["device_class"] == "Ethernet controller"
    assert cx7.labels["node"] == "gpu07" and cx7.labels["name"].startswith("Mellanox Technologies MT2910")


def test_real_idle_gpus_at_2_5_gts_and_a_raid_card_at_x1_are_not_faults():
    """Idle GPUs drop their link speed by design; the HighPoint card at x1 of x2 is neither a GPU nor an HCA."""
    for path in (STELLINE, NEUROPOLY):
        node = _node(read_lspci_vv(path, node="gpu07"))
        assert node.verdict == "ok", _fired(node)
        assert {c.rule for c in node.checks} >= {"pcie_width", "pcie_speed"}  # looked, found well


def test_an_hca_at_x8_of_x16_drains_and_at_gen4_of_gen5_warns():
    text = STELLINE.read_text()
    assert text.count(CX7_STA) == 2
    narrow = text.replace(CX7_STA, "                LnkSta: Speed 32GT/s, Width x8 (downgraded)\n", 1)
    node = _node(parse_lspci_vv(narrow, node="gpu07"))
    assert _fired(node) == [("pcie_width", "drain", "21:00.0")]
    check = next(c for c in node.checks if c.rule == "pcie_width")
    assert check.evidence["width"] == 8 and check.evidence["width_max"] == 16 and check.evidence["part"] == "hca"
    slow = text.replace(CX7_STA, "                LnkSta: Speed 16GT/s (downgraded), Width x16\n", 1)
    assert _fired(_node(parse_lspci_vv(slow, node="gpu07"))) == [("pcie_speed", "warn", "21:00.0")]


def _neuropoly_narrow(nth: int, *, t: float) -> list:
    """Neuropoly's lspci with its ``nth`` GPU (0: 01:00.0, 1: 41:00.0) at x8 of x16, read at ``t``."""
    parts = NEUROPOLY.read_text().split(A6000_X16)
    assert len(parts) == 9  # four GPUs at x16, each followed by its audio function (function 1, same link)
    text = A6000_X16.join(parts[: 2 * nth + 1]) + A6000_X8 + A6000_X16.join(parts[2 * nth + 1 :])
    return list(parse_lspci_vv(text, node="gpu07", t=t))


def _a4000_at(util: str, *, t: float) -> list:
    """The real dcgm-exporter line of bus 00000000:41:00.0, named for gpu07, at ``util`` %, scraped at ``t``."""
    text = A4000_UTIL.read_text().replace('Hostname="xxxxx"', 'Hostname="gpu07"')
    assert text.count("} 38\n") == 1
    return list(parse_prometheus_text(text.replace("} 38\n", f"}} {util}\n"), path=str(A4000_UTIL), t=t))


def test_an_idle_gpu_narrow_in_lspci_warns_saying_it_may_be_power_managed():
    """The real idle L4 (0 %, bus 00000000:01:00.0) beside lspci's 01:00.0 at x8 read 5 s later: a warning."""
    smi = list(read_nvidia_smi_q(L4_IDLE, hostname="gpu07"))
    node = _node([*_neuropoly_narrow(0, t=L4_AT + 5), *smi])
    assert _fired(node) == [("pcie_width", "warn", "01:00.0")]
    (check,) = [c for c in node.checks if c.rule == "pcie_width"]
    assert check.evidence["gpu_util_pct"] == 0 and "power-managed" in check.title
    assert check.evidence["width"] == 8 and "50 %" in check.evidence["why"]
    # the same GPU busy (its report edited to 97 %): it reads x8 of x16 under load too, so the link is narrow
    busy = L4_IDLE.read_text().replace(L4_UTIL, "        Gpu                               : 97 %")
    node = _node([*_neuropoly_narrow(0, t=L4_AT + 5), *parse_nvidia_smi_q(busy, hostname="gpu07")])
    assert _fired(node) == [("pcie_gen", "warn", None), ("pcie_width", "drain", "01:00.0")]
    (check,) = [c for c in node.checks if c.rule == "pcie_width"]
    assert check.evidence["reported_by_gpu"]["gpu_util_pct"] == 97 and "at 97 % utilisation" in check.title


def test_a_narrow_gpu_with_no_utilisation_beside_the_reading_warns():
    node = _node(_neuropoly_narrow(0, t=L4_AT + 5))
    assert _fired(node) == [("pcie_width", "warn", "01:00.0")]
    (check,) = [c for c in node.checks if c.rule == "pcie_width"]
    assert check.evidence["gpu_util_pct"] is None and "no utilisation" in check.title
    # a utilisation older than missing_after_s (60 s) before the reading says nothing of the link then
    stale = _node([*_neuropoly_narrow(0, t=L4_AT + 61), *read_nvidia_smi_q(L4_IDLE, hostname="gpu07")])
    assert next(c for c in stale.checks if c.rule == "pcie_width").evidence["gpu_util_pct"] is None


def test_a_narrow_gpu_busy_as_lspci_read_it_drains():
    """41:00.0 at x8: the real dcgm-exporter line of that bus reads 38 % (not busy: warn); at 97 % it drains."""
    at_38 = _node([*_neuropoly_narrow(1, t=1000.0), *_a4000_at("38", t=990.0)])
    assert _fired(at_38) == [("pcie_width", "warn", "41:00.0")]
    assert "at 38 % utilisation, not busy" in at_38.reason()
    busy = _node([*_neuropoly_narrow(1, t=1000.0), *_a4000_at("97", t=990.0)])
    assert _fired(busy) == [("pcie_width", "drain", "41:00.0")]
    (check,) = [c for c in busy.checks if c.rule == "pcie_width"]
    assert check.evidence["gpu_util_pct"] == 97 and "at 97 % utilisation" in check.title
    # the same busy sample on another GPU's bus corroborates nothing here
    assert _fired(_node([*_neuropoly_narrow(0, t=1000.0), *_a4000_at("97", t=990.0)])) == [
        ("pcie_width", "warn", "01:00.0")
    ]


def test_a_link_that_is_down_reads_width_zero_and_no_speed():
    text = "01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
    text += "\tSubsystem: NVIDIA Corporation Device [10de:16c1]\n"
    text += "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
    text += "\t\tLnkSta:\tSpeed unknown (downgraded), Width x0 (downgraded)\n"
    links = _links(parse_lspci_vv(text, node="gpu07"))
    assert links == {
        "01:00.0": {vocab.PCIE_LINK_SPEED_MAX_GTS: 32.0, vocab.PCIE_LINK_WIDTH: 0.0, vocab.PCIE_LINK_WIDTH_MAX: 16.0}
    }
    sample = next(iter(parse_lspci_vv(text, node="gpu07")))
    assert sample.labels["vendor"] == "10de" and sample.labels["name"].endswith("(rev a1)")
    node = _node(parse_lspci_vv(text, node="gpu07"))
    assert _fired(node) == [("pcie_width", "drain", "01:00.0")] and "(down)" in node.reason()


def test_bad_line_is_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "lspci.txt"
    lines = STELLINE.read_text().split("\n")
    lines.insert(5, "this is not lspci")
    path.write_text("\n".join(lines))
    with pytest.raises(ParseError) as err:
        list(read_lspci_vv(path))
    assert str(err.value).startswith(f"{path}:6: not an lspci -vv line")
    bad: list[ParseError] = []
    kept = list(read_lspci_vv(path, on_bad_line=bad.append))
    assert len(bad) == 1 and len(_links(kept)) == 7  # the device whose block broke is lost, the others kept
