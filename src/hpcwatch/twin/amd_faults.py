"""Faults of AMD GPUs on the AMD twin (``--model mi300x``), in AMD device-metrics-exporter's own text.

The twin's AMD scrape carries the readings it simulates (activity, power, VRAM, energy, temperature); these
scenarios add, to every scrape of every AMD node, the exporter families their fault moves
(``Scenario.gpu_exporter_lines``): zeros on the healthy GPUs, so the rules look everywhere and fire on one.

=========================  ======================================================  ===============================
scenario                   what the exporter shows (node2 GPU 5 / node1 GPU 2)     rules that fire
=========================  ======================================================  ===============================
``amd_xgmi_errors``        node2 GPU 5's XGMI link: ``gpu_ecc_correct_xgmi_wafl``  ``xgmi_errors`` drain,
                           climbs 25 a scrape, one ``gpu_ecc_uncorrect_xgmi_wafl``  ``ecc_dbe`` drain
                           from ONSET_S (the ``_total`` families count them too)
``amd_thermal_throttle``   node1 GPU 2 held by its HBM thermal limit:              ``amd_throttle`` warn
                           ``gpu_violation_hbm_thermal_residency_percentage`` 60
=========================  ======================================================  ===============================

Names and help texts are the exporter's, verbatim from ROCm/device-metrics-exporter
pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go (commit afd0fe81); every family is a gauge there. The label set is the
twin's AMD one (twin/core.py), with the Slurm ``job_id``. The ``_total`` families sum every block's errors; only
the WAFL block errs here, so they equal it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["AmdXgmiErrors", "AmdThermalThrottle", "ECC_HELP", "VIOLATION_HELP", "require_amd"]

#: The ECC families the XGMI scenario writes, with the exporter's help text.
ECC_HELP: dict[str, str] = {
    vocab.GPU_ECC_CORRECT_TOTAL: "Total Correctable error count",
    vocab.GPU_ECC_CORRECT_XGMI_WAFL: "Correctable error count in WAFL block",
    vocab.GPU_ECC_UNCORRECT_TOTAL: "Total Uncorrectable error count",
    vocab.GPU_ECC_UNCORRECT_XGMI_WAFL: "Uncorrectable error count in WAFL block",
}
#: The thermal violation residencies (%) the throttle scenario writes, with the exporter's help text.
VIOLATION_HELP: dict[str, str] = {
    vocab.GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE: "HBM percentage violation counter",
    vocab.GPU_VIOLATION_PROCESSOR_HOT_RESIDENCY_PERCENTAGE: "process hot residency percentage violation counter",
    vocab.GPU_VIOLATION_SOCKET_THERMAL_RESIDENCY_PERCENTAGE: "socket thermal percentage violation counter",
    vocab.GPU_VIOLATION_VR_THERMAL_RESIDENCY_PERCENTAGE: "voltage rail percentage violation counter",
}


def require_amd(twin: Any, scenario: str, node: str) -> None:
    """``ConfigError`` unless ``node`` is a node of AMD GPUs in the twin: an AMD scenario on an NVIDIA cluster
    would plant nothing, silently."""
    if node not in twin.node_names or not twin.node_is_amd(node):
        raise ConfigError(f"scenario {scenario}: plants a fault on {node}'s AMD GPUs; run it with --model mi300x")


class _AmdReadings(Scenario):
    """Writes ``HELP`` families for every GPU of an AMD node; ``readings`` says the sick GPU's values."""

    HELP: ClassVar[Mapping[str, str]] = {}
    node = ""
    gpu = 0

    def readings(self, elapsed_s: float) -> dict[str, float]:
        """The sick GPU's values ``elapsed_s`` after the run started (the others read 0)."""
        raise NotImplementedError

    def bind(self, twin: Any) -> None:
        require_amd(twin, self.name, self.node)

    def gpu_exporter_lines(self, *, twin: Any, node: str, stamp: str) -> str:
        if not twin.node_is_amd(node):
            return ""
        flat = twin.gpus_of_node(node)
        sick = self.readings(twin.now - twin.t0) if node == self.node else {}
        out = []
        for metric, help_text in self.HELP.items():
            out.append(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
            for index, g in enumerate(flat):
                value = sick.get(metric, 0.0) if index == self.gpu else 0.0
                out.append(f"{metric}{{{twin.dcgm_label_text(g)}}} {value:g}{stamp}\n")
        return "".join(out)


@register
class AmdXgmiErrors(_AmdReadings):
    """An XGMI link of node2's GPU 5 wears: its physical layer (the WAFL block) corrects errors from the start,
    then one it cannot correct. The exporter counts both in the block's gauges and in the GPU's totals."""

    name = "amd_xgmi_errors"
    description = "node2 GPU 5's XGMI link (AMD WAFL block) corrects errors, then an uncorrectable one (AMD twin)"
    node, gpu = "node2", 5
    HELP = ECC_HELP
    CORRECTED_PER_S = 2.5
    ONSET_S = 10.0
    """The uncorrectable error comes at the first scrape this long after the start (the first scrape, at the
    start, is clean: the window holds a healthy reading first)."""

    def readings(self, elapsed_s: float) -> dict[str, float]:
        corrected = float(round(max(elapsed_s, 0.0) * self.CORRECTED_PER_S))
        uncorrected = 1.0 if elapsed_s >= self.ONSET_S else 0.0
        return {
            vocab.GPU_ECC_CORRECT_TOTAL: corrected,
            vocab.GPU_ECC_CORRECT_XGMI_WAFL: corrected,
            vocab.GPU_ECC_UNCORRECT_TOTAL: uncorrected,
            vocab.GPU_ECC_UNCORRECT_XGMI_WAFL: uncorrected,
        }


@register
class AmdThermalThrottle(_AmdReadings):
    """node1's GPU 2 runs hot at its HBM: the firmware holds its clocks down 60 % of the time (its cooling plate
    lost contact, say), past the 20 % share amd_throttle warns at."""

    name = "amd_thermal_throttle"
    description = "node1 GPU 2 is held down by its HBM thermal limit 60 % of the time (AMD twin)"
    node, gpu = "node1", 2
    HELP = VIOLATION_HELP
    RESIDENCY_PCT = 60.0

    def readings(self, elapsed_s: float) -> dict[str, float]:
        return {vocab.GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE: self.RESIDENCY_PCT}
