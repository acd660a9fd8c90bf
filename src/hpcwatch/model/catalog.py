"""Hardware facts the analyses need: peak FLOP/s, memory, links.

Every number carries its source. An unknown device gets ``None`` from
``gpu_spec`` — never another device's number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "GpuSpec",
    "LinkSpec",
    "CoolingSpec",
    "GPUS",
    "LINKS",
    "COOLING",
    "GPU_SLOWDOWN_TEMP_C",
    "gpu_spec",
    "link_spec",
    "cooling_spec",
]

TERA = 1e12
GIB = 1024**3
GB = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    key: str
    name: str
    """The name the driver reports (dcgm-exporter ``modelName``)."""
    vendor: str
    peak_bf16_dense_flops: float
    """Dense (no sparsity) BF16 tensor-core peak, FLOP/s."""
    hbm_bytes: int
    hbm_bandwidth_bytes_s: float
    nvlink_bandwidth_bytes_s: float
    """Total bidirectional GPU-to-GPU bandwidth per GPU (NVLink / Infinity Fabric)."""
    tdp_w: float
    idle_power_w: float
    """Typical power with nothing running; used by the twin and the stalled-collective check."""
    source: str


# Datasheets:
# H100: https://www.nvidia.com/en-us/data-center/h100/ (SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense,
#       80 GB HBM3, 3.35 TB/s, NVLink 900 GB/s, up to 700 W)
# H200: https://www.nvidia.com/en-us/data-center/h200/ (SXM: BF16 1,979 TFLOPS sparse, 141 GB HBM3e, 4.8 TB/s,
#       NVLink 900 GB/s, up to 700 W)
# A100: https://www.nvidia.com/en-us/data-center/a100/ (SXM 80GB: BF16 312 TFLOPS dense, 2,039 GB/s, NVLink 600 GB/s, 400 W)
# B200: https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: FP16/BF16 4.5 PFLOPS sparse per GPU -> 2.25 dense,
#       180 GB HBM3e, 7.7 TB/s; NVLink 5 1.8 TB/s; 1,000 W)
# MI300X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (BF16 1,307.4 TFLOPS dense,
#       192 GB HBM3, 5.3 TB/s, Infinity Fabric 896 GB/s peak aggregate, 750 W)
# MI325X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html (BF16 1,307.4 TFLOPS dense, the
#       MI300X's CDNA 3 dies; 256 GB HBM3E, 6 TB/s; 7 Infinity Fabric links x 128 GB/s = 896 GB/s; 1,000 W)
# MI355X: https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html (BF16 2.5 PFLOPS dense: 2,516.6
#       TFLOPS, 5.0 with sparsity; 288 GB HBM3E, 8 TB/s; 7 Infinity Fabric links x 153.6 GB/s = 1,075.2 GB/s; 1,400 W)
# MI250X: https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html (per OAM package: BF16 383.0
#       TFLOPS, 128 GB HBM2e, 3.2768 TB/s, 8 Infinity Fabric links x 100 GB/s, 560 W peak). The package holds two
#       graphics compute dies (GCDs) and the driver, amd-smi, rocm-smi, Slurm's GRES and HIP each count a GCD as
#       one GPU (Frontier's 4 packages are 8 GPUs a node), so the entry is one GCD: half of each package figure.
# AMD idle powers: MI300X 140 W (rocm-smi of 4 idle MI300X at 131-137 W, thamada/nvidia-smi nvsim/MI300X_x4_smi.py;
#       amd-smi 158 W at 0 % activity, tests/data/amd/amd_smi_metric_mi300x_26.0.2_lilbee.json); MI250X 45 W a GCD
#       (rocm-smi of an idle MI250 package, 91 W at 0 % use, tests/data/amd/rocm_smi_a_mi250_rocm6_wandb.json, of
#       which half); MI325X and MI355X: no capture of ours, ours = the MI300X's idle share of its TDP (19 %).
GPUS: dict[str, GpuSpec] = {
    spec.key: spec
    for spec in (
        GpuSpec(
            key="h100-sxm",
            name="NVIDIA H100 80GB HBM3",
            vendor="nvidia",
            peak_bf16_dense_flops=989.4 * TERA,
            hbm_bytes=80 * GIB,
            hbm_bandwidth_bytes_s=3.35e12,
            nvlink_bandwidth_bytes_s=900 * GB,
            tdp_w=700.0,
            idle_power_w=70.0,
            source="https://www.nvidia.com/en-us/data-center/h100/",
        ),
        GpuSpec(
            key="h200",
            name="NVIDIA H200",
            vendor="nvidia",
            peak_bf16_dense_flops=989.4 * TERA,
            hbm_bytes=141 * 10**9,
            hbm_bandwidth_bytes_s=4.8e12,
            nvlink_bandwidth_bytes_s=900 * GB,
            tdp_w=700.0,
            idle_power_w=75.0,
            source="https://www.nvidia.com/en-us/data-center/h200/",
        ),
        GpuSpec(
            key="a100-sxm",
            name="NVIDIA A100-SXM4-80GB",
            vendor="nvidia",
            peak_bf16_dense_flops=312 * TERA,
            hbm_bytes=80 * GIB,
            hbm_bandwidth_bytes_s=2.039e12,
            nvlink_bandwidth_bytes_s=600 * GB,
            tdp_w=400.0,
            idle_power_w=55.0,
            source="https://www.nvidia.com/en-us/data-center/a100/",
        ),
        GpuSpec(
            key="b200",
            name="NVIDIA B200",
            vendor="nvidia",
            peak_bf16_dense_flops=2250 * TERA,
            hbm_bytes=180 * 10**9,
            hbm_bandwidth_bytes_s=7.7e12,
            nvlink_bandwidth_bytes_s=1800 * GB,
            tdp_w=1000.0,
            idle_power_w=120.0,
            source="https://www.nvidia.com/en-us/data-center/hgx/",
        ),
        GpuSpec(
            key="mi300x",
            name="AMD Instinct MI300X",
            vendor="amd",
            peak_bf16_dense_flops=1307.4 * TERA,
            hbm_bytes=192 * 10**9,
            hbm_bandwidth_bytes_s=5.3e12,
            nvlink_bandwidth_bytes_s=896 * GB,
            tdp_w=750.0,
            idle_power_w=140.0,
            source="https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        ),
        GpuSpec(
            key="mi325x",
            name="AMD Instinct MI325X",
            vendor="amd",
            peak_bf16_dense_flops=1307.4 * TERA,
            hbm_bytes=256 * 10**9,
            hbm_bandwidth_bytes_s=6.0e12,
            nvlink_bandwidth_bytes_s=7 * 128 * GB,
            tdp_w=1000.0,
            idle_power_w=float(round(1000.0 * 140.0 / 750.0)),
            source="https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
        ),
        GpuSpec(
            key="mi355x",
            name="AMD Instinct MI355X",
            vendor="amd",
            peak_bf16_dense_flops=2516.6 * TERA,
            hbm_bytes=288 * 10**9,
            hbm_bandwidth_bytes_s=8.0e12,
            nvlink_bandwidth_bytes_s=7 * 153.6 * GB,
            tdp_w=1400.0,
            idle_power_w=float(round(1400.0 * 140.0 / 750.0)),
            source="https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html",
        ),
        GpuSpec(
            key="mi250x",
            name="AMD Instinct MI250X",
            vendor="amd",
            peak_bf16_dense_flops=383.0 * TERA / 2,
            hbm_bytes=128 * GIB // 2,
            hbm_bandwidth_bytes_s=3.2768e12 / 2,
            nvlink_bandwidth_bytes_s=8 * 100 * GB / 2,
            tdp_w=560.0 / 2,
            idle_power_w=91.0 / 2,
            source="https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
        ),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    key: str
    name: str
    rate_bits_s: float
    """Signalling data rate of one port, one direction."""
    source: str


# InfiniBand rates per 4x port: https://www.infinibandta.org/infiniband-roadmap/ (HDR 200 Gb/s, NDR 400 Gb/s, XDR 800 Gb/s)
LINKS: dict[str, LinkSpec] = {
    spec.key: spec
    for spec in (
        LinkSpec(
            key="hdr",
            name="InfiniBand HDR",
            rate_bits_s=200e9,
            source="https://www.infinibandta.org/infiniband-roadmap/",
        ),
        LinkSpec(
            key="ndr",
            name="InfiniBand NDR",
            rate_bits_s=400e9,
            source="https://www.infinibandta.org/infiniband-roadmap/",
        ),
        LinkSpec(
            key="xdr",
            name="InfiniBand XDR",
            rate_bits_s=800e9,
            source="https://www.infinibandta.org/infiniband-roadmap/",
        ),
    )
}

_ALIASES = {"h100": "h100-sxm", "h100-sxm5": "h100-sxm", "a100": "a100-sxm", "h200-sxm": "h200"}
#: An AMD Instinct product in the names the tools give: amd-smi ``AMD Instinct MI300X``, the exporter's
#: ``card_series`` ``AMD Instinct MI300X OAM`` or ``Aqua Vanjaram [Instinct MI300X VF]`` (lspci's, under SR-IOV),
#: rocm-smi ``AMD INSTINCT MI250X (MCM) OAM ...``, ``MI300X-O``. The number and the X must match exactly: an MI250
#: (no X, 362.1 TFLOPS) or an MI308X is another product, and gets None.
_AMD_PRODUCT_RE = re.compile(r"(?<![a-z0-9])(mi250x|mi300x|mi325x|mi355x)(?![a-z0-9])")


def gpu_spec(key_or_name: str) -> GpuSpec | None:
    """The spec for a catalog key (``h100-sxm``) or a driver name (``NVIDIA H100 80GB HBM3``, ``AMD Instinct
    MI300X OAM``); else ``None``."""
    key = key_or_name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    for spec in GPUS.values():
        if spec.name.lower() == key:
            return spec
    amd = _AMD_PRODUCT_RE.search(key) if ("instinct" in key or key.startswith("mi")) else None
    return GPUS.get(amd.group(1)) if amd else None


def link_spec(key: str) -> LinkSpec | None:
    return LINKS.get(key.strip().lower())


@dataclass(frozen=True, slots=True, kw_only=True)
class CoolingSpec:
    """How a way of cooling sets a GPU's temperature: T -> inlet_c + c_per_w x P, with time constant tau_s."""

    kind: str
    inlet_c: float
    """Typical temperature of what cools the GPU as it arrives (air at the server's front, or coolant)."""
    c_per_w: float
    """Rise of the GPU above the inlet per watt it draws (the thermal resistance die -> inlet), °C/W."""
    tau_s: float
    """How fast the GPU follows a change of power (first-order time constant)."""
    source: str


# Liquid: direct-to-chip cold plates. The numbers are the fit of a real H200 (data/real/h200/nvml_timeseries.csv:
# 36 °C idle, 56 °C at 680 W): 28 °C + 0.04 °C/W, 45 s. 28 °C coolant sits inside ASHRAE's W32 class (facility
# water up to 32 °C; ASHRAE TC 9.9, "Liquid Cooling Guidelines for Datacom Equipment Centers", 2nd ed., 2014).
# Air: ASHRAE's recommended inlet range is 18-27 °C (TC 9.9 "Thermal Guidelines for Data Processing
# Environments", 5th ed., 2021), so 25 °C; an air-cooled HGX heat sink runs a 700 W SXM GPU near 78 °C (ours:
# the 0.075 °C/W that gives, typical of the 70-80 °C operators report at full load) and the heat sink's
# larger thermal mass makes it slower than a cold plate (ours: 90 s).
COOLING: dict[str, CoolingSpec] = {
    spec.kind: spec
    for spec in (
        CoolingSpec(
            kind="liquid",
            inlet_c=28.0,
            c_per_w=0.04,
            tau_s=45.0,
            source="fit of data/real/h200/nvml_timeseries.csv; ASHRAE TC 9.9 liquid class W32",
        ),
        CoolingSpec(
            kind="air",
            inlet_c=25.0,
            c_per_w=0.075,
            tau_s=90.0,
            source="ASHRAE TC 9.9 recommended inlet 18-27 °C; resistance and time constant ours",
        ),
    )
}

#: Temperature at which the GPU slows its clocks to protect itself (nvidia-smi "GPU Slowdown Temp"). H200: the
#: real ``nvidia-smi -q -x`` of data/real/h200/nvidia_smi_q.xml reads gpu_temp 35 C with gpu_temp_tlimit 52 C
#: (T.Limit = 87 C) and gpu_temp_slow_tlimit_threshold -2 C: slowdown at 89 C. H100 SXM: the same GH100 die and
#: limits; no H100 capture of ours says so, so the H100 value is the H200's). Unknown GPUs have none.
GPU_SLOWDOWN_TEMP_C: dict[str, float] = {"h200": 89.0, "h100-sxm": 89.0}


def cooling_spec(kind: str) -> CoolingSpec | None:
    """The cooling of that kind (``air``, ``liquid``), or None."""
    return COOLING.get(kind)
