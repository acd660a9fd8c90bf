"""AMD GPUs judged by the health rules: uncorrectable ECC drains (ecc_dbe), correctable ECC past a count warns
(ecc_correctable), XGMI link (WAFL) errors warn or drain (xgmi_errors), thermal violation residency warns
(amd_throttle).

Real inputs (tests/data/SOURCES.md): the amd-smi metric capture of an MI300X and the device-metrics-exporter
sample of an MI300X VF with the exporter's full label set. The faults are planted in memory on those real
documents (a block added to the amd-smi JSON; the exporter's sample line re-used under the ECC and violation
metric names of AMD's metric list)."""

from __future__ import annotations

import json

from hpcwatch import vocab
from hpcwatch.analysis.health import health_report
from hpcwatch.sources.amd_exporter import parse_amd_exporter_text
from hpcwatch.sources.amd_smi import parse_amd_smi_json, read_amd_smi_json
from hpcwatch.store import Store
from tests.conftest import DATA

AMD = DATA / "amd"
SMI = AMD / "amd_smi_metric_mi300x_26.0.2_lilbee.json"
DME = AMD / "dme_issue171_mi300x_vf_edge_temperature.prom"


def _health(samples, node):
    with Store(":memory:") as store:
        store.add(samples)
        table = store.samples()
    return health_report(table, []).node(node)


def _fired(node):
    return {(c.rule, c.verdict) for c in node.checks if c.verdict != "ok"}


def _amd_smi(ecc: dict[str, int], t: float, node: str = "mi300x-01"):
    doc = json.loads(SMI.read_text())
    doc["gpu_data"][0]["ecc"] = ecc
    return list(parse_amd_smi_json(json.dumps(doc), t=t, hostname=node))


def _exporter_line(metric: str, value: float) -> str:
    """The real exporter sample, its family renamed to ``metric`` and its value set."""
    line = DME.read_text().splitlines()[-1].replace("gpu_edge_temperature", metric)
    return f"{line.rsplit(' ', 1)[0]} {value:g}\n"


def test_the_real_mi300x_capture_is_healthy_and_its_ecc_rules_looked():
    samples = list(read_amd_smi_json(SMI, t=10.0, hostname="mi300x-01"))
    node = _health(
        samples + _amd_smi({"total_correctable_count": 0, "total_uncorrectable_count": 0}, 20.0), "mi300x-01"
    )
    assert node.verdict == "ok" and {"ecc_dbe", "ecc_correctable"} <= {c.rule for c in node.checks}


def test_an_uncorrectable_ecc_error_on_an_amd_gpu_drains():
    node = _health(_amd_smi({"total_correctable_count": 0, "total_uncorrectable_count": 2}, 10.0), "mi300x-01")
    assert ("ecc_dbe", "drain") in _fired(node)


def test_correctable_ecc_warns_only_past_the_count_in_the_window():
    few = _amd_smi({"total_correctable_count": 5, "total_uncorrectable_count": 0}, 10.0) + _amd_smi(
        {"total_correctable_count": 50, "total_uncorrectable_count": 0}, 70.0
    )
    assert _fired(_health(few, "mi300x-01")) == set()
    storm = few + _amd_smi({"total_correctable_count": 400, "total_uncorrectable_count": 0}, 130.0)
    (check,) = [c for c in _health(storm, "mi300x-01").checks if c.rule == "ecc_correctable"]
    assert check.verdict == "warn" and check.evidence["increase"] == 395.0 and check.evidence["gpu"] == "0"


def test_xgmi_link_errors_from_the_exporter_warn_when_corrected_and_drain_when_not():
    corrected = [
        *parse_amd_exporter_text(_exporter_line(vocab.GPU_ECC_CORRECT_XGMI_WAFL, 3), t=10.0),
        *parse_amd_exporter_text(_exporter_line(vocab.GPU_ECC_CORRECT_XGMI_WAFL, 9), t=70.0),
    ]
    assert corrected[0].labels["hostname"] == "master-1" and corrected[0].metric == vocab.GPU_ECC_CORRECT_XGMI_WAFL
    assert _fired(_health(corrected, "master-1")) == {("xgmi_errors", "warn")}
    lost = corrected + list(parse_amd_exporter_text(_exporter_line(vocab.GPU_ECC_UNCORRECT_XGMI_WAFL, 1), t=70.0))
    assert ("xgmi_errors", "drain") in _fired(_health(lost, "master-1"))


def test_thermal_violation_residency_warns_power_tracking_does_not():
    line = _exporter_line(vocab.GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE, 35)
    hot = [s for t in (10.0, 70.0) for s in parse_amd_exporter_text(line, t=t)]
    (check,) = [c for c in _health(hot, "master-1").checks if c.rule == "amd_throttle"]
    assert check.verdict == "warn" and check.evidence == {"gpu": "0", "reasons": {"hbm_thermal": 0.35}}
    ppt = list(parse_amd_exporter_text(_exporter_line("gpu_violation_ppt_residency_percentage", 90), t=10.0))
    cool = list(parse_amd_exporter_text(_exporter_line(vocab.GPU_VIOLATION_VR_THERMAL_RESIDENCY_PERCENTAGE, 2), t=10.0))
    node = _health(ppt + cool, "master-1")
    assert _fired(node) == set() and "amd_throttle" in {c.rule for c in node.checks}
