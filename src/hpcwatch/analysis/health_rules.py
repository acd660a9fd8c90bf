"""The health rules, declared once: what each one reads, how bad it is, what it does, and on whose word.

``HEALTH_RULES`` is the one table. ``analysis.health.Check`` refuses a rule id
outside it (a check under a forgotten id would drain a node for a reason
nobody can look up), ``hpcwatch health --list-rules`` prints it, and the
module docstrings of the rules point here instead of copying it. Each row:

- ``id``: what ``Check.rule`` holds (and the ``--summary`` reason names);
- ``family``: the part of the node it judges (``gpu``, ``fabric``, ``nccl``, ``benchmark``);
- ``sources``: the registered formats (``sources.builtin``, ``--format`` names) whose records it reads;
- ``severity``: how much a fired rule hurts the jobs of the node (``records.Severity``);
- ``actions``: the verdicts it can give (``ok`` only where it notes a fact without blaming the node);
- ``threshold``: when it fires; ``{name}`` is a ``HealthConfig`` field, filled with its value when listed
  (``threshold_text``), so the number shown is the one the code judges by;
- ``citation``: where the meaning or the number comes from (a vendor document, a spec, NHC); a
  threshold that is our own choice says so and names its ``HealthConfig`` field.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hpcwatch import vocab
from hpcwatch.analysis.xid import XID_CATALOG_URL, Verdict
from hpcwatch.records import SEVERITIES, Severity

__all__ = [
    "HealthRuleId",
    "HealthFamily",
    "HealthRule",
    "HEALTH_RULES",
    "HEALTH_RULE_IDS",
    "FAMILIES",
    "health_rule",
]

HealthRuleId = Literal[
    # GPUs: dcgm-exporter fields, the kernel's XIDs
    "xid",
    "ecc_dbe",
    "row_remap",
    "pcie_replay",
    "throttle",
    "stalled_nccl",
    "idle_allocated",
    "gpu_missing",
    "ecc_correctable",
    "xgmi_errors",
    "amd_throttle",
    # InfiniBand fabric
    "ib_link",
    "ib_errors",
    "ib_port",
    # active benchmarks between jobs
    "dcgm_diag",
    "nccl_tests",
    "ib_write_bw",
    # NCCL_DEBUG=INFO logs and PyTorch's watchdog (analysis.nccl)
    "nccl_socket_fallback",
    "nccl_few_channels",
    "nccl_forced_tuning",
    "nccl_version_mismatch",
    "nccl_ib_missing",
    "nccl_intranode_net",
    "nccl_timeout",
    # the host: drives (smartctl)
    "smart_status",
    "nvme_critical_warning",
    "nvme_spare",
    "nvme_wear",
    "nvme_media_errors",
    "nvme_temperature",
    # the host: its local file systems (df)
    "disk_space",
    "disk_inodes",
    # the host: its memory (EDAC counters)
    "memory_uncorrected",
    "memory_corrected",
    # the host: PCIe links of GPUs and HCAs (lspci -vv; the GPU's own report: nvidia-smi -q, dcgm-exporter)
    "pcie_width",
    "pcie_speed",
    "pcie_gen",
    # the host: its clock (chronyc tracking)
    "clock_offset",
    "clock_unsynchronised",
    # the host: its kernel log (dmesg, journalctl -k)
    "hung_task",
    "oom_kill",
    "hw_error",
    "nic_driver",
    # the host: its services (systemctl)
    "failed_units",
    # the host: its BMC (ipmitool)
    "ipmi_sel",
    "bmc_sensor",
    "bmc_psu_fan",
    # the fleet: nodes of one partition that should match
    "driver_mismatch",
    "firmware_mismatch",
    "kernel_mismatch",
    "cuda_mismatch",
    "nccl_fleet_mismatch",
    "ofed_mismatch",
    "hca_firmware_mismatch",
]
HealthFamily = Literal[
    "gpu", "fabric", "benchmark", "nccl", "storage", "memory", "pcie", "clock", "kernel", "services", "bmc", "fleet"
]
FAMILIES: tuple[HealthFamily, ...] = get_args(HealthFamily)

_DCGM_FIELDS = "https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html"
_ROW_REMAP = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"
_CLOCK_EVENTS = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html"
_IBA_COUNTERS = "InfiniBand Architecture Specification vol. 1, PortCounters attribute (perfquery's names)"
_NHC_IB = "https://github.com/mej/nhc (README, check_hw_ib: a port not Active at its rate offlines the node)"
_DCGM_DIAG = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html"
_NVSENTINEL_NIC = "https://github.com/NVIDIA/NVSentinel/blob/main/docs/nic-health-monitor.md (Syslog Detection)"
_NCCL_TESTS = "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md"
_PERFTEST = "https://github.com/linux-rdma/perftest (ib_write_bw BW average, Gb/s)"
_NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_NCCL_790 = "https://github.com/NVIDIA/nccl/issues/790 (NCCL_ALGO/NCCL_PROTO are not for production)"
_TORCH_WATCHDOG = "https://pytorch.org/docs/stable/torch_nccl_environment_variables.html (TORCH_NCCL_*TIMEOUT*)"
_OURS = "our choice (HealthConfig)"
_NVME_LOG = (
    "NVM Express Base Specification 2.0, SMART / Health Information log page (Critical Warning bits, Available "
    "Spare and its Threshold, Percentage Used, Media and Data Integrity Errors)"
)
_GCM_BLOCKDEV = (
    "https://github.com/facebookresearch/gcm gcm/health_checks/checks/check_blockdev.py (percentage used warns at 80, "
    "critical at 100; spare critical under its threshold)"
)
_GCM_PCI = (
    "https://github.com/facebookresearch/gcm gcm/health_checks/checks/check_pci.py (a GPU or NIC whose link width "
    "or speed is under the expected one is critical)"
)
_PCIE_LINK = "PCI Express Base Specification, Link Capabilities / Link Status registers (lspci's LnkCap / LnkSta)"
_NVSMI_PCIE = (
    "nvidia-smi(1), 'PCI' > 'GPU Link Info': the current link generation and width may be reduced when the GPU "
    "is not in use"
)
_DCGM_PCIE = (
    "https://docs.nvidia.com/datacenter/dcgm/latest/reference/diagnostics/plugins/pcie.html (DCGM's PCIe plugin "
    "flags link downtraining while it drives the link itself)"
)
_DCGM_REPLAY = (
    "NVIDIA/DCGM DCGM_LIMIT_MAX_PCIREPLAY_RATE: '8 replays per minute is the maximum recommended by RM' (the PCIe "
    "health watch's DCGM_FR_PCI_REPLAY_RATE)"
)
_NVSMI_Q = "nvidia-smi(1), -q: Driver Version, CUDA Version, VBIOS Version"
_NODE_UNAME = "https://github.com/prometheus/node_exporter collector/uname.go (node_uname_info: release = uname -r)"
_NODE_IB = (
    "https://github.com/prometheus/node_exporter collector/infiniband_linux.go (node_infiniband_info: "
    "firmware_version, hca_type)"
)
_NHC_OFED = (
    "https://github.com/mej/nhc (check_hw_ib: 'Version mismatch between kernel OFED drivers and userspace OFED "
    "libraries'); ofed_info -s"
)
_CHRONYC = "https://chrony-project.org/doc/4.6/chronyc.html (tracking: System time, Leap status)"
_CHRONY_MAKESTEP = (
    "chrony's example configurations (examples/chrony.conf.example1): 'makestep 1.0 3', an offset over 1 s is "
    "stepped, not slewed"
)
_MUNGE_TTL = "munge(7) / munged(8): a credential's default time-to-live is 300 s, a clock further off fails Slurm auth"
_NPD_KERNEL = (
    "https://github.com/kubernetes/node-problem-detector config/kernel-monitor.json (OOMKilling, TaskHung, "
    "CperHardwareErrorCorrected / Recoverable temporary; CperHardwareErrorFatal a permanent node condition)"
)
_KERNEL_RAS = "https://docs.kernel.org/admin-guide/ras.html (corrected vs uncorrected memory errors, EDAC)"
_MCI_STATUS = (
    "Intel 64 and IA-32 Architectures SDM vol. 3B, section 16.3.2.2 'IA32_MCi_STATUS MSRs' (bit 61 UC, bit 57 PCC); "
    "Linux arch/x86/kernel/cpu/mce/core.c (print_mce, mce_notify_irq)"
)
_SERVICES = (
    "https://www.freedesktop.org/software/systemd/man/latest/systemctl.html (--failed, --output=json); GCM "
    "check_service and LBNL NHC check_ps_service (a service the node needs that is not running fails the node)"
)
_GCM_SEL = (
    "https://github.com/facebookresearch/gcm gcm/health_checks/checks/check_ipmitool.py (an asserted Power Supply "
    "AC lost, NVIDIA_MCA_Error, Uncorrectable error, Critical Interrupt Bus Fatal Error / PCI SERR, Processor "
    "Throttled or BIOS corruption is critical)"
)
_IPMI_SPEC = (
    "IPMI v2.0 specification, table 42-3 'Sensor Type Codes' (Memory: Correctable / Uncorrectable ECC; Power "
    "Supply: Failure detected) and threshold events (Upper / Lower Critical)"
)
_IPMI_THRESHOLDS = (
    "IPMI v2.0 specification, section 36.3 'Sensor Reading and Event Status' (lower / upper non-critical, "
    "critical, non-recoverable thresholds, set in the BMC's SDR); ipmitool(1) 'sdr' and 'sensor' (status ok / nc / "
    "cr / nr / ns and the lnr lcr lnc unc ucr unr columns)"
)
_IPMI_STATES = (
    "IPMI v2.0 specification, table 42-3 'Sensor Type Codes' (Power Supply 08h: Failure detected, Predictive "
    "failure, Power Supply input lost (AC/DC), Configuration error) and table 42-2 'Generic Event/Reading Type "
    "Codes' (Availability 08h: Device Absent; Redundancy 0Bh: Redundancy Lost / Degraded, Non-redundant: "
    "Insufficient Resources), as ipmitool sdr elist prints them"
)
_AMD_METRICS = (
    "https://github.com/ROCm/device-metrics-exporter docs/configuration/metricslist.md (ECC Error Metrics: "
    "GPU_ECC_CORRECT_* / GPU_ECC_UNCORRECT_* per block; Throttling & Violation Metrics: *_RESIDENCY_PERCENTAGE)"
)
_AMD_SMI = "https://github.com/ROCm/amdsmi amd-smi metric (ecc: total_correctable_count, total_uncorrectable_count)"
_NODE_MIXIN_FS = (
    "https://github.com/prometheus/node_exporter docs/node-mixin (alerts NodeFilesystemAlmostOutOfSpace: "
    "avail / size under fsSpaceAvailableWarningThreshold 5 % warns, fsSpaceAvailableCriticalThreshold 3 % is "
    "critical; NodeFilesystemAlmostOutOfFiles: files_free / files under 5 % warns, 3 % critical)"
)
_DF = "GNU coreutils df(1) (-P, -i, -T, --output: Avail is what unprivileged users can still write)"
_EDAC_SYSFS = (
    "https://docs.kernel.org/admin-guide/ras.html (EDAC sysfs: mcN/ce_count, ue_count, dimmN/dimm_ce_count; "
    "counts since the counters were reset); edac-util(1)"
)
_MCELOG_DIMM = (
    "https://github.com/andikleen/mcelog mcelog.conf [dimm]: uc-error-threshold = 1 / 24h, "
    "ce-error-threshold = 10 / 24h (10/24h 'reasonable for server quality' DIMMs)"
)
_SMARTCTL = "https://www.smartmontools.org/browser/trunk/smartmontools/smartctl.8.in (--json, -H, exit status bit 3)"


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthRule:
    """One health rule; everything else that names a rule derives from its row."""

    id: HealthRuleId
    family: HealthFamily
    sources: tuple[str, ...]
    """Registered format names (``hpcwatch ingest --format``) whose records it judges."""
    signal: str
    """What it reads, in the source's own names (a metric, a counter, an event's field)."""
    severity: Severity
    actions: tuple[Verdict, ...]
    """The verdicts it can give, mildest first."""
    threshold: str
    """When it fires; ``{field}`` names a ``HealthConfig`` field (``threshold_text`` fills it)."""
    citation: str
    active: bool = False
    """A benchmark's result (run between jobs) rather than what the exporters collect."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"health rule {self.id!r}: unknown severity {self.severity!r}")
        if not self.actions or any(a not in get_args(Verdict) for a in self.actions):
            raise ValueError(f"health rule {self.id!r}: actions must be ok/warn/drain, got {self.actions!r}")

    @property
    def config_fields(self) -> tuple[str, ...]:
        """The ``HealthConfig`` fields its threshold names."""
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.threshold) if name)

    def threshold_text(self, values: Mapping[str, Any]) -> str:
        """The threshold with each ``{field}`` replaced by its value in ``values`` (a config as a dict; a list of
        names is written comma-separated)."""
        shown = {
            name: ", ".join(map(str, v)) if isinstance(v := values[name], (tuple, list)) else v
            for name in self.config_fields
        }
        return self.threshold.format_map(shown)

    def to_dict(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "active": self.active,
            "sources": list(self.sources),
            "signal": self.signal,
            "severity": self.severity,
            "actions": list(self.actions),
            "threshold": self.threshold_text(values),
            "config_fields": list(self.config_fields),
            "citation": self.citation,
        }


def _r(**kw: Any) -> HealthRule:
    return HealthRule(**kw)


#: Every health rule, by family; the order of ``--list-rules``.
HEALTH_RULES: tuple[HealthRule, ...] = (
    _r(
        id="xid",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_XID_ERRORS != 0; xid events (NVRM: Xid lines of the kernel log)",
        severity="high",
        actions=("warn", "drain"),
        threshold="any XID; the verdict is the catalogue's immediate action for its code (analysis.xid)",
        citation=XID_CATALOG_URL,
    ),
    _r(
        id="ecc_dbe",
        family="gpu",
        sources=("prometheus", "amd-device-metrics", "amd-smi-json"),
        signal=f"{vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL} (AMD: gpu_ecc_uncorrect_total, amd-smi "
        "ecc.total_uncorrectable_count, renamed to it)",
        severity="critical",
        actions=("drain",),
        threshold="> 0 uncorrectable (double-bit) ECC errors since the driver loaded",
        citation=f"{_DCGM_FIELDS}; {_AMD_METRICS}; {_AMD_SMI}",
    ),
    _r(
        id="row_remap",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_ROW_REMAP_FAILURE, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_ROW_REMAP_PENDING",
        severity="high",
        actions=("warn", "drain"),
        threshold="remap failure > 0 drains; uncorrectable remapped rows grew in the window, or a remap pending, warns",
        citation=_ROW_REMAP,
    ),
    _r(
        id="pcie_replay",
        family="gpu",
        sources=("prometheus", "nvidia-smi-xml", "nvidia-smi-q"),
        signal=f"{vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER} (dcgm-exporter; nvidia-smi -q's PCI > Replays Since Reset, "
        "<replay_counter>)",
        severity="medium",
        actions=("warn",),
        threshold="grew by >= {pcie_replay_warn} in the window (stricter than DCGM's 8 a minute over any window past "
        "75 s; the evidence says whether DCGM's rate was passed too)",
        citation=f"{_DCGM_FIELDS}; {_DCGM_REPLAY}; the count is {_OURS}",
    ),
    _r(
        id="throttle",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits hw_slowdown, "
        "sw_thermal, hw_thermal, hw_power_brake",
        severity="medium",
        actions=("warn",),
        threshold="one of those bits set in >= {throttle_warn_fraction:.0%} of the GPU's samples",
        citation=f"{_CLOCK_EVENTS}; the share is {_OURS}",
    ),
    _r(
        id="stalled_nccl",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_GPU_UTIL with DCGM_FI_DEV_POWER_USAGE",
        severity="high",
        actions=("warn",),
        threshold="util >= {stall_util_pct} % at <= {stall_power_factor} × the catalog's idle power for "
        ">= {stall_min_s} s",
        citation=f"idle power: model.catalog; the pattern (a spinning NCCL kernel draws little) and numbers: {_OURS}",
    ),
    _r(
        id="idle_allocated",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_GPU_UTIL of a GPU whose hpc_job label names a job",
        severity="low",
        actions=("warn",),
        threshold="util <= {idle_util_pct} % for >= {idle_min_s} s",
        citation=_OURS,
    ),
    _r(
        id="gpu_missing",
        family="gpu",
        sources=("prometheus",),
        signal="DCGM_FI_DEV_GPU_UTIL series that stopped while its node still reports",
        severity="critical",
        actions=("drain",),
        threshold="last sample > {missing_after_s} s older than the node's newest",
        citation=f"{XID_CATALOG_URL} (XID 79, fallen off the bus, is what it usually is); the delay is {_OURS}",
    ),
    _r(
        id="ecc_correctable",
        family="gpu",
        sources=("prometheus", "amd-device-metrics", "amd-smi-json"),
        signal=f"{vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL} (AMD: gpu_ecc_correct_total, amd-smi "
        "ecc.total_correctable_count, renamed to it)",
        severity="low",
        actions=("warn",),
        threshold=">= {ecc_correctable_warn} correctable ECC errors in the window (corrected, the job went on; a "
        "storm of them foretells uncorrectable ones and retired pages)",
        citation=f"{_DCGM_FIELDS}; {_AMD_METRICS}; the number is {_OURS}",
    ),
    _r(
        id="xgmi_errors",
        family="gpu",
        sources=("amd-device-metrics",),
        signal=f"{vocab.GPU_ECC_UNCORRECT_XGMI_WAFL}, {vocab.GPU_ECC_CORRECT_XGMI_WAFL} (ECC errors of the XGMI "
        "WAFL block: the physical layer of the GPU-to-GPU XGMI links)",
        severity="high",
        actions=("warn", "drain"),
        threshold="an uncorrectable XGMI WAFL error drains; correctable ones that grew in the window warn",
        citation=_AMD_METRICS,
    ),
    _r(
        id="amd_throttle",
        family="gpu",
        sources=("amd-device-metrics",),
        signal="gpu_violation_{socket_thermal,vr_thermal,hbm_thermal,processor_hot}_residency_percentage (MI3xx: "
        "share of time the clocks were held down by a thermal limit)",
        severity="medium",
        actions=("warn",),
        threshold="mean over the window >= {throttle_warn_fraction} x 100 % (package power tracking, PPT, is "
        "normal under load and is not judged, like NVIDIA's sw_power_cap)",
        citation=f"{_AMD_METRICS}; the share is {_OURS}, the same as throttle's",
    ),
    _r(
        id="ib_link",
        family="fabric",
        sources=("perfquery", "prometheus"),
        signal="LinkDownedCounter (perfquery), node_infiniband_link_downed_total (node-exporter)",
        severity="high",
        actions=("warn", "drain"),
        threshold="grew by 1 warns, by >= {link_down_drain} drains, in the window",
        citation=f"{_IBA_COUNTERS}; the count is {_OURS}",
    ),
    _r(
        id="ib_errors",
        family="fabric",
        sources=("perfquery", "prometheus"),
        signal="SymbolErrorCounter, PortRcvErrors, LinkErrorRecoveryCounter, LocalLinkIntegrityErrors, "
        "ExcessiveBufferOverrunErrors",
        severity="medium",
        actions=("warn",),
        threshold="symbol errors grew by >= {symbol_error_warn}, any other by >= 1, in the window",
        citation=f"{_IBA_COUNTERS}; the counts are {_OURS}",
    ),
    _r(
        id="ib_port",
        family="fabric",
        sources=("ibstat",),
        signal="ibstat State / Physical state / Rate of each InfiniBand port; ibstat's panic on an HCA",
        severity="high",
        actions=("warn", "drain"),
        threshold="not Active/LinkUp drains (Disabled by an admin: warns); rate under the catalog's link warns, "
        "under {ib_rate_drain_fraction:.0%} of it drains; an HCA ibstat cannot stat drains",
        citation=f"ibstat(8), IBA PortInfo PortState/PortPhysicalState; {_NHC_IB}",
    ),
    _r(
        id="dcgm_diag",
        family="benchmark",
        sources=("dcgmi-diag",),
        signal="dcgmi diag -j test results",
        severity="high",
        actions=("warn", "drain"),
        threshold="a test that fails drains, one that warns warns",
        citation=_DCGM_DIAG,
        active=True,
    ),
    _r(
        id="nccl_tests",
        family="benchmark",
        sources=("nccl-tests",),
        signal="nccl-tests #wrong, algbw, busbw of the largest size",
        severity="high",
        actions=("warn", "drain"),
        threshold="any wrong result drains; busbw under {busbw_warn_fraction:.0%} of the catalog's NVLink (one node) "
        "or link (across nodes) figure, or busbw != algbw × 2(n-1)/n, warns",
        citation=_NCCL_TESTS,
        active=True,
    ),
    _r(
        id="ib_write_bw",
        family="benchmark",
        sources=("ib-write-bw",),
        signal="ib_write_bw BW average of the largest message",
        severity="high",
        actions=("warn", "drain"),
        threshold="under {ib_bw_warn_fraction:.0%} of the link rate warns, under {ib_bw_drain_fraction:.0%} drains",
        citation=f"{_PERFTEST}; the shares are {_OURS}",
        active=True,
    ),
    _r(
        id="nccl_socket_fallback",
        family="nccl",
        sources=("nccl-log",),
        signal="NET/Socket transports, 'Using network Socket'",
        severity="medium",
        actions=("ok", "warn"),
        threshold="a rank on NET/Socket while its job or host has InfiniBand warns; TCP with no IB anywhere is noted",
        citation=f"{_NCCL_ENV}; a ring runs at its slowest link (docs/reference.md)",
    ),
    _r(
        id="nccl_few_channels",
        family="nccl",
        sources=("nccl-log",),
        signal="coll channels / rings built vs 'Pattern .. nChannels N' of the topology search",
        severity="medium",
        actions=("warn",),
        threshold="fewer channels than the search found, or than another rank of the job built",
        citation=_NCCL_ENV,
    ),
    _r(
        id="nccl_forced_tuning",
        family="nccl",
        sources=("nccl-log",),
        signal="NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS ... printed as set",
        severity="low",
        actions=("warn",),
        threshold="any of analysis.nccl.FORCING_VARIABLES set",
        citation=_NCCL_790,
    ),
    _r(
        id="nccl_version_mismatch",
        family="nccl",
        sources=("nccl-log",),
        signal="NCCL version, CUDA runtime, net plugin of each rank",
        severity="medium",
        actions=("warn",),
        threshold="they differ across the job's ranks",
        citation=_NCCL_ENV,
    ),
    _r(
        id="nccl_ib_missing",
        family="nccl",
        sources=("nccl-log",),
        signal="NET/IB devices each host lists",
        severity="high",
        actions=("drain",),
        threshold="some hosts list fewer (or no) NET/IB devices than the others",
        citation=f"{_NCCL_ENV}; a host without its HCAs is a hardware or driver fault ({_NHC_IB})",
    ),
    _r(
        id="nccl_intranode_net",
        family="nccl",
        sources=("nccl-log",),
        signal="two GPUs of one host connected over NET instead of P2P/SHM",
        severity="medium",
        actions=("warn",),
        threshold="any such pair (NCCL_P2P_DISABLE / NCCL_SHM_DISABLE set, or P2P unavailable)",
        citation=_NCCL_ENV,
    ),
    _r(
        id="nccl_timeout",
        family="nccl",
        sources=("nccl-log",),
        signal="PyTorch ProcessGroupNCCL watchdog: 'Watchdog caught collective operation timeout'",
        severity="high",
        actions=("warn",),
        threshold="any timed-out collective on the host",
        citation=_TORCH_WATCHDOG,
    ),
    _r(
        id="smart_status",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal="smartctl_device_smart_status (smart_status.passed) of a SATA / SAS drive",
        severity="high",
        actions=("drain",),
        threshold="0: the drive says it is failing (smartctl -H 'FAILED'); NVMe drives are judged by their "
        "critical-warning bits instead",
        citation=_SMARTCTL,
    ),
    _r(
        id="nvme_critical_warning",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal="smartctl_device_critical_warning bits 0x04 reliability degraded, 0x08 read-only, 0x10 volatile "
        "memory backup failed, 0x20 persistent memory region unreliable",
        severity="critical",
        actions=("drain",),
        threshold="any of those bits set (0x01 and 0x02 are nvme_spare and nvme_temperature)",
        citation=_NVME_LOG,
    ),
    _r(
        id="nvme_spare",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal="smartctl_device_available_spare vs smartctl_device_available_spare_threshold; critical warning 0x01",
        severity="high",
        actions=("drain",),
        threshold="available spare under the threshold the drive reports (or bit 0x01 set)",
        citation=f"{_NVME_LOG}; {_GCM_BLOCKDEV}",
    ),
    _r(
        id="nvme_wear",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal=vocab.SMARTCTL_DEVICE_PERCENTAGE_USED,
        severity="medium",
        actions=("warn", "drain"),
        threshold=">= {nvme_used_warn_pct} % of rated endurance warns, >= {nvme_used_drain_pct} % drains",
        citation=f"{_NVME_LOG}; {_GCM_BLOCKDEV}",
    ),
    _r(
        id="nvme_media_errors",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal="smartctl_device_media_errors (unrecovered data-integrity errors since manufacture)",
        severity="high",
        actions=("warn", "drain"),
        threshold="> 0 warns; grew within the window drains (the drive is losing data now)",
        citation=_NVME_LOG,
    ),
    _r(
        id="nvme_temperature",
        family="storage",
        sources=("smartctl-json", "prometheus"),
        signal="smartctl_device_critical_warning bit 0x02, with smartctl_device_temperature as evidence",
        severity="medium",
        actions=("warn",),
        threshold="bit 0x02 set: the composite temperature passed the drive's own over- or under-temperature threshold",
        citation=_NVME_LOG,
    ),
    _r(
        id="disk_space",
        family="storage",
        sources=("df", "prometheus"),
        signal="node_filesystem_avail_bytes / node_filesystem_size_bytes (df's Available / size) of a local disk's "
        "file system (ext4, xfs, btrfs, zfs... or a /dev/ source; not tmpfs, overlay, squashfs, nfs, lustre, vfat)",
        severity="high",
        actions=("warn", "drain"),
        threshold="under {disk_free_warn_pct} % available warns, under {disk_free_drain_pct} % drains (mounts "
        "{filesystem_skip_mounts} left alone)",
        citation=f"{_NODE_MIXIN_FS}; {_DF}",
    ),
    _r(
        id="disk_inodes",
        family="storage",
        sources=("df", "prometheus"),
        signal="node_filesystem_files_free / node_filesystem_files (df -i IFree / Inodes) of a local disk's file "
        "system",
        severity="high",
        actions=("warn", "drain"),
        threshold="under {inodes_free_warn_pct} % of inodes free warns, under {inodes_free_drain_pct} % drains "
        "(no file can be created, whatever space is left)",
        citation=f"{_NODE_MIXIN_FS}; {_DF}",
    ),
    _r(
        id="memory_uncorrected",
        family="memory",
        sources=("edac", "prometheus"),
        signal="node_edac_uncorrectable_errors_total of a memory controller (EDAC ue_count, edac-util "
        "'Uncorrected Errors')",
        severity="critical",
        actions=("drain",),
        threshold="> 0 uncorrected memory errors since the counters were reset (boot): data was lost, the DIMM "
        "is failing",
        citation=f"{_EDAC_SYSFS}; {_MCELOG_DIMM}",
    ),
    _r(
        id="memory_corrected",
        family="memory",
        sources=("edac", "prometheus"),
        signal="node_edac_correctable_errors_total of a memory controller (EDAC ce_count, edac-util "
        "'Corrected Errors'), the worst DIMM or rank as evidence",
        severity="medium",
        actions=("warn",),
        threshold=">= {edac_ce_warn} corrected memory errors on one controller since the counters were reset "
        "(ECC fixed them; a DIMM that keeps needing it is wearing out)",
        citation=f"{_EDAC_SYSFS}; {_MCELOG_DIMM}",
    ),
    _r(
        id="pcie_width",
        family="pcie",
        sources=("lspci-vv", "nvidia-smi-xml", "nvidia-smi-q", "nvidia-smi-csv", "prometheus"),
        signal="pcie_link_width vs pcie_link_width_max (LnkSta vs LnkCap Width) of GPUs (vendor 10de, VGA / 3D "
        "controller) and HCAs (vendor 15b3); a GPU's own DCGM_FI_DEV_PCIE_LINK_WIDTH vs _MAX_LINK_WIDTH (nvidia-smi "
        "-q's GPU Link Info > Link Width, dcgm-exporter) beside its DCGM_FI_DEV_GPU_UTIL",
        severity="high",
        actions=("warn", "drain"),
        threshold="fewer lanes trained than the device is capable of (x8 of x16 halves its bandwidth; x0: link down) "
        "drains an HCA, and a GPU whose link is down; a GPU lspci finds narrow drains only when its utilisation as "
        "lspci read it is >= {pcie_busy_util_pct} % (or its own report finds the link narrow under load), else warns "
        "(idle or unknown: the link may be power-managed); the GPU's own report is judged at "
        ">= {pcie_busy_util_pct} % utilisation only; a GPU both sources find narrow is one check",
        citation=f"{_PCIE_LINK}; {_GCM_PCI}; {_NVSMI_PCIE} (the real idle NVIDIA L4 of tests/data/nvidia_smi reads "
        "x8 of x16)",
    ),
    _r(
        id="pcie_speed",
        family="pcie",
        sources=("lspci-vv",),
        signal="pcie_link_speed_gts vs pcie_link_speed_max_gts (LnkSta vs LnkCap Speed) of HCAs (vendor 15b3)",
        severity="medium",
        actions=("warn",),
        threshold="an HCA trained under its capable speed (a slot or riser of an older generation gives the same "
        "reading); GPUs are not judged on speed: an idle GPU drops to 2.5 GT/s by design",
        citation=f"{_PCIE_LINK}; {_GCM_PCI}; {_NVSMI_PCIE}",
    ),
    _r(
        id="pcie_gen",
        family="pcie",
        sources=("nvidia-smi-xml", "nvidia-smi-q", "nvidia-smi-csv", "prometheus"),
        signal="DCGM_FI_DEV_PCIE_LINK_GEN vs DCGM_FI_DEV_PCIE_MAX_LINK_GEN (nvidia-smi -q's GPU Link Info > PCIe "
        "Generation Current / Max; Max is what the GPU and its slot both allow) beside DCGM_FI_DEV_GPU_UTIL",
        severity="medium",
        actions=("warn",),
        threshold="a lower generation than Max while the GPU is >= {pcie_busy_util_pct} % busy (an idle GPU drops to "
        "Gen 1 to save power: not judged)",
        citation=f"{_NVSMI_PCIE}; {_DCGM_PCIE}; the utilisation is {_OURS}",
    ),
    _r(
        id="clock_offset",
        family="clock",
        sources=("chronyc-tracking",),
        signal="chrony_tracking_system_time_seconds (System time: the clock's offset from NTP time)",
        severity="medium",
        actions=("warn", "drain"),
        threshold="|offset| >= {clock_offset_warn_s} s warns, >= {clock_offset_drain_s} s drains",
        citation=f"{_CHRONYC}; {_CHRONY_MAKESTEP}; {_MUNGE_TTL}",
    ),
    _r(
        id="clock_unsynchronised",
        family="clock",
        sources=("chronyc-tracking",),
        signal="chrony_tracking_leap_status (Leap status)",
        severity="medium",
        actions=("warn",),
        threshold="'Not synchronised': chrony has no source to steer the clock by, it drifts on its own",
        citation=_CHRONYC,
    ),
    _r(
        id="hung_task",
        family="kernel",
        sources=("kernel-log",),
        signal="kernel_hung_task events: 'INFO: task <comm>:<pid> blocked for more than N seconds.'",
        severity="medium",
        actions=("warn",),
        threshold="any in the window (a task in D state past kernel.hung_task_timeout_secs, 120 s by default)",
        citation=f"kernel/hung_task.c; {_NPD_KERNEL}; GCM check_dstate (processes stuck in D state)",
    ),
    _r(
        id="oom_kill",
        family="kernel",
        sources=("kernel-log",),
        signal="kernel_oom_kill events: 'Killed process <pid> (<comm>)', 'Memory cgroup out of memory'",
        severity="low",
        actions=("warn",),
        threshold="any in the window (a job's cgroup limit or the whole node ran out of memory; the job died, "
        "the node may be fine)",
        citation=f"mm/oom_kill.c; {_NPD_KERNEL}",
    ),
    _r(
        id="hw_error",
        family="kernel",
        sources=("kernel-log",),
        signal="kernel_hw_error events: '[Hardware Error]: event severity: ...' (APEI GHES / UEFI CPER), "
        "'EDAC MCn: k CE|UE ...', x86 machine checks 'mce: [Hardware Error]: CPU n: Machine Check: ... Bank b: "
        "<MCi_STATUS>' and 'Machine check events logged'",
        severity="high",
        actions=("warn", "drain"),
        threshold="corrected or recoverable warns (a machine check whose status has UC = 0, or 'events logged'); "
        "fatal or uncorrected drains (MCi_STATUS UC, bit 61, or PCC, bit 57, set)",
        citation=f"{_KERNEL_RAS}; {_NPD_KERNEL}; {_MCI_STATUS}",
    ),
    _r(
        id="nic_driver",
        family="kernel",
        sources=("kernel-log",),
        signal="kernel_nic_error events: mlx5_core lines of a ConnectX HCA ('... timeout. Will cause a leak of a "
        "command resource', 'device's health compromised - reached miss count', 'mlx5_load_one failed', "
        "'TX timeout detected', 'Detected insufficient power on the PCIe slot', ...)",
        severity="high",
        actions=("warn", "drain"),
        threshold="a fatal pattern (firmware command timeout, lost health heartbeat, unrecoverable hardware "
        "error, a failed probe) drains; a degraded one (TX/RX timeout, slot power, module temperature, cable, "
        "ACCESS_REG) warns",
        citation=f"{_NVSENTINEL_NIC} (fatal and non-fatal mlx5_core patterns); a failed probe is ours: the node's "
        "jobs lose that HCA",
    ),
    _r(
        id="failed_units",
        family="services",
        sources=("systemctl-json",),
        signal="systemd_unit_failed (units whose active state is 'failed')",
        severity="medium",
        actions=("warn", "drain"),
        threshold="any failed unit warns; a failed unit of {critical_units} drains",
        citation=f"{_SERVICES}; the list of units the node needs is {_OURS}",
    ),
    _r(
        id="ipmi_sel",
        family="bmc",
        sources=("ipmitool-sel",),
        signal="ipmi_sel events (ipmitool sel elist): sensor, event, Asserted / Deasserted",
        severity="high",
        actions=("warn", "drain"),
        threshold="an asserted entry in the window: GCM's critical events, Uncorrectable ECC or a Power Supply "
        "failure drain; Correctable ECC or a sensor past its Upper / Lower Critical threshold warns",
        citation=f"{_GCM_SEL}; {_IPMI_SPEC}",
    ),
    _r(
        id="bmc_sensor",
        family="bmc",
        sources=("ipmitool-sdr",),
        signal="ipmi_sensor_status (ipmitool sdr list / elist / sensor: the BMC's status of each sensor -- "
        "temperatures, fans, voltages, PSU readings -- against the thresholds in its own SDR)",
        severity="high",
        actions=("warn", "drain"),
        threshold="the sensor's newest status: non-critical (nc, lnc / unc) warns; critical (cr, lcr / ucr) or "
        "non-recoverable (nr, lnr / unr) drains; the thresholds are the BMC's, not ours",
        citation=_IPMI_THRESHOLDS,
    ),
    _r(
        id="bmc_psu_fan",
        family="bmc",
        sources=("ipmitool-sdr",),
        signal="ipmi_sensor_status label 'states' of a power supply or fan sensor (ipmitool sdr elist: the "
        "asserted discrete states, such as 'Presence detected, Failure detected')",
        severity="high",
        actions=("warn", "drain"),
        threshold="Failure detected, AC lost / input lost, Device Absent or Non-Redundant: Insufficient Resources "
        "drains; Predictive failure, AC out-of-range, Config Error, Redundancy Lost / Degraded or any other "
        "Non-Redundant state warns",
        citation=_IPMI_STATES,
    ),
    _r(
        id="driver_mismatch",
        family="fleet",
        sources=("prometheus", "nvidia-smi-xml", "nvidia-smi-q", "amd-device-metrics", "rocm-smi-json"),
        signal="the DCGM_FI_DRIVER_VERSION label (dcgm-exporter, nvidia-smi) or AMD's driver_version label "
        "(device-metrics-exporter, rocm-smi) of each node's GPU samples, grouped by the Slurm partition its jobs "
        "ran in (all nodes one group when the store holds no jobs)",
        severity="medium",
        actions=("warn",),
        threshold="a node whose GPU driver differs from the one most nodes of its partition run (a tie warns "
        "every node)",
        citation=f"{_OURS}: a job spans a partition's nodes; NCCL's own version check across ranks is "
        "nccl_version_mismatch",
    ),
    _r(
        id="firmware_mismatch",
        family="fleet",
        sources=("amd-device-metrics", "nvidia-smi-xml", "nvidia-smi-q"),
        signal="the vbios_version label of device-metrics-exporter's GPU samples (AMD GPU firmware), the "
        "DCGM_FI_DEV_VBIOS_VERSION label of nvidia-smi -q -x's (<vbios_version>), grouped as driver_mismatch groups",
        severity="low",
        actions=("warn",),
        threshold="a node whose GPU VBIOS differs from the one most nodes of its partition run (a tie warns every "
        "node)",
        citation=f"{_AMD_METRICS} (the exporter's vbios_version label); {_NVSMI_Q} (VBIOS Version); comparing it "
        f"is {_OURS}",
    ),
    _r(
        id="kernel_mismatch",
        family="fleet",
        sources=("prometheus",),
        signal="the release label of node-exporter's node_uname_info (uname -r), grouped as driver_mismatch groups",
        severity="medium",
        actions=("warn",),
        threshold="a node whose kernel release differs from the one most nodes of its partition run (a tie warns "
        "every node)",
        citation=f"{_NODE_UNAME}; a kernel differs in its drivers (the GPU driver's and OFED's modules are built for "
        f"it); comparing it is {_OURS}",
    ),
    _r(
        id="cuda_mismatch",
        family="fleet",
        sources=("nvidia-smi-xml", "nvidia-smi-q", "nccl-log"),
        signal="the CUDA version the GPU driver supports: nvidia-smi -q's CUDA Version (<cuda_version>, the "
        "cuda_version label), NCCL's 'cudaDriverVersion 12020' (= 12.2)",
        severity="medium",
        actions=("warn",),
        threshold="a node whose driver's CUDA version differs from its partition's majority (a tie warns every node)",
        citation=f"{_NVSMI_Q} (CUDA Version); {_NCCL_ENV}; comparing it is {_OURS}",
    ),
    _r(
        id="nccl_fleet_mismatch",
        family="fleet",
        sources=("nccl-log",),
        signal="the NCCL version of the newest NCCL_DEBUG=INFO rank log of each host ('NCCL version 2.19.3+cuda12.3')",
        severity="low",
        actions=("warn",),
        threshold="a node whose newest NCCL differs from its partition's majority; judged only where Slurm gives "
        "the partition (a job that brings its own NCCL in a container shows here too; within one job "
        "nccl_version_mismatch judges)",
        citation=f"{_NCCL_ENV}; comparing it across a partition is {_OURS}",
    ),
    _r(
        id="ofed_mismatch",
        family="fleet",
        sources=("ofed-info",),
        signal="ofed_info -s (MLNX_OFED_LINUX-23.07-0.5.1.2, DOCA-Host's OFED-internal-...), the ofed_info sample's "
        "version label",
        severity="medium",
        actions=("warn",),
        threshold="a node whose OFED differs from its partition's majority (a tie warns every node)",
        citation=f"{_NHC_OFED}; comparing it is {_OURS}",
    ),
    _r(
        id="hca_firmware_mismatch",
        family="fleet",
        sources=("ibstat", "prometheus"),
        signal="each HCA's firmware with its type: ibstat's 'CA type' and 'Firmware version', node-exporter's "
        "node_infiniband_info{hca_type, firmware_version}",
        severity="low",
        actions=("warn",),
        threshold="a node whose HCAs' firmware (per HCA type) differs from its partition's majority (a tie warns "
        "every node)",
        citation=f"ibstat(8); {_NODE_IB}; comparing it is {_OURS}",
    ),
)
HEALTH_RULE_IDS: tuple[HealthRuleId, ...] = tuple(r.id for r in HEALTH_RULES)
if set(HEALTH_RULE_IDS) != set(get_args(HealthRuleId)) or len(set(HEALTH_RULE_IDS)) != len(HEALTH_RULE_IDS):
    raise RuntimeError(
        f"HealthRuleId and HEALTH_RULES differ: {sorted(set(HEALTH_RULE_IDS) ^ set(get_args(HealthRuleId)))}"
    )
_BY_ID: dict[str, HealthRule] = {r.id: r for r in HEALTH_RULES}


def health_rule(rule_id: str) -> HealthRule:
    """The row of ``rule_id``; ``ValueError`` naming the known ids if it has none."""
    try:
        return _BY_ID[rule_id]
    except KeyError:
        raise ValueError(f"unknown health rule {rule_id!r} (known: {', '.join(HEALTH_RULE_IDS)})") from None
