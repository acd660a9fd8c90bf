"""What the AMD readers share: the AMD reading -> DCGM field table, units, labels.

hpcwatch has one GPU vocabulary, the DCGM field names dcgm-exporter exports (``vocab.DCGM_*``): the job
attribution, the jobs report, idle detection, the health rules and MFU read those names and nothing else.
The NVIDIA readers that are not dcgm-exporter (``nvidia_smi``) already rename to them; the AMD readers
(``amd_exporter``: device-metrics-exporter text, ``amd_smi``: ``amd-smi metric/static --json``, ``rocm_smi``:
``rocm-smi --json``) do the same where the reading means the same thing, in the same unit:

    reading (exporter / amd-smi / rocm-smi)                        -> DCGM field                       unit
    gpu_gfx_activity / usage.gfx_activity / "GPU use (%)"          -> DCGM_FI_DEV_GPU_UTIL             %
    gpu_umc_activity / usage.umc_activity / "GPU Memory Read/Write
        Activity (%)", "GPU memory use (%)"                        -> DCGM_FI_DEV_MEM_COPY_UTIL        %
    gpu_power_usage / power.socket_power / "Current Socket Graphics
        Package Power (W)", "Average Graphics Package Power (W)"   -> DCGM_FI_DEV_POWER_USAGE          W
    gpu_junction_temperature / temperature.hotspot /
        "Temperature (Sensor junction) (C)"                        -> DCGM_FI_DEV_GPU_TEMP             C
    gpu_memory_temperature / temperature.mem / "(Sensor memory)"   -> DCGM_FI_DEV_MEMORY_TEMP          C
    gpu_used_vram / mem_usage.used_vram / "VRAM Total Used Memory" -> DCGM_FI_DEV_FB_USED              MiB
    gpu_free_vram / mem_usage.free_vram                            -> DCGM_FI_DEV_FB_FREE              MiB
    gpu_total_vram / mem_usage.total_vram, vram.size /
        "VRAM Total Memory (B)"                                    -> DCGM_FI_DEV_FB_TOTAL             MiB
    gpu_energy_consumed (uJ) / energy.total_energy_consumption (J)
        / "Accumulated Energy (uJ)"                                -> DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION  mJ
    gpu_clock{clock_type="system"} / clock.gfx_0.clk / sclk        -> DCGM_FI_DEV_SM_CLOCK             MHz
    gpu_clock{clock_type="memory"} / clock.mem_0.clk / mclk        -> DCGM_FI_DEV_MEM_CLOCK            MHz
    gpu_ecc_uncorrect_total / ecc.total_uncorrectable_count        -> DCGM_FI_DEV_ECC_DBE_VOL_TOTAL    count
    gpu_ecc_correct_total / ecc.total_correctable_count            -> DCGM_FI_DEV_ECC_SBE_VOL_TOTAL    count
    pcie_replay_count / pcie.replay_count / "PCIe Replay Count"    -> DCGM_FI_DEV_PCIE_REPLAY_COUNTER  count

amd-smi's and the exporter's "MB" is MiB (an MI300X reports 196,592 MB of VRAM for its 192 GiB; rocm-smi
205,822,885,888 B = 196,288 MiB on the same GPU model), so VRAM is copied, not scaled; rocm-smi's bytes are
divided by 2**20. The junction (hotspot) sensor is the GPU temperature: MI300 parts have no edge sensor
(amd-smi reads ``edge: N/A`` there), MI200 parts have both; edge stays under its own name.

Everything else an AMD source says (XGMI link bytes, per-block ECC, throttle residency, edge temperature,
package power) keeps the source's own name, so nothing is lost and nothing is mistaken for a DCGM field.

Labels: ``gpu`` is the device index as Slurm and ``HIP_VISIBLE_DEVICES`` number it (the exporter's
``gpu_id``, amd-smi's ``gpu``, rocm-smi's ``cardN``; in CPX mode each partition is a GPU of its own, as the
exporter numbers it), ``modelName`` the product name the tool gives (the exporter's ``card_series``,
amd-smi's ``asic.market_name``, rocm-smi's ``Card Series``/``Device Name``) for ``model.catalog.gpu_spec``,
``vendor`` = ``amd``. The exporter's own labels are kept; its Slurm ``job_id`` label is one of the job labels
``schemas.sample_keys`` reads, so a sample carries its job exactly as dcgm-exporter's ``hpc_job`` does.

Sources: https://github.com/ROCm/device-metrics-exporter (docs/configuration/metricslist.md and the metric
help texts of pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go), https://github.com/ROCm/amdsmi (amdsmi_cli),
https://github.com/ROCm/rocm_smi_lib (python_smi_tools/rocm_smi.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Final

from hpcwatch import vocab
from hpcwatch.errors import ParseError

__all__ = [
    "EXPORTER_TO_DCGM",
    "EXPORTER_CLOCK",
    "EXPORTER_CLOCKS",
    "MIB",
    "VENDOR",
    "gpu_labels",
    "scaled",
    "to_unit",
]

MIB: Final = 1 << 20
#: The ``vendor`` label every AMD reader sets.
VENDOR: Final = "amd"

#: device-metrics-exporter metric -> (DCGM field, factor from the exporter's unit to the DCGM unit).
EXPORTER_TO_DCGM: Final[Mapping[str, tuple[str, float]]] = {
    vocab.GPU_GFX_ACTIVITY: (vocab.DCGM_FI_DEV_GPU_UTIL, 1.0),
    vocab.GPU_UMC_ACTIVITY: (vocab.DCGM_FI_DEV_MEM_COPY_UTIL, 1.0),
    vocab.GPU_POWER_USAGE: (vocab.DCGM_FI_DEV_POWER_USAGE, 1.0),
    vocab.GPU_JUNCTION_TEMPERATURE: (vocab.DCGM_FI_DEV_GPU_TEMP, 1.0),
    vocab.GPU_MEMORY_TEMPERATURE: (vocab.DCGM_FI_DEV_MEMORY_TEMP, 1.0),
    vocab.GPU_USED_VRAM: (vocab.DCGM_FI_DEV_FB_USED, 1.0),
    vocab.GPU_FREE_VRAM: (vocab.DCGM_FI_DEV_FB_FREE, 1.0),
    vocab.GPU_TOTAL_VRAM: (vocab.DCGM_FI_DEV_FB_TOTAL, 1.0),
    vocab.GPU_ENERGY_CONSUMED: (vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 1e-3),  # uJ -> mJ
    vocab.GPU_ECC_UNCORRECT_TOTAL: (vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, 1.0),
    vocab.GPU_ECC_CORRECT_TOTAL: (vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, 1.0),
    vocab.PCIE_REPLAY_COUNT: (vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, 1.0),
}
#: The exporter's clock family, one series per ``clock_type``. Not in ``vocab.METRICS``: ``gpu_clock`` is also a key
#: of ``hpcwatch steps --json`` (the GPU's timeline), and no analysis reads the family under this name.
EXPORTER_CLOCK: Final = "gpu_clock"
#: ``gpu_clock``'s ``clock_type`` (gpuagent's GPU_CLOCK_TYPE_* lower-cased) -> DCGM clock field (MHz).
EXPORTER_CLOCKS: Final[Mapping[str, str]] = {
    "system": vocab.DCGM_FI_DEV_SM_CLOCK,
    "memory": vocab.DCGM_FI_DEV_MEM_CLOCK,
}

#: Unit amd-smi writes -> factor to the hpcwatch unit of that quantity (MiB, mJ, W, C, %, MHz).
_UNITS: Final[Mapping[str, float]] = {
    "%": 1.0,
    "W": 1.0,
    "C": 1.0,
    "MHz": 1.0,
    "B": 1.0 / MIB,
    "KB": 1.0 / 1024,
    "MB": 1.0,
    "GB": 1024.0,
    "uJ": 1e-3,
    "mJ": 1.0,
    "J": 1e3,
}


def to_unit(value: float, unit: str | None, what: str, *, path: str | os.PathLike[str] | None) -> float:
    """``value`` in ``unit`` (amd-smi's spelling) converted to hpcwatch's unit of that quantity."""
    if unit is None:
        return value
    factor = _UNITS.get(unit)
    if factor is None:
        raise ParseError(f"{what}: unit {unit!r} is not one hpcwatch knows", path=path, line=None, text=unit)
    return value * factor


def scaled(value: float, factor: float, what: str, *, path: str | os.PathLike[str] | None) -> float:
    """``value * factor``, refused when it is not a finite number (a reading of 1e400 is no reading)."""
    out = value * factor
    if not math.isfinite(out):
        raise ParseError(f"{what} is not a finite number", path=path, line=None, text=repr(value))
    return out


def gpu_labels(index: str, *, model: str | None, hostname: str | None, **extra: str | None) -> dict[str, str]:
    """The labels every AMD reader gives a GPU's samples (module docstring), empty values left out."""
    labels = {"gpu": index, "vendor": VENDOR}
    if model:
        labels["modelName"] = model
    if hostname:
        labels["Hostname"] = hostname
    labels.update({k: v for k, v in extra.items() if v})
    return labels
