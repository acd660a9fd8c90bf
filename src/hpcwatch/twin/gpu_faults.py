"""Faults of NVIDIA GPUs that dcgm-exporter shows in fields the twin does not simulate: remapped rows, PCIe
replays, correctable ECC errors, clock event reasons.

Each scenario adds its families to every scrape of every NVIDIA node (``Scenario.gpu_exporter_lines``): zeros on
the healthy GPUs, so the rules look everywhere and fire on one.

=======================  ==================================================================  =====================
scenario                 what dcgm-exporter shows                                            rule that fires
=======================  ==================================================================  =====================
``row_remap_failed``     node2 GPU 6: ``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`` 7, then 8  ``row_remap`` drain
                         and ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` 1 from ONSET_S (its HBM bank
                         has no spare row left)
``pcie_replays``         node1 GPU 4: ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` climbs 1 a second  ``pcie_replay`` warn
``ecc_sbe_storm``        node2 GPU 1: ``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`` climbs 10 a second   ``ecc_correctable`` warn
``thermal_throttle``     node1 GPU 7: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` 0x60 (sw and hw    ``throttle`` warn
                         thermal slowdown) in every scrape
=======================  ==================================================================  =====================

Types and help texts are dcgm-exporter's (etc/default-counters.csv, commit d5e5f51: the remapped rows and PCIe
replay lines, the ECC lines a site uncomments); ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` is in none of its shipped
lists, a site adds it with a help text of its own (the twin's is one such). The label set is the twin's
dcgm-exporter one (twin/core.py), with ``hpc_job``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["RowRemapFailed", "PcieReplays", "EccSbeStorm", "ThermalThrottle", "require_nvidia"]

#: (type, help) of each family these scenarios write, as dcgm-exporter's counter lists give them.
_FAMILIES: dict[str, tuple[str, str]] = {
    vocab.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: ("counter", "Number of remapped rows for uncorrectable errors"),
    vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE: ("gauge", "Whether remapping of rows has failed"),
    vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: ("counter", "Total number of PCIe retries."),
    vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: ("counter", "Total number of single-bit volatile ECC errors."),
    vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: ("counter", "Total number of double-bit volatile ECC errors."),
    vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS: ("gauge", "Current clock throttle reasons."),
}


def require_nvidia(twin: Any, scenario: str, node: str) -> None:
    """``ConfigError`` unless ``node`` is a node of NVIDIA GPUs in the twin (on AMD GPUs the scenario would plant
    nothing, silently)."""
    if node not in twin.node_names or twin.node_is_amd(node):
        raise ConfigError(f"scenario {scenario}: plants a fault on {node}'s NVIDIA GPUs; run it with an NVIDIA model")


class _DcgmReadings(Scenario):
    """Writes ``FIELDS`` for every GPU of an NVIDIA node; ``readings`` says the sick GPU's values."""

    FIELDS: ClassVar[tuple[str, ...]] = ()
    node = ""
    gpu = 0

    def readings(self, elapsed_s: float) -> Mapping[str, float]:
        """The sick GPU's values ``elapsed_s`` after the run started (the others read 0)."""
        raise NotImplementedError

    def bind(self, twin: Any) -> None:
        require_nvidia(twin, self.name, self.node)

    def gpu_exporter_lines(self, *, twin: Any, node: str, stamp: str) -> str:
        if twin.node_is_amd(node):
            return ""
        sick = self.readings(twin.now - twin.t0) if node == self.node else {}
        flat = twin.gpus_of_node(node)
        out = []
        for metric in self.FIELDS:
            kind, help_text = _FAMILIES[metric]
            out.append(f"# HELP {metric} {help_text}\n# TYPE {metric} {kind}\n")
            for index, g in enumerate(flat):
                value = sick.get(metric, 0.0) if index == self.gpu else 0.0
                out.append(f"{metric}{{{twin.dcgm_label_text(g)}}} {value:g}{stamp}\n")
        return "".join(out)


@register
class RowRemapFailed(_DcgmReadings):
    """node2's GPU 6 has remapped rows for earlier uncorrectable errors; one more comes, and its HBM bank has no
    spare row left: remapping fails (the GPU must be replaced; NVIDIA's A100/H100 memory error management)."""

    name = "row_remap_failed"
    description = "node2 GPU 6 remaps one more row after an uncorrectable error, and remapping fails (dcgm-exporter)"
    node, gpu = "node2", 6
    FIELDS = (vocab.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE)
    EARLIER_ROWS = 7
    """Rows the GPU had remapped before the run (the first scrape shows them: the window's growth is the new one)."""
    ONSET_S = 10.0

    def readings(self, elapsed_s: float) -> Mapping[str, float]:
        failed = elapsed_s >= self.ONSET_S
        return {
            vocab.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: float(self.EARLIER_ROWS + failed),
            vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE: float(failed),
        }


@register
class PcieReplays(_DcgmReadings):
    """node1's GPU 4 retransmits on its PCIe link (signal integrity: a riser, a slot): its replay counter climbs
    a replay a second, past DCGM's 8 a minute."""

    name = "pcie_replays"
    description = "node1 GPU 4's PCIe link replays a packet every second (dcgm-exporter's replay counter)"
    node, gpu = "node1", 4
    FIELDS = (vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,)
    REPLAYS_PER_S = 1.0

    def readings(self, elapsed_s: float) -> Mapping[str, float]:
        return {vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: float(round(max(elapsed_s, 0.0) * self.REPLAYS_PER_S))}


@register
class EccSbeStorm(_DcgmReadings):
    """node2's GPU 1 corrects single-bit errors in its HBM, 10 a second: each was fixed, but a storm foretells
    uncorrectable ones (no double-bit error yet)."""

    name = "ecc_sbe_storm"
    description = "node2 GPU 1 corrects 10 single-bit ECC errors a second (dcgm-exporter's volatile ECC counters)"
    node, gpu = "node2", 1
    FIELDS = (vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)
    CORRECTED_PER_S = 10.0

    def readings(self, elapsed_s: float) -> Mapping[str, float]:
        return {vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: float(round(max(elapsed_s, 0.0) * self.CORRECTED_PER_S))}


@register
class ThermalThrottle(_DcgmReadings):
    """node1's GPU 7 runs too hot (its cold plate lost contact): the driver holds its clocks down for thermal
    reasons in every scrape, sw_thermal_slowdown (0x20) and hw_thermal_slowdown (0x40) set."""

    name = "thermal_throttle"
    description = "node1 GPU 7 is held down by thermal slowdown in every scrape (dcgm-exporter's clock event reasons)"
    node, gpu = "node1", 7
    FIELDS = (vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS,)
    REASONS = 0x20 | 0x40

    def readings(self, elapsed_s: float) -> Mapping[str, float]:
        return {vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS: float(self.REASONS)}
