"""The twin's devices as their exporters name them: dcgm-exporter's fields, perfquery's counters, a GPU's identity.

Constants only, and the two functions that make a GPU's UUID and PCI bus id: the twin's layout
(twin/core.py) builds its label sets from them, its writers (twin/exposition.py) its lines.
"""

from __future__ import annotations

import hashlib

from hpcwatch import vocab

__all__ = [
    "DRIVER_VERSION",
    "DRIVER_CUDA",
    "R570_DRIVER_VERSION",
    "AMD_DRIVER_VERSION",
    "AMD_VBIOS_VERSION",
    "SM_CLOCK_MAX_MHZ",
    "SM_CLOCK_IDLE_MHZ",
    "IB_MTU_BYTES",
    "DCGM_FIELDS",
    "IB_COUNTERS",
    "FIELD",
    "COUNTER",
    "HGX_BUS_IDS",
    "gpu_uuid",
    "amd_uuid",
    "bus_id",
]

#: A data-centre driver as dcgm-exporter puts it in DCGM_FI_DRIVER_VERSION: R580 at its first release with the
#: May 2026 security fixes (NVIDIA bulletin a_id 5821; the floor ClusterMAX pins, see assess/versions.py).
DRIVER_VERSION = "580.159.03"
#: The CUDA version each NVIDIA driver the twin runs supports, as NCCL prints it (``cudaDriverVersion``, 1000 ×
#: major + 10 × minor; nvidia-smi's "CUDA Version"): R580 is CUDA 13.0 (the real H200 of tests/data, driver
#: 580.159.04: nvidia-smi's <cuda_version> 13.0, NCCL's cudaDriverVersion 13000), R570 CUDA 12.8 (CUDA Toolkit
#: release notes, table "CUDA Toolkit and Corresponding Driver Versions": CUDA 12.8 GA needs >= 570.26).
R570_DRIVER_VERSION = "570.211.01"
"""R570's first release with the May 2026 fixes (assess/versions.py): the driver a drifted node still runs."""
DRIVER_CUDA: dict[str, int] = {DRIVER_VERSION: 13000, R570_DRIVER_VERSION: 12080}
#: The amdgpu driver and MI300X VBIOS device-metrics-exporter names in its ``driver_version`` / ``vbios_version``
#: labels, as in the MI300X scrape of ROCm/device-metrics-exporter issue #171 (tests/data/amd).
AMD_DRIVER_VERSION = "6.12.12"
AMD_VBIOS_VERSION = "022.040.003.042.000001"
#: Max SM clock (MHz) as ``nvidia-smi -q`` reports it; H200 seen in data/real/h200/nvml_timeseries.csv (1980).
#: H100 SXM: https://www.nvidia.com/en-us/data-center/h100/ (same GH100 boost), A100: 1410 (A100 datasheet).
SM_CLOCK_MAX_MHZ = {"h100-sxm": 1980.0, "h200": 1980.0, "a100-sxm": 1410.0}
#: Idle SM clock of an H100 with no process, dcgm-exporter README sample (345 MHz).
SM_CLOCK_IDLE_MHZ = 345.0
#: InfiniBand MTU used to turn bytes into packets (NDR, 4 KiB).
IB_MTU_BYTES = 4096

#: dcgm-exporter fields the twin produces, in the order dcgm-exporter writes them (etc/default-counters.csv).
DCGM_FIELDS = (
    vocab.DCGM_FI_DEV_SM_CLOCK,
    vocab.DCGM_FI_DEV_GPU_TEMP,
    vocab.DCGM_FI_DEV_POWER_USAGE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    vocab.DCGM_FI_DEV_GPU_UTIL,
    vocab.DCGM_FI_DEV_XID_ERRORS,
    vocab.DCGM_FI_DEV_FB_FREE,
    vocab.DCGM_FI_DEV_FB_USED,
    vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
)
#: Column of each field in the twin's ``fields`` array.
FIELD = {name: i for i, name in enumerate(DCGM_FIELDS)}

#: perfquery -x counters the twin keeps per port (data counters in 4-byte words, as the HCA counts them).
IB_COUNTERS = (
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitWait",
    "QP1Dropped",
)
#: Column of each counter in the twin's ``ib`` array.
COUNTER = {name: i for i, name in enumerate(IB_COUNTERS)}

# HGX H100 8-GPU baseboard PCI bus ids (as nvidia-smi shows them on a DGX H100).
HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """A stable UUID in NVML's form, from the GPU's place in the cluster."""
    h = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def amd_uuid(cluster: str, node: str, index: int) -> str:
    """A stable UUID in the form amd-smi and device-metrics-exporter give (``17ff74b5-0000-1000-805c-...``, issue
    #171 of ROCm/device-metrics-exporter), from the GPU's place in the cluster."""
    h = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"{h[:4]}ff74-0000-1000-80{h[4:6]}-{h[6:18]}"


def bus_id(index: int) -> str:
    """GPU ``index``'s PCI bus id, the HGX baseboard's for the first eight."""
    bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"
