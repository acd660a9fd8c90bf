"""Node health: should this node keep running jobs, be watched, or be drained?

A training job on N nodes runs at the pace of its sickest node, and dies with it.
Health checks look at what the exporters already collect (passive) and at the
results of short benchmarks run between jobs (active), and give each node a
verdict: ``ok``, ``warn`` (watch it, the job may suffer) or ``drain`` (take it out
of the scheduler before it kills the next job). Every check names the rule that
fired and the evidence, so an operator can argue with it.

Passive rules read samples (the store's ``SAMPLE_SCHEMA`` columns: exporters, and the host checks'
captures -- smartctl, lspci, chronyc, systemctl, df, EDAC counters) and events (``xid``, the kernel log's, the BMC's);
active rules read the events of benchmark outputs (``sources.healthtools``) and of NCCL
logs (``analysis.nccl`` judges a job's logs, each of its rules becomes a check on the
hosts it names). Every rule, its signal, threshold, verdicts and source is one row of
``analysis.health_rules.HEALTH_RULES`` (``hpcwatch health --list-rules``); a ``Check``
under an id not in that table is refused.
Thresholds that are ours (not a vendor's) are named ``HealthConfig`` fields.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.analysis.coded import as_text
from hpcwatch.analysis.health_rules import HealthRuleId, health_rule
from hpcwatch.analysis.xid import XID_CATALOG_URL, Verdict, xid_info
from hpcwatch.errors import ConfigError
from hpcwatch.model.catalog import GPUS, gpu_spec, link_spec
from hpcwatch.records import Event
from hpcwatch.vocab import EventKind

__all__ = [
    "Check",
    "NodeHealth",
    "HealthReport",
    "HealthConfig",
    "VERDICTS",
    "PASSIVE_METRICS",
    "KERNEL_EVENT_KINDS",
    "HOST_EVENT_KINDS",
    "THROTTLE_BITS",
    "passive_checks",
    "active_checks",
    "nccl_log_checks",
    "version_checks",
    "FleetSource",
    "FLEET_SOURCES",
    "FLEET_RULES",
    "FLEET_METRICS",
    "PARTITION_ONLY_RULES",
    "judge",
    "health_report",
    "worst",
]

VERDICTS: tuple[Verdict, ...] = ("ok", "warn", "drain")

#: Clock event (throttle) reason bits, nvmlClocksEventReasons / nvmlClocksThrottleReasons.
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: The bits that mean the hardware is too hot or its power delivery is failing (sw_power_cap is normal under load).
BAD_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80

XID = vocab.DCGM_FI_DEV_XID_ERRORS
ECC_DBE = vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
REMAP_FAILURE = vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE
REMAP_UNCORRECTABLE = vocab.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
REMAP_PENDING = vocab.DCGM_FI_DEV_ROW_REMAP_PENDING
PCIE_REPLAY = vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER
THROTTLE = (vocab.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS)
UTIL = vocab.DCGM_FI_DEV_GPU_UTIL
ECC_SBE = vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
#: AMD's XGMI link errors (device-metrics-exporter's WAFL ECC counters) and thermal violation residencies (%).
XGMI_ERRORS = (vocab.GPU_ECC_UNCORRECT_XGMI_WAFL, vocab.GPU_ECC_CORRECT_XGMI_WAFL)
AMD_THERMAL_RESIDENCY: dict[str, str] = {
    vocab.GPU_VIOLATION_SOCKET_THERMAL_RESIDENCY_PERCENTAGE: "socket_thermal",
    vocab.GPU_VIOLATION_VR_THERMAL_RESIDENCY_PERCENTAGE: "vr_thermal",
    vocab.GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE: "hbm_thermal",
    vocab.GPU_VIOLATION_PROCESSOR_HOT_RESIDENCY_PERCENTAGE: "processor_hot",
}
POWER = vocab.DCGM_FI_DEV_POWER_USAGE

#: IB error counters: our rule name -> (perfquery metric, node-exporter metric).
IB_COUNTERS: dict[str, tuple[str, str]] = {
    "link_downed": ("ib_LinkDownedCounter", vocab.NODE_INFINIBAND_LINK_DOWNED_TOTAL),
    "symbol_errors": ("ib_SymbolErrorCounter", "node_infiniband_symbol_error_total"),
    "rcv_errors": ("ib_PortRcvErrors", vocab.NODE_INFINIBAND_PORT_ERRORS_RECEIVED_TOTAL),
    "link_error_recovery": ("ib_LinkErrorRecoveryCounter", vocab.NODE_INFINIBAND_LINK_ERROR_RECOVERY_TOTAL),
    "local_link_integrity_errors": ("ib_LocalLinkIntegrityErrors", "node_infiniband_local_link_integrity_errors_total"),
    "excessive_buffer_overrun_errors": (
        "ib_ExcessiveBufferOverrunErrors",
        "node_infiniband_excessive_buffer_overrun_errors_total",
    ),
}

#: ibstat's port samples (sources/infiniband.py; labels node, device, port, state, physical_state, link_layer).
IB_PORT_METRICS = (vocab.IB_PORT_UP, vocab.IB_PORT_RATE_GBPS)
#: ibstat's panic on an HCA it could not stat (labels node, device, error).
IB_DEVICE_METRICS = (vocab.IB_DEVICE_UP,)

#: smartctl's drive samples (sources/smartctl.py, or smartctl_exporter's scrape; labels node, device...).
SMART_STATUS = vocab.SMARTCTL_DEVICE_SMART_STATUS
NVME_WARNING = vocab.SMARTCTL_DEVICE_CRITICAL_WARNING
NVME_SPARE = vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE
NVME_SPARE_THRESHOLD = vocab.SMARTCTL_DEVICE_AVAILABLE_SPARE_THRESHOLD
NVME_USED = vocab.SMARTCTL_DEVICE_PERCENTAGE_USED
NVME_MEDIA_ERRORS = vocab.SMARTCTL_DEVICE_MEDIA_ERRORS
DRIVE_TEMPERATURE = vocab.SMARTCTL_DEVICE_TEMPERATURE
STORAGE_METRICS = (
    SMART_STATUS,
    NVME_WARNING,
    NVME_SPARE,
    NVME_SPARE_THRESHOLD,
    NVME_USED,
    NVME_MEDIA_ERRORS,
    DRIVE_TEMPERATURE,
)
#: NVMe SMART / Health log Critical Warning bits (NVM Express Base Specification 2.0, figure "SMART / Health
#: Information Log Page", byte 0); the names smartctl's JSON gives them under ``smart_status.nvme``.
NVME_WARNING_BITS: dict[int, str] = {
    0x01: "spare_below_threshold",
    0x02: "temperature_above_or_below_threshold",
    0x04: "reliability_degraded",
    0x08: "media_read_only",
    0x10: "volatile_memory_backup_failed",
    0x20: "persistent_memory_region_unreliable",
}
#: The bits that mean the drive cannot be trusted with data (nvme_critical_warning drains on them).
NVME_FATAL_MASK = 0x04 | 0x08 | 0x10 | 0x20

#: lspci's PCIe links (sources/lspci.py; labels node, bdf, vendor, device_class, name).
PCIE_METRICS = (
    vocab.PCIE_LINK_SPEED_GTS,
    vocab.PCIE_LINK_SPEED_MAX_GTS,
    vocab.PCIE_LINK_WIDTH,
    vocab.PCIE_LINK_WIDTH_MAX,
)
#: PCI vendor ids and the lspci device classes of the parts the PCIe rules judge (https://pci-ids.ucw.cz/).
PCIE_GPU = ("10de", ("VGA compatible controller", "3D controller"))
PCIE_HCA = ("15b3", ("Infiniband controller", "Ethernet controller", "Network controller"))
#: The GPU's own view of its PCIe link (nvidia-smi -q's "GPU Link Info", dcgm-exporter; labels gpu, pci_bus_id).
GPU_PCIE_METRICS = (
    vocab.DCGM_FI_DEV_PCIE_LINK_GEN,
    vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN,
    vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH,
    vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH,
)
#: Replays per minute past which DCGM's PCIe health watch warns (DCGM_FR_PCI_REPLAY_RATE):
#: DCGM_LIMIT_MAX_PCIREPLAY_RATE, "8 replays per minute is the maximum recommended by RM" (NVIDIA/DCGM's hardware
#: limits header, DCGM_GPU_HARDWARE_LIMITS_H).
DCGM_MAX_PCIE_REPLAYS_PER_MIN = 8.0

#: chronyc tracking's clock samples (sources/chrony.py; labels node, reference, leap).
CLOCK_METRICS = (vocab.CHRONY_TRACKING_SYSTEM_TIME_SECONDS, vocab.CHRONY_TRACKING_LEAP_STATUS)
#: chrony's Leap status value for "Not synchronised" (sources/chrony.LEAP_STATUS).
LEAP_UNSYNCHRONISED = 3

#: The kernel log's events the passive rules judge (sources/kernel_log.py; ``xid`` events are judged by ``xid``).
KERNEL_EVENT_KINDS = (
    EventKind.KERNEL_HUNG_TASK,
    EventKind.KERNEL_OOM_KILL,
    EventKind.KERNEL_HW_ERROR,
    EventKind.KERNEL_NIC_ERROR,
)
_KERNEL_RULES: dict[str, HealthRuleId] = {
    EventKind.KERNEL_HUNG_TASK: "hung_task",
    EventKind.KERNEL_OOM_KILL: "oom_kill",
    EventKind.KERNEL_HW_ERROR: "hw_error",
    EventKind.KERNEL_NIC_ERROR: "nic_driver",
}
#: Events of the host's logs, judged within the window (the kernel log, the BMC's event log).
HOST_EVENT_KINDS = (*KERNEL_EVENT_KINDS, EventKind.IPMI_SEL)
#: BMC event log entries that drain (GCM check_ipmitool's critical patterns; IPMI v2.0 sensor type offsets) and
#: those that warn: (pattern over "sensor | event", verdict), first match wins.
SEL_VERDICTS: tuple[tuple[re.Pattern[str], Verdict], ...] = (
    (re.compile(r"Power Supply.*AC lost"), "drain"),
    (re.compile(r"NVIDIA_MCA_Error"), "drain"),
    (re.compile(r"Uncorrectable (error|ECC)"), "drain"),
    (re.compile(r"Critical Interrupt.*(Bus Fatal Error|PCI SERR)"), "drain"),
    (re.compile(r"Processor.*Throttled"), "drain"),
    (re.compile(r"System Firmwares?.*BIOS corruption detected"), "drain"),
    (re.compile(r"Power Supply.*Failure detected"), "drain"),
    (re.compile(r"Correctable ECC"), "warn"),
    (re.compile(r"(Upper|Lower) Critical going (high|low)"), "warn"),
)

#: ipmitool sdr / sensor samples (sources/ipmitool_sdr.py; labels node, sensor, status, states, entity, unit).
BMC_STATUS = vocab.IPMI_SENSOR_STATUS
#: The BMC's status code (sources/ipmitool_sdr.IPMI_STATUS) -> our verdict: non-critical warns, critical and
#: non-recoverable drain (IPMI v2.0 section 36.3); ok and no reading are no check.
BMC_STATUS_VERDICTS: dict[int, Verdict] = {1: "warn", 2: "drain", 3: "drain"}
_BMC_STATUS_NAMES = {1: "non-critical", 2: "critical", 3: "non-recoverable"}
#: A power supply or fan sensor, by name (``PS1 Status``, ``Power Supplies``, ``PSU2``, ``Fan3B``, ``Fans``) or by
#: IPMI entity id (10 power supply, 19 power unit, 29 fan device, 30 cooling unit).
PSU_FAN_NAME = re.compile(r"(?i)(?:ps\s*\d|psu|p/s|power\s*suppl|pwr\s*supply|fans?\d*[a-z]?|fan\s*\d)")
PSU_FAN_ENTITIES = ("10", "19", "29", "30")
#: Asserted discrete states of a PSU or fan sensor (ipmitool's words for IPMI v2.0 tables 42-2 / 42-3) and their
#: verdict, first match wins.
PSU_FAN_STATES: tuple[tuple[re.Pattern[str], Verdict], ...] = (
    (re.compile(r"Failure detected"), "drain"),
    (re.compile(r"AC lost|input lost"), "drain"),
    (re.compile(r"Device Absent"), "drain"),
    (re.compile(r"Insufficient Resources"), "drain"),
    (re.compile(r"Predictive failure"), "warn"),
    (re.compile(r"out-of-range|Config Error"), "warn"),
    (re.compile(r"Redundancy Lost|Redundancy Degraded|Non-Redundant"), "warn"),
)

#: A hardware error's severity -> our verdict (corrected and recoverable errors were handled; fatal ones were not;
#: "Machine check events logged" says errors reached the MCE log without saying which: watch the node).
_HW_VERDICTS: dict[str, Verdict] = {
    "corrected": "warn",
    "recoverable": "warn",
    "logged": "warn",
    "fatal": "drain",
    "uncorrected": "drain",
}

#: An mlx5_core line's severity -> our verdict (NVSentinel: fatal patterns replace the node, the others warn).
_NIC_VERDICTS: dict[str, Verdict] = {"fatal": "drain", "degraded": "warn"}

#: systemctl's unit samples (sources/systemd_units.py; labels node, unit, load, active, sub).
SERVICE_METRICS = (vocab.SYSTEMD_UNIT_FAILED, vocab.SYSTEMD_UNITS_FAILED)

#: df's (or node_exporter's) file system samples (sources/df.py; labels node, device, mountpoint, fstype).
FILESYSTEM_METRICS = (
    vocab.NODE_FILESYSTEM_SIZE_BYTES,
    vocab.NODE_FILESYSTEM_AVAIL_BYTES,
    vocab.NODE_FILESYSTEM_FILES,
    vocab.NODE_FILESYSTEM_FILES_FREE,
)
#: File system types of local disks, the ones the disk rules judge: pseudo file systems (tmpfs, devtmpfs, overlay,
#: squashfs images always 100 % full, proc...), network and parallel ones (nfs, lustre, gpfs, beegfs: full for the
#: whole cluster, not one node's fault) and the EFI partition (vfat) are left out.
LOCAL_FSTYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs"})

#: EDAC memory error counters (sources/edac.py, or node_exporter's edac collector; labels node, controller).
EDAC_METRICS = (
    vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL,
    vocab.NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL,
    vocab.EDAC_LOCATION_CORRECTABLE_ERRORS_TOTAL,
    vocab.EDAC_LOCATION_UNCORRECTABLE_ERRORS_TOTAL,
)

#: Every metric the passive rules read (fetch these from the store).
PASSIVE_METRICS: tuple[str, ...] = (
    XID,
    ECC_DBE,
    REMAP_FAILURE,
    REMAP_UNCORRECTABLE,
    REMAP_PENDING,
    PCIE_REPLAY,
    *THROTTLE,
    UTIL,
    POWER,
    ECC_SBE,
    *XGMI_ERRORS,
    *AMD_THERMAL_RESIDENCY,
    *(m for pair in IB_COUNTERS.values() for m in pair),
    *IB_PORT_METRICS,
    *IB_DEVICE_METRICS,
    *STORAGE_METRICS,
    *PCIE_METRICS,
    *GPU_PCIE_METRICS,
    *CLOCK_METRICS,
    *SERVICE_METRICS,
    BMC_STATUS,
    *FILESYSTEM_METRICS,
    *EDAC_METRICS,
    # the fleet rules' versions (FLEET_SOURCES): node-exporter's uname and HCA info, ibstat's, ofed_info -s
    vocab.NODE_UNAME_INFO,
    vocab.NODE_INFINIBAND_INFO,
    vocab.OFED_INFO,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthConfig:
    """Thresholds of the rules that are our own choice (vendor facts live in the tables above)."""

    pcie_replay_warn: int = 10
    """PCIe replays in the window that make a warning (a healthy link replays rarely, if ever)."""
    ecc_correctable_warn: int = 100
    """Correctable ECC errors of one GPU in the window that make a warning: each was fixed, but HBM that corrects
    this many is wearing (no vendor publishes a rate; a handful a day is common on a large fleet)."""
    throttle_warn_fraction: float = 0.2
    """Share of samples with a thermal or power-brake throttle bit that makes a warning."""
    link_down_drain: int = 2
    """Link-down events in the window that drain the node (one is a warning)."""
    symbol_error_warn: int = 10
    """Symbol errors in the window that make a warning (a few per day is normal on long copper)."""
    stall_util_pct: float = 90.0
    """Utilisation at or above which a GPU looks busy."""
    stall_power_factor: float = 1.5
    """'Near idle' power: at most this × the catalog's idle power of the GPU model."""
    stall_min_s: float = 60.0
    """How long busy-but-cold must last to be a stalled collective."""
    idle_util_pct: float = 5.0
    """Utilisation at or below which an allocated GPU counts as idle."""
    idle_min_s: float = 600.0
    """How long an allocated GPU must idle to be reported."""
    missing_after_s: float = 60.0
    """A GPU whose last sample is this much older than its node's newest sample has stopped reporting."""
    busbw_warn_fraction: float = 0.6
    """nccl-tests bus bandwidth under this share of the catalog's link figure warns."""
    ib_bw_warn_fraction: float = 0.8
    """ib_write_bw average under this share of the link rate warns."""
    ib_bw_drain_fraction: float = 0.5
    """... and under this share drains."""
    ib_rate_drain_fraction: float = 0.5
    """An Active port whose ibstat rate is under this share of the catalog's link rate drains (under the full rate
    warns): NHC drains on any mismatch; we only warn for one speed step down (NDR port at HDR's 200), which runs,
    slower, and drain further down (100 or less on NDR: a cable or width fault)."""

    nvme_used_warn_pct: float = 80.0
    """NVMe Percentage Used (of rated endurance) that warns: GCM's check_blockdev warns at 80."""
    nvme_used_drain_pct: float = 100.0
    """... and that drains: GCM's critical level, the end of the endurance the vendor rates."""
    critical_units: tuple[str, ...] = (
        "slurmd.service",
        "munge.service",
        "nvidia-fabricmanager.service",
        "nvidia-persistenced.service",
        "openibd.service",
    )
    """systemd units the node cannot run jobs without: one of them failed drains (any other failed unit warns).
    Fabric Manager must run on NVSwitch systems for CUDA to start; slurmd and munge are the scheduler's agent and
    its authentication; openibd loads the InfiniBand stack."""
    pcie_busy_util_pct: float = 50.0
    """GPU utilisation at or above which nvidia-smi's / DCGM's current PCIe generation and width are judged: an
    idle GPU drops its link to save power (nvidia-smi(1): they "may be reduced when the GPU is not in use"), a busy
    one trains back up to its max. Ours: half busy is in use by any reading of NVIDIA's words."""
    clock_offset_warn_s: float = 1.0
    """|System time| offset that warns: chrony's example configurations step the clock past 1 s (makestep 1.0 3)."""
    clock_offset_drain_s: float = 300.0
    """... and that drains: MUNGE's default credential time-to-live, past which Slurm's authentication fails."""
    disk_free_warn_pct: float = 5.0
    """Share of a local file system's space still available under which it warns: node_exporter's mixin alert
    NodeFilesystemAlmostOutOfSpace, warning level (fsSpaceAvailableWarningThreshold)."""
    disk_free_drain_pct: float = 3.0
    """... and under which it drains: the same alert's critical level (fsSpaceAvailableCriticalThreshold)."""
    inodes_free_warn_pct: float = 5.0
    """Share of a local file system's inodes still free under which it warns: the mixin's
    NodeFilesystemAlmostOutOfFiles, warning level."""
    inodes_free_drain_pct: float = 3.0
    """... and under which it drains: the same alert's critical level."""
    filesystem_skip_mounts: tuple[str, ...] = ("/boot", "/boot/efi")
    """Mount points the disk rules leave alone: jobs never write there (a full /boot stops a kernel update, not a
    job)."""
    edac_ce_warn: int = 10
    """Corrected memory errors of one memory controller since its counters were reset that warn: mcelog's
    per-DIMM trigger, ce-error-threshold = 10 / 24h (mcelog.conf)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.clock_offset_warn_s <= self.clock_offset_drain_s:
            raise ConfigError(
                f"clock_offset_warn_s must be in (0, clock_offset_drain_s], got {self.clock_offset_warn_s}"
                f" and {self.clock_offset_drain_s}"
            )
        for warn, drain in (
            ("disk_free_warn_pct", "disk_free_drain_pct"),
            ("inodes_free_warn_pct", "inodes_free_drain_pct"),
        ):
            if not 0.0 <= getattr(self, drain) <= getattr(self, warn) < 100.0:
                raise ConfigError(
                    f"{drain} must be in [0, {warn}] and {warn} under 100, got {getattr(self, drain)}"
                    f" and {getattr(self, warn)}"
                )
        for count in ("edac_ce_warn", "symbol_error_warn", "link_down_drain"):
            if getattr(self, count) < 1:  # 0 would judge every healthy counter
                raise ConfigError(f"{count} must be at least 1, got {getattr(self, count)}")
        if not 0.0 < self.nvme_used_warn_pct <= self.nvme_used_drain_pct:
            raise ConfigError(
                f"nvme_used_warn_pct must be in (0, nvme_used_drain_pct], got {self.nvme_used_warn_pct}"
                f" and {self.nvme_used_drain_pct}"
            )
        if not 0.0 <= self.pcie_busy_util_pct <= 100.0:
            raise ConfigError(f"pcie_busy_util_pct must be in [0, 100], got {self.pcie_busy_util_pct}")
        for name in (
            "throttle_warn_fraction",
            "busbw_warn_fraction",
            "ib_bw_warn_fraction",
            "ib_bw_drain_fraction",
            "ib_rate_drain_fraction",
        ):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1], got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One rule on one node: the verdict, and why."""

    node: str
    rule: HealthRuleId
    """A row of ``HEALTH_RULES``: any other id is refused."""
    verdict: Verdict
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A rule outside the table would drain a node for a reason --list-rules cannot explain.
        row = health_rule(self.rule)
        if self.verdict != "ok" and self.verdict not in row.actions:
            raise ValueError(f"check {self.rule!r}: verdict {self.verdict!r} is not one of its actions {row.actions}")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "verdict": self.verdict, "title": self.title, "evidence": self.evidence}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHealth:
    node: str
    verdict: Verdict
    checks: tuple[Check, ...]
    under_test: str = ""
    """The ``hpcwatch act`` step that put the node under test (``reports.acting.node_checks``): its checks
    decide, so a health check does not drain it for this verdict meanwhile."""

    def reason(self) -> str:
        """One line for ``scontrol ... reason=``: the rules that fired, worst first."""
        if not self.checks:
            return "no data"
        bad = sorted((c for c in self.checks if c.verdict != "ok"), key=lambda c: -VERDICTS.index(c.verdict))
        return "; ".join(f"{c.rule}: {c.title}" for c in bad) or "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "verdict": self.verdict,
            "reason": self.reason(),
            "checks": [c.to_dict() for c in self.checks],
            "under_test": self.under_test or None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthReport:
    nodes: tuple[NodeHealth, ...]

    @property
    def verdict(self) -> Verdict:
        return worst(n.verdict for n in self.nodes)

    @property
    def acted_verdict(self) -> Verdict:
        """The worst verdict of the nodes not ``under_test``: what a health check acts on (a node under
        ``hpcwatch act``'s checks is theirs to decide; draining it would undo the test's own resume)."""
        return worst(n.verdict for n in self.nodes if not n.under_test)

    def node(self, name: str) -> NodeHealth | None:
        return next((n for n in self.nodes if n.node == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "nodes": [n.to_dict() for n in self.nodes]}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    return max(verdicts, key=VERDICTS.index, default="ok")


# -- series from the sample table ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Series:
    """One time series: its host, the GPU index or the port labels, and its points in time order."""

    host: str
    key: str
    labels: dict[str, str]
    job: str | None
    t: np.ndarray
    v: np.ndarray


def _series(table: pa.Table, metrics: str | Sequence[str]) -> list[_Series]:
    """The series of ``metrics`` in ``table``: one per host and GPU (or, without a GPU, per label set), in the order
    of their host and key texts; points in time order, equal times in table order; the labels of its first point
    and the job of its last. Rows without a host are skipped. Grouped by sorting codes (numpy), not row by row in
    Python: a 15-minute window of 128 nodes holds millions of rows. Neither the series nor their order depend on
    the table's row order, but for points at equal times: a window kept between judgements
    (``reports.healthwindow``) holds the rows in another order than one read at once."""
    grouped = _Grouped.of(table, metrics)
    return [] if grouped is None else grouped.every_series()


@dataclass(frozen=True, slots=True)
class _Grouped:
    """The rows of some metrics grouped into series (``_series``), before any ``_Series`` is made: ``order``
    lists the rows group by group, each group in time order, from ``starts[g]`` to ``ends[g]``; ``first_rows``
    and ``last_rows``, each group's first and last point's row."""

    sub: pa.Table
    hosts: pa.DictionaryArray
    keys: pa.DictionaryArray
    t: np.ndarray
    v: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    first_rows: np.ndarray
    last_rows: np.ndarray

    @classmethod
    def of(cls, table: pa.Table, metrics: str | Sequence[str]) -> _Grouped | None:
        return cls.of_rows(_metric_rows(table, [metrics] if isinstance(metrics, str) else metrics))

    @classmethod
    def of_rows(cls, rows: pa.Table) -> _Grouped | None:
        """The series of every row of ``rows`` (already those of the metrics asked: ``_Window``'s slices)."""
        sub = rows.filter(pc.is_valid(rows["host"])) if rows["host"].null_count else rows
        if sub.num_rows == 0:
            return None
        hosts = _codes_of(sub["host"].combine_chunks())
        gpu = sub["gpu"]
        if gpu.null_count == 0:  # GPU metrics: no label text to read
            keyed = gpu
        elif gpu.null_count == len(gpu):  # the others (a coalesce of two dictionaries would unify them first)
            keyed = sub["labels"]
        else:
            keyed = pc.coalesce(gpu, sub["labels"])
        keys = _codes_of(keyed.combine_chunks())
        codes = hosts.indices.to_numpy().astype(np.int64) * len(keys.dictionary) + keys.indices.to_numpy()
        t, v = sub["t"].to_numpy(), sub["value"].to_numpy()
        by_time = np.argsort(t, kind="stable")  # quick when the rows come in time order (a kept window's)
        order = by_time[_stable_order(codes[by_time])]  # grouped by code; each group in time order
        starts = np.flatnonzero(np.diff(codes[order], prepend=-1))
        ends = np.append(starts[1:], order.size)
        return cls(sub, hosts, keys, t, v, order, starts, ends, order[starts], order[ends - 1])

    @property
    def in_order(self) -> np.ndarray:
        """The groups in the order of their host's text, then their key's (GPU index or label set): the order the
        store's ``ORDER BY host, gpu`` gives GPU series, whatever the table's row order."""
        hosts = self.hosts.indices.to_numpy()[self.first_rows]
        keys, key_of_group = np.unique(
            self.keys.indices.to_numpy(zero_copy_only=False)[self.first_rows], return_inverse=True
        )
        return np.lexsort(
            (
                _text_ranks(self.keys.dictionary.take(pa.array(keys)))[key_of_group],
                _text_ranks(self.hosts.dictionary)[hosts],
            )
        )

    def every_series(self) -> list[_Series]:
        """Every group's series, in ``in_order`` (``_series``)."""
        return self.series_of(self.in_order)

    def series_of(self, groups: np.ndarray | Sequence[int]) -> list[_Series]:
        """The series of ``groups``, in that order: their host, key, labels and job taken in one ``take`` per
        column, not one Arrow lookup per series and column (8,192 GPUs a metric at 1,024 nodes: the lookups were a
        sixth of a judgement)."""
        groups = np.asarray(groups, dtype=np.int64)
        first, last = pa.array(self.first_rows[groups]), pa.array(self.last_rows[groups])
        hosts = self.hosts.take(first).to_pylist()
        keys = self.keys.take(first).to_pylist()
        labels = self.sub["labels"].take(first).to_pylist()
        jobs = self.sub["job"].take(last).to_pylist()
        t, v, order, starts, ends = self.t, self.v, self.order, self.starts.tolist(), self.ends.tolist()
        out = []
        for g, host, key, text, job in zip(groups.tolist(), hosts, keys, labels, jobs):
            rows = order[starts[g] : ends[g]]
            out.append(_Series(host=host, key=key, labels=orjson.loads(text or "{}"), job=job, t=t[rows], v=v[rows]))
        return out

    def any(self, rows: np.ndarray) -> np.ndarray:
        """Whether each group holds a row where ``rows`` (a mask over the rows in table order) is true."""
        return np.logical_or.reduceat(rows[self.order], self.starts)

    def names(self) -> list[tuple[str, str]]:
        """Each group's (host, key). From the dictionaries' texts, each decoded once: a dictionary array's
        ``to_pylist`` decodes value by value (8,192 GPUs: 20 ms)."""
        hosts, keys = self.hosts.dictionary.to_pylist(), self.keys.dictionary.to_pylist()
        host_codes = self.hosts.indices.to_numpy()[self.first_rows].tolist()
        key_codes = self.keys.indices.to_numpy(zero_copy_only=False)[self.first_rows].tolist()
        return [(hosts[h], keys[k]) for h, k in zip(host_codes, key_codes)]

    def first_long_runs(self, rows: np.ndarray, min_s: float) -> dict[int, tuple[float, float]]:
        """Group -> the (start, end) times of its first run of rows where ``rows`` (a mask over the rows in table
        order) holds that lasts ``min_s`` at least (``_runs`` of each series, all at once); groups with none are
        left out."""
        held = rows[self.order]
        t = self.t[self.order]
        first = np.zeros(held.size, bool)
        first[self.starts] = True
        last = np.zeros(held.size, bool)
        last[self.ends - 1] = True
        before = np.concatenate([[False], held[:-1]]) & ~first  # the row before, in the same group
        after = np.concatenate([held[1:], [False]]) & ~last
        run_starts = np.flatnonzero(held & ~before)
        run_ends = np.flatnonzero(held & ~after)  # a run's end follows its start, before the next run's
        long = t[run_ends] - t[run_starts] >= min_s
        run_starts, run_ends = run_starts[long], run_ends[long]
        groups = np.searchsorted(self.starts, run_starts, side="right") - 1
        groups, firsts = np.unique(groups, return_index=True)  # runs come in row order: the first of each group
        return {g: (float(t[run_starts[i]]), float(t[run_ends[i]])) for g, i in zip(groups.tolist(), firsts.tolist())}

    def last_jobs(self) -> list[str | None]:
        """Each group's last point's job (``_Series.job``)."""
        jobs: list[str | None] = self.sub["job"].take(pa.array(self.last_rows)).to_pylist()
        return jobs

    def rising(self) -> np.ndarray:
        """Whether each group's counter took a step up in the window (or a reset to a value above 0), for every
        group at once: a fleet's error counters are nearly all flat. Every group whose ``_increase`` is above 0
        is one of these."""
        values = self.v[self.order]
        steps = np.diff(values)
        up = np.where(steps >= 0, steps, values[1:]) > 0  # a drop is a reset: the value after it counts
        up[self.ends[:-1] - 1] = False  # the step from one group's last row to the next group's first
        return np.logical_or.reduceat(np.append(up, False), self.starts)


def _metric_rows(table: pa.Table, names: Sequence[str]) -> pa.Table:
    """The rows of ``table`` of the metrics ``names``, by a filter."""
    return table.filter(pc.is_in(table["metric"], value_set=pa.array(names, type=pa.string())))


def _stable_order(codes: np.ndarray) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` of codes from 0, faster: a radix sort of codes under 2**16 (GPU
    series: 8,192 at 1,024 nodes), else a plain sort of each code joined to its row, which is unique (numpy's
    vectorised sort: 5 M rows 0.23 → 0.10 s)."""
    if codes.size == 0:
        return np.arange(0)
    top = int(codes.max())
    if top < 2**16:
        return np.argsort(codes.astype(np.uint16), kind="stable")
    if top < np.iinfo(np.int64).max // codes.size - 1:
        keyed = codes.astype(np.int64) * codes.size + np.arange(codes.size)
        keyed.sort()
        return keyed % codes.size
    return np.argsort(codes, kind="stable")


def _codes_of(column: pa.Array) -> pa.DictionaryArray:
    """``column`` dictionary-encoded, a null as a value of its own (the window's texts may come encoded already:
    ``dictionary_encode`` leaves those as they are, their nulls as null codes)."""
    encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column, null_encoding="encode")
    if encoded.indices.null_count == 0:
        return encoded
    null_code = pa.scalar(len(encoded.dictionary), encoded.indices.type)
    return pa.DictionaryArray.from_arrays(
        pc.fill_null(encoded.indices, null_code),
        pa.concat_arrays([encoded.dictionary, pa.nulls(1, encoded.dictionary.type)]),
    )


def _text_ranks(texts: pa.Array) -> np.ndarray:
    """Each text's rank in ascending order (a null last)."""
    ranks = np.empty(len(texts), dtype=np.int64)
    ranks[pc.array_sort_indices(texts, null_placement="at_end").to_numpy()] = np.arange(len(texts))
    return ranks


class _Window:
    """The samples the passive rules judge, cut by metric once: the rules ask for the series of a metric or
    two about 56 times a judgement, and each used to filter the whole window's table again (millions of rows
    at 1,024 nodes). A table whose rows are grouped by metric (the store's, ordered by metric) is cut into
    slices without a copy; any other is filtered per question, as before. Series asked twice are made once."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._blocks = _metric_blocks(table)
        self._made: dict[tuple[str, ...], list[_Series]] = {}
        self._groups: dict[tuple[str, ...], _Grouped | None] = {}

    def series(self, metrics: str | Sequence[str]) -> list[_Series]:
        """``_series`` of ``metrics`` in the window."""
        names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
        if names not in self._made:
            grouped = self._grouped(names)
            self._made[names] = [] if grouped is None else grouped.every_series()
        return self._made[names]

    def nonzero_series(self, metrics: str | Sequence[str]) -> list[_Series]:
        """The series of ``metrics`` holding a value other than 0, in the order of ``series``: only those are
        made."""
        return self._picked(metrics, lambda grouped: grouped.any(grouped.v != 0), lambda s: bool((s.v != 0).any()))

    def rising_series(self, metrics: str | Sequence[str]) -> list[_Series]:
        """The series of counters ``metrics`` whose increase in the window is above 0 (``_Grouped.rising``), in
        the order of ``series``: only those are made (at 1,024 nodes, 8,192 ports a counter). A negative value
        (garbage) can offset a rise: ``_increase`` has the last word."""
        return self._picked(metrics, _Grouped.rising, lambda s: _increase(s.v) > 0)

    def _picked(
        self,
        metrics: str | Sequence[str],
        may_hold: Callable[[_Grouped], np.ndarray],
        holds: Callable[[_Series], bool],
    ) -> list[_Series]:
        """The series of ``metrics`` that ``holds``, in the order of ``series``, made only for the groups that
        ``may_hold`` (every group at once), or picked from those made already. ``holds`` must be false on a
        series all 0: a window whose values are all 0 is not grouped."""
        names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
        if names in self._made:
            return [s for s in self._made[names] if holds(s)]
        grouped = None if self._all_zero(names) else self._grouped(names)
        if grouped is None:
            return []
        chosen = may_hold(grouped)
        return [s for s in grouped.series_of([g for g in grouped.in_order.tolist() if chosen[g]]) if holds(s)]

    def grouped(self, metrics: str | Sequence[str]) -> _Grouped | None:
        """``metrics``' rows grouped into series, before any is made (a rule that makes only the series that may
        fire: ``_check_gpu_activity``); once per window."""
        return self._grouped((metrics,) if isinstance(metrics, str) else tuple(metrics))

    def _grouped(self, names: tuple[str, ...]) -> _Grouped | None:
        """``names``' rows grouped: from their slices (no filter of the window) when the metrics are in blocks."""
        if names not in self._groups:
            self._groups[names] = self._group(names)
        return self._groups[names]

    def _group(self, names: tuple[str, ...]) -> _Grouped | None:
        rows = self._rows(names)
        return None if rows is None else _Grouped.of_rows(rows)

    def _rows(self, names: tuple[str, ...]) -> pa.Table | None:
        """``names``' rows (None: none): their slices when the metrics are in blocks, else a filter."""
        if self._blocks is None:
            return _metric_rows(self.table, names)
        blocks = sorted(self._blocks[n] for n in set(names) if n in self._blocks)  # in table order
        if not blocks:
            return None
        return pa.concat_tables([self.table.slice(start, length) for start, length in blocks])

    def _all_zero(self, names: tuple[str, ...]) -> bool:
        """Whether every value of ``names`` in the window is 0 (a healthy fabric's error counters, a fleet's XID
        gauges): then no series of them need be grouped. A NaN is not 0."""
        if names in self._groups:  # grouped already: nothing to save
            return False
        rows = self._rows(names)
        return rows is None or not pc.any(pc.not_equal(rows["value"], 0.0)).as_py()


def _metric_blocks(table: pa.Table) -> dict[str, tuple[int, int]] | None:
    """Each metric's (first row, rows) when every metric's rows are contiguous in ``table``, else None. From the
    column's runs (run-end encoding: one pass, ~7x faster than dictionary codes over a 1,024-node window)."""
    blocks: dict[str, tuple[int, int]] = {}
    last: str | None = None
    offset = 0
    for chunk in table["metric"].chunks:
        coded = isinstance(chunk, pa.DictionaryArray)  # a kept window's (reports.healthwindow)
        runs = pc.run_end_encode(chunk.indices if coded else chunk)
        names = (chunk.dictionary.take(runs.values) if coded else runs.values).to_pylist()
        begin = 0
        for name, end in zip(names, runs.run_ends.to_numpy().tolist()):
            if name == last:  # the run goes on across a chunk's edge
                first, rows = blocks[name]
                blocks[name] = (first, rows + end - begin)
            elif name in blocks:
                return None  # a metric met again after another: not grouped
            else:
                blocks[name] = (offset + begin, end - begin)
            last, begin = name, end
        offset += len(chunk)
    return blocks


def _increase(v: np.ndarray) -> float:
    """Counter increase over the window, counting a drop as a reset (Prometheus ``increase`` without extrapolation)."""
    if v.size < 2:
        return 0.0
    d = np.diff(v)
    return float(d[d >= 0].sum() + v[1:][d < 0].sum())


def _where(s: _Series) -> dict[str, Any]:
    """How the evidence names the part: a GPU index, or an HCA device and port."""
    if "gpu" in s.labels:
        return {"gpu": s.labels["gpu"]}
    return {k: s.labels[k] for k in ("device", "port", "guid") if k in s.labels} or {"series": s.key}


def _runs(mask: np.ndarray, t: np.ndarray) -> list[tuple[float, float]]:
    """(start, end) times of the runs of True in ``mask``."""
    if not mask.any():
        return []
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(float(t[a]), float(t[b])) for a, b in zip(starts, ends)]


# -- passive rules -----------------------------------------------------------------------------


def _check_xid(table: _Window, events: Sequence[Event]) -> list[Check]:
    seen: dict[tuple[str, str, int], float] = {}
    for s in table.nonzero_series(XID):
        for code in np.unique(s.v[s.v != 0]).astype(int):
            seen.setdefault((s.host, str(s.labels.get("gpu", s.key)), int(code)), float(s.t[np.argmax(s.v == code)]))
    for e in events:
        if e.kind == EventKind.XID and e.attrs.get("node") and e.attrs.get("xid") is not None:
            seen.setdefault((str(e.attrs["node"]), str(e.attrs.get("gpu", "?")), int(e.attrs["xid"])), e.t)
    checks = []
    for (node, gpu, code), t in sorted(seen.items()):
        info = xid_info(code)
        checks.append(
            Check(
                node=node,
                rule="xid",
                verdict=info.verdict,
                title=f"XID {code} on GPU {gpu}: {info.meaning}",
                evidence={
                    "gpu": gpu,
                    "xid": code,
                    "mnemonic": info.mnemonic,
                    "action": info.action,
                    "first_seen": t,
                    "source": XID_CATALOG_URL,
                },
            )
        )
    return checks


def _check_threshold(
    table: _Window,
    metric: str,
    *,
    rule: HealthRuleId,
    verdict: Verdict,
    what: str,
    grew: bool = False,
    min_value: float = 0.0,
) -> list[Check]:
    """A GPU counter or gauge that must stay at zero (or must not grow) in the window."""
    checks = []
    for s in table.series(metric):
        value = _increase(s.v) if grew else float(s.v[-1])
        if value > min_value:
            checks.append(
                Check(
                    node=s.host,
                    rule=rule,
                    verdict=verdict,
                    title=f"{what} on GPU {s.key}",
                    evidence={
                        **_where(s),
                        "metric": metric,
                        "increase" if grew else "value": value,
                        "t_last": float(s.t[-1]),
                    },
                )
            )
    return checks


def _check_pcie_replay(table: _Window, config: HealthConfig) -> list[Check]:
    """A GPU whose PCIe replay counter grew by ``pcie_replay_warn`` in the window (a link retransmitting: signal
    integrity, a riser, a slot). Over any window past 75 s that count is stricter than DCGM's 8 a minute; the
    evidence gives the rate and whether it passed DCGM's limit too (a short window cannot tell a rate)."""
    checks = []
    for s in table.series(PCIE_REPLAY):
        grew = _increase(s.v)
        span_min = float(s.t[-1] - s.t[0]) / 60.0
        per_min = grew / span_min if span_min > 0 else None
        if grew >= config.pcie_replay_warn:
            checks.append(
                Check(
                    node=s.host,
                    rule="pcie_replay",
                    verdict="warn",
                    title=f"PCIe replays on GPU {s.key}: +{grew:.0f} in the window",
                    evidence={
                        **_where(s),
                        "metric": PCIE_REPLAY,
                        "increase": grew,
                        "per_min": per_min,
                        "over_dcgm_limit": per_min is not None and per_min > DCGM_MAX_PCIE_REPLAYS_PER_MIN,
                        "t_last": float(s.t[-1]),
                    },
                )
            )
    return checks


def _check_throttle(table: _Window, config: HealthConfig) -> list[Check]:
    checks = []
    for s in table.series(THROTTLE):
        mask = s.v.astype(np.int64)
        bad = (mask & BAD_THROTTLE_MASK) != 0
        share = float(bad.mean())
        if share >= config.throttle_warn_fraction:
            bits = int(np.bitwise_or.reduce(mask[bad]))
            reasons = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
            checks.append(
                Check(
                    node=s.host,
                    rule="throttle",
                    verdict="warn",
                    title=f"GPU {s.key} throttled ({', '.join(reasons)}) in {share:.0%} of samples",
                    evidence={**_where(s), "reasons": reasons, "share": share, "samples": int(s.v.size)},
                )
            )
    return checks


def _check_ib(table: _Window, config: HealthConfig) -> list[Check]:
    checks = []
    for name, metrics in IB_COUNTERS.items():
        for s in table.rising_series(metrics):  # every rule below needs an increase of at least 1
            inc = _increase(s.v)
            if name == "link_downed":
                if inc >= 1:
                    verdict: Verdict = "drain" if inc >= config.link_down_drain else "warn"
                    checks.append(
                        Check(
                            node=s.host,
                            rule="ib_link",
                            verdict=verdict,
                            title=f"IB link went down {inc:.0f}× ({_port(s)})",
                            evidence={**_where(s), "counter": name, "increase": inc},
                        )
                    )
            elif inc >= (config.symbol_error_warn if name == "symbol_errors" else 1):
                checks.append(
                    Check(
                        node=s.host,
                        rule="ib_errors",
                        verdict="warn",
                        title=f"IB {name.replace('_', ' ')} +{inc:.0f} ({_port(s)})",
                        evidence={**_where(s), "counter": name, "increase": inc},
                    )
                )
    return checks


def _latest_ports(table: _Window) -> dict[tuple[str, str, str], dict[str, _Series]]:
    """(host, device, port) -> metric -> its newest series (the state labels make a new series when it changes)."""
    out: dict[tuple[str, str, str], dict[str, _Series]] = {}
    for metric in IB_PORT_METRICS:
        for s in table.series(metric):
            key = (s.host, str(s.labels.get("device", "")), str(s.labels.get("port", "")))
            slot = out.setdefault(key, {})
            if metric not in slot or s.t[-1] >= slot[metric].t[-1]:
                slot[metric] = s
    return out


def _check_ib_devices(table: _Window) -> list[Check]:
    """An HCA ibstat could not stat (``ib_device_up`` 0) drains its node, unless a later ibstat listed a port
    of it again: the device is gone from the node (unplugged, fallen off the PCIe bus, its driver failed)."""
    seen_at: dict[tuple[str, str], float] = {}
    for s in table.series(vocab.IB_PORT_UP):
        key = (s.host, str(s.labels.get("device", "")))
        seen_at[key] = max(seen_at.get(key, float("-inf")), float(s.t[-1]))
    checks = []
    for s in sorted(table.series(vocab.IB_DEVICE_UP), key=lambda s: (s.host, s.key)):
        device, gone_at = str(s.labels.get("device", "")), float(s.t[-1])
        if s.v[-1] >= 1 or seen_at.get((s.host, device), float("-inf")) > gone_at:
            continue
        error = s.labels.get("error")
        checks.append(
            Check(
                node=s.host,
                rule="ib_port",
                verdict="drain",
                title=f"IB device {device} is gone (ibstat: stat of IB device '{device}' failed: {error})",
                evidence={"device": device, "error": error, "t_last": gone_at},
            )
        )
    return checks


def _check_ib_ports(table: _Window, config: HealthConfig, link_key: str) -> list[Check]:
    """ibstat ports: an InfiniBand port that is not Active/LinkUp, or runs under the catalog's link rate. Ethernet
    ports (RoCE or plain NICs on a VPI card) are not the InfiniBand fabric: not judged here."""
    link = link_spec(link_key)
    checks = []
    for (host, device, port), by_metric in sorted(_latest_ports(table).items()):
        up = by_metric.get(vocab.IB_PORT_UP)
        newest = up or by_metric[vocab.IB_PORT_RATE_GBPS]
        labels = newest.labels
        if labels.get("link_layer", "InfiniBand") not in ("InfiniBand", ""):
            continue
        where = {
            "device": device,
            "port": port,
            "state": labels.get("state"),
            "physical_state": labels.get("physical_state"),
            "t_last": float(newest.t[-1]),
        }
        if up is not None and up.v[-1] < 1:
            disabled = labels.get("physical_state") == "Disabled"
            checks.append(
                Check(
                    node=host,
                    rule="ib_port",
                    verdict="warn" if disabled else "drain",
                    title=f"IB port {device}/{port} is {labels.get('state')} "
                    f"({labels.get('physical_state')})" + (" by an administrator" if disabled else ""),
                    evidence=where,
                )
            )
            continue
        rate = by_metric.get(vocab.IB_PORT_RATE_GBPS)
        if rate is None or link is None:
            continue
        gbps, expected = float(rate.v[-1]), link.rate_bits_s / 1e9
        if gbps < expected:
            verdict: Verdict = "drain" if gbps < config.ib_rate_drain_fraction * expected else "warn"
            checks.append(
                Check(
                    node=host,
                    rule="ib_port",
                    verdict=verdict,
                    title=f"IB port {device}/{port} runs at {gbps:.0f} Gb/s, under {link.name}'s {expected:.0f}",
                    evidence={**where, "rate_gbps": gbps, "link_gbps": expected, "link": link.key},
                )
            )
    return checks


def _port(s: _Series) -> str:
    where = _where(s)
    return " ".join(f"{k} {v}" for k, v in where.items())


def _aligned(util: _Series, power: _Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two series at the times both hold. dcgm-exporter reads a GPU's fields in one pass, so both series
    usually hold the same times: then they are taken as they are (no sort), as ``intersect1d`` would give them
    when neither repeats a time."""
    if util.t.size == power.t.size and np.array_equal(util.t, power.t) and _strictly_rising(util.t):
        return util.t, util.v, power.v
    t, iu, ip = np.intersect1d(util.t, power.t, return_indices=True)
    return t, util.v[iu], power.v[ip]


def _strictly_rising(t: np.ndarray) -> bool:
    return bool(t.size < 2 or (t[1:] > t[:-1]).all())


def _check_amd_throttle(table: _Window, config: HealthConfig) -> list[Check]:
    """AMD MI3xx thermal violation residencies: one warning per GPU whose mean share of the window held down by a
    thermal limit reaches ``throttle_warn_fraction``."""
    held: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for metric, reason in AMD_THERMAL_RESIDENCY.items():
        for s in table.series(metric):
            share = float(np.mean(s.v)) / 100.0
            if share >= config.throttle_warn_fraction:
                held[(s.host, s.key)][reason] = share
    return [
        Check(
            node=host,
            rule="amd_throttle",
            verdict="warn",
            title=f"GPU {gpu} held down by {', '.join(sorted(reasons))} ({max(reasons.values()):.0%} of the window)",
            evidence={"gpu": gpu, "reasons": dict(sorted(reasons.items()))},
        )
        for (host, gpu), reasons in sorted(held.items())
    ]


def _check_gpu_activity(table: _Window, config: HealthConfig) -> list[Check]:
    """A GPU busy at idle power (a hung collective: ``stalled_nccl``) and a job's GPU idle (``idle_allocated``).
    Only the series that may stall are made: a stall needs a busy reading and a power under the stall limit of
    the catalog GPU idling highest. The idle runs of every GPU are found at once (``_Grouped.first_long_runs``):
    at 1,024 nodes thousands of GPUs idle in their jobs, and making and judging their series one by one was a
    third of a judgement."""
    util_grouped = table.grouped(UTIL)
    if util_grouped is None:
        return []
    power_grouped = table.grouped(POWER)
    util_names = util_grouped.names()
    busy = {util_names[g] for g in np.flatnonzero(util_grouped.any(util_grouped.v >= config.stall_util_pct)).tolist()}
    power: dict[tuple[str, str], _Series] = {}
    if power_grouped is not None and busy:
        cold_power = power_grouped.any(power_grouped.v <= config.stall_power_factor * _MOST_IDLE_POWER_W)
        power_names = power_grouped.names()
        # an idle GPU is cold too: only a busy one may be stalled
        cold = [g for g in np.flatnonzero(cold_power).tolist() if power_names[g] in busy]
        power = {(p.host, p.key): p for p in power_grouped.series_of(cold)}
    may_stall = [g for g in util_grouped.in_order.tolist() if util_names[g] in power]
    stalls = {
        g: _stalled(u, power[(u.host, u.key)], config) for g, u in zip(may_stall, util_grouped.series_of(may_stall))
    }
    idle = util_grouped.first_long_runs(util_grouped.v <= config.idle_util_pct, config.idle_min_s)
    jobs = util_grouped.last_jobs()
    checks = []
    for g in util_grouped.in_order.tolist():
        host, key = util_names[g]
        checks += stalls.get(g, [])
        if g in idle and jobs[g]:
            a, b = idle[g]
            checks.append(
                Check(
                    node=host,
                    rule="idle_allocated",
                    verdict="warn",
                    title=f"GPU {key} held by job {jobs[g]} but idle for {b - a:.0f} s",
                    evidence={"gpu": key, "job": jobs[g], "from": a, "to": b},
                )
            )
    return checks


def _stalled(u: _Series, p: _Series, config: HealthConfig) -> list[Check]:
    """GPU ``u``'s first run busy at idle power (``p``: its power) of ``stall_min_s`` at least, if any."""
    spec = gpu_spec(u.labels.get("modelName", "")) if u.labels.get("modelName") else None
    if spec is None:
        return []
    t, util, watts = _aligned(u, p)
    cold = watts <= config.stall_power_factor * spec.idle_power_w
    long = [(a, b) for a, b in _runs((util >= config.stall_util_pct) & cold, t) if b - a >= config.stall_min_s]
    if not long:
        return []
    a, b = long[0]
    evidence = {"gpu": u.key, "from": a, "to": b, "max_power_w": float(watts[(t >= a) & (t <= b)].max())}
    evidence |= {"idle_power_w": spec.idle_power_w, "model": spec.name}
    title = f"GPU {u.key} busy at idle power for {b - a:.0f} s (hung collective?)"
    return [Check(node=u.host, rule="stalled_nccl", verdict="warn", title=title, evidence=evidence)]


#: The highest idle power of the catalog's GPUs: a power above its stall limit is above any GPU's.
_MOST_IDLE_POWER_W = max(spec.idle_power_w for spec in GPUS.values())


def _check_missing(table: _Window, config: HealthConfig) -> list[Check]:
    """A GPU whose utilisation stopped coming while its node's other GPUs go on reporting. Each GPU's last time
    and its node's newest are taken for every GPU at once, and only the missing GPUs' series are made (making all
    8,192 at 1,024 nodes was a sixth of a judgement, py-spy)."""
    grouped = table.grouped(UTIL)
    if grouped is None:
        return []
    last_t = grouped.t[grouped.last_rows]
    host_of = grouped.hosts.indices.to_numpy()[grouped.first_rows]
    node_newest = np.full(len(grouped.hosts.dictionary), -np.inf)
    np.maximum.at(node_newest, host_of, last_t)
    missing = node_newest[host_of] - last_t > config.missing_after_s
    gone = [g for g in grouped.in_order.tolist() if missing[g]]
    found = list(zip(grouped.series_of(gone), node_newest[host_of[gone]].tolist()))
    return [
        Check(
            node=s.host,
            rule="gpu_missing",
            verdict="drain",
            title=f"GPU {s.key} stopped reporting {newest - s.t[-1]:.0f} s ago",
            evidence={"gpu": s.key, "last_seen": float(s.t[-1]), "node_last_seen": newest},
        )
        for s, newest in found
    ]


def _drive(s: _Series) -> dict[str, Any]:
    return {k: s.labels[k] for k in ("device", "model_name", "serial_number") if s.labels.get(k)} | {
        "t_last": float(s.t[-1])
    }


def _latest_by(table: _Window, metric: str, label: str) -> dict[tuple[str, str], _Series]:
    """(host, the ``label`` naming the part) -> the part's newest series of ``metric``."""
    out: dict[tuple[str, str], _Series] = {}
    for s in table.series(metric):
        key = (s.host, str(s.labels.get(label, s.key)))
        if key not in out or s.t[-1] >= out[key].t[-1]:
            out[key] = s
    return out


def _latest_by_drive(table: _Window, metric: str) -> dict[tuple[str, str], _Series]:
    """(host, device) -> the drive's newest series of ``metric``."""
    return _latest_by(table, metric, "device")


def _check_storage(table: _Window, config: HealthConfig) -> list[Check]:
    """smartctl's drive health: SMART status (SATA/SAS), NVMe critical warning bits, spare, wear, media errors."""
    checks: list[Check] = []
    warnings = _latest_by_drive(table, NVME_WARNING)
    for (host, device), s in sorted(_latest_by_drive(table, SMART_STATUS).items()):
        if s.v[-1] < 1 and (host, device) not in warnings:
            checks.append(
                Check(
                    node=host,
                    rule="smart_status",
                    verdict="drain",
                    title=f"drive {device} SMART status FAILED",
                    evidence=_drive(s),
                )
            )
    temperatures = _latest_by_drive(table, DRIVE_TEMPERATURE)
    spare_thresholds = _latest_by_drive(table, NVME_SPARE_THRESHOLD)
    spare_low_bit: set[tuple[str, str]] = set()
    for (host, device), s in sorted(warnings.items()):
        bits = int(s.v[-1])
        names = [name for bit, name in NVME_WARNING_BITS.items() if bits & bit]
        evidence = {**_drive(s), "critical_warning": bits, "bits": names}
        if bits & NVME_FATAL_MASK:
            fatal = [name for bit, name in NVME_WARNING_BITS.items() if bits & bit & NVME_FATAL_MASK]
            checks.append(
                Check(
                    node=host,
                    rule="nvme_critical_warning",
                    verdict="drain",
                    title=f"NVMe {device} critical warning 0x{bits:02x}: {', '.join(fatal)}",
                    evidence=evidence,
                )
            )
        if bits & 0x02:
            temp = temperatures.get((host, device))
            celsius = float(temp.v[-1]) if temp is not None else None
            checks.append(
                Check(
                    node=host,
                    rule="nvme_temperature",
                    verdict="warn",
                    title=f"NVMe {device} past its temperature threshold"
                    + (f" ({celsius:.0f} °C)" if celsius is not None else ""),
                    evidence={**evidence, "temperature_c": celsius},
                )
            )
        if bits & 0x01:
            spare_low_bit.add((host, device))
    for (host, device), s in sorted(_latest_by_drive(table, NVME_SPARE).items()):
        limit = spare_thresholds.get((host, device))
        spare, threshold = float(s.v[-1]), (float(limit.v[-1]) if limit is not None else None)
        if (threshold is not None and spare < threshold) or (host, device) in spare_low_bit:
            spare_low_bit.discard((host, device))
            checks.append(
                Check(
                    node=host,
                    rule="nvme_spare",
                    verdict="drain",
                    title=f"NVMe {device} spare {spare:.0f} % under its threshold"
                    + (f" {threshold:.0f} %" if threshold is not None else ""),
                    evidence={**_drive(s), "available_spare_pct": spare, "threshold_pct": threshold},
                )
            )
    for host, device in sorted(spare_low_bit):  # the bit without a spare sample
        s = warnings[(host, device)]
        checks.append(
            Check(
                node=host,
                rule="nvme_spare",
                verdict="drain",
                title=f"NVMe {device} spare under its threshold (critical warning bit 0x01)",
                evidence=_drive(s),
            )
        )
    for (host, device), s in sorted(_latest_by_drive(table, NVME_USED).items()):
        used = float(s.v[-1])
        if used >= config.nvme_used_warn_pct:
            verdict: Verdict = "drain" if used >= config.nvme_used_drain_pct else "warn"
            checks.append(
                Check(
                    node=host,
                    rule="nvme_wear",
                    verdict=verdict,
                    title=f"NVMe {device} has used {used:.0f} % of its rated endurance",
                    evidence={**_drive(s), "percentage_used": used},
                )
            )
    for (host, device), s in sorted(_latest_by_drive(table, NVME_MEDIA_ERRORS).items()):
        total, grew = float(s.v[-1]), _increase(s.v)
        if total > 0:
            checks.append(
                Check(
                    node=host,
                    rule="nvme_media_errors",
                    verdict="drain" if grew > 0 else "warn",
                    title=f"NVMe {device}: {total:.0f} media errors"
                    + (f", +{grew:.0f} in the window" if grew > 0 else " (none new in the window)"),
                    evidence={**_drive(s), "media_errors": total, "increase": grew},
                )
            )
    return checks


def _pcie_part(labels: dict[str, str]) -> str | None:
    """``gpu``, ``hca`` or None (a part the PCIe rules do not judge: bridges, audio functions, virtual functions)."""
    vendor, cls, name = labels.get("vendor", ""), labels.get("device_class", ""), labels.get("name", "")
    if vendor == PCIE_GPU[0] and cls in PCIE_GPU[1]:
        return "gpu"
    if vendor == PCIE_HCA[0] and cls in PCIE_HCA[1] and "Virtual Function" not in name:
        return "hca"
    return None


def _check_pcie(table: _Window, config: HealthConfig) -> list[Check]:
    """Degraded PCIe links, as lspci sees them and as the GPU itself reports them (nvidia-smi, dcgm-exporter).

    A GPU both sources find narrower than it can train is one ``pcie_width`` check (lspci's, with
    ``reported_by_gpu``): one link, one finding, whichever tools the node runs."""
    own = _check_gpu_links(table, config)
    narrow_under_load = {_gpu_link_key(c): c for c in own if c.rule == "pcie_width"}
    lspci = _check_lspci_links(table, config, narrow_under_load)
    merged = {(c.node, _bus_id(str(c.evidence["bdf"]))) for c in lspci if c.rule == "pcie_width"}
    return lspci + [c for c in own if c.rule != "pcie_width" or _gpu_link_key(c) not in merged]


def _gpu_link_key(c: Check) -> tuple[str, str]:
    """(node, bus id) of a check on the GPU's own link report."""
    return c.node, _bus_id(str(c.evidence.get("pci_bus_id") or ""))


_BUS_ID_RE = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")


def _bus_id(text: str) -> str:
    """One spelling of a PCI address: nvidia-smi's ``00000000:3B:00.0``, lspci's ``3b:00.0`` or ``0000:3b:00.0``
    -> ``3b:00.0`` (domain 0 left out, as lspci without -D prints it); another domain is kept."""
    m = _BUS_ID_RE.fullmatch(text.strip().lower())
    if m is None:
        return text.strip().lower()
    domain, bus, dev, fn = m.groups()
    where = f"{bus}:{dev}.{fn}"
    return where if not domain or int(domain, 16) == 0 else f"{int(domain, 16):04x}:{where}"


def _value_at(s: _Series | None, t: float, within_s: float) -> float | None:
    """The series' value at ``t`` (its last point at or before it, no older than ``within_s``), else None."""
    if s is None:
        return None
    i = int(np.searchsorted(s.t, t, side="right")) - 1
    return float(s.v[i]) if i >= 0 and t - s.t[i] <= within_s else None


#: The GPU's link rules: (rule, the current reading, the most the GPU and its slot allow).
_GPU_LINK_RULES: tuple[tuple[HealthRuleId, str, str], ...] = (
    ("pcie_width", vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH, vocab.DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH),
    ("pcie_gen", vocab.DCGM_FI_DEV_PCIE_LINK_GEN, vocab.DCGM_FI_DEV_PCIE_MAX_LINK_GEN),
)


def _check_gpu_links(table: _Window, config: HealthConfig) -> list[Check]:
    """The GPU's own link report under load: fewer lanes than it and its slot allow (``pcie_width``), or a lower
    generation (``pcie_gen``). Readings beside an idle or unknown utilisation are not judged (nvidia-smi(1))."""
    latest = {m: _latest_by(table, m, "gpu") for m in GPU_PCIE_METRICS}
    degraded = []
    for rule, metric, capable_metric in _GPU_LINK_RULES:
        for (host, gpu), now in sorted(latest[metric].items()):
            t, current = float(now.t[-1]), float(now.v[-1])
            capable = _value_at(latest[capable_metric].get((host, gpu)), t, config.missing_after_s)
            if capable is not None and current < capable:
                degraded.append((rule, host, gpu, now, t, current, capable))
    if not degraded:  # the utilisation's series (every GPU's) are made only to judge a degraded link
        return []
    busy = _latest_by(table, UTIL, "gpu")
    checks = []
    for rule, host, gpu, now, t, current, capable in degraded:
        util = _value_at(busy.get((host, gpu)), t, config.missing_after_s)
        if util is not None and util >= config.pcie_busy_util_pct:
            checks.append(_gpu_link_check(rule, host, gpu, now, current, capable, util))
    return checks


def _gpu_link_check(
    rule: HealthRuleId, host: str, gpu: str, s: _Series, current: float, capable: float, util: float
) -> Check:
    width = rule == "pcie_width"
    shown = f"x{current:.0f} of x{capable:.0f}" if width else f"Gen {current:.0f} of {capable:.0f}"
    return Check(
        node=host,
        rule=rule,
        verdict="drain" if width else "warn",
        title=f"GPU {gpu} PCIe link {shown} at {util:.0f} % utilisation",
        evidence={
            "gpu": gpu,
            "part": "gpu",
            "pci_bus_id": s.labels.get("pci_bus_id"),
            "name": s.labels.get("modelName"),
            "width" if width else "gen": current,
            "width_max" if width else "gen_max": capable,
            "gpu_util_pct": util,
            "t_last": float(s.t[-1]),
        },
    )


def _check_lspci_links(
    table: _Window, config: HealthConfig, narrow_under_load: Mapping[tuple[str, str], Check]
) -> list[Check]:
    """lspci's links: a GPU or HCA with fewer lanes than it can train, an HCA slower than it can train.
    ``narrow_under_load``: (node, bus id) -> the GPU's own report of a narrow link while busy."""
    latest = {m: _latest_by(table, m, "bdf") for m in PCIE_METRICS}
    util: dict[tuple[str, str], _Series] | None = None  # every GPU's series: made for a narrow GPU link only
    checks = []
    for (host, bdf), width in sorted(latest[vocab.PCIE_LINK_WIDTH].items()):
        part = _pcie_part(width.labels)
        if part is None:
            continue
        where = {"bdf": bdf, "part": part, "name": width.labels.get("name"), "t_last": float(width.t[-1])}
        width_max = latest[vocab.PCIE_LINK_WIDTH_MAX].get((host, bdf))
        lanes = int(width.v[-1])
        if width_max is not None and lanes < int(width_max.v[-1]):
            key = (host, _bus_id(bdf))
            link = _NarrowLink(host=host, where=where, lanes=lanes, capable=int(width_max.v[-1]))
            if part == "gpu" and lanes > 0:
                if util is None:
                    util = {(h, _bus_id(bus)): s for (h, bus), s in _latest_by(table, UTIL, "pci_bus_id").items()}
                checks.append(_narrow_gpu_link(link, util.get(key), narrow_under_load.get(key), config))
            else:
                checks.append(_narrow_link(link, "drain", "", {}))
        speed = latest[vocab.PCIE_LINK_SPEED_GTS].get((host, bdf))
        speed_max = latest[vocab.PCIE_LINK_SPEED_MAX_GTS].get((host, bdf))
        if part == "hca" and speed is not None and speed_max is not None and speed.v[-1] < speed_max.v[-1]:
            gts, capable_gts = float(speed.v[-1]), float(speed_max.v[-1])
            checks.append(
                Check(
                    node=host,
                    rule="pcie_speed",
                    verdict="warn",
                    title=f"HCA {bdf} PCIe link at {gts:g} GT/s of {capable_gts:g}",
                    evidence={**where, "speed_gts": gts, "speed_max_gts": capable_gts},
                )
            )
    return checks


@dataclass(frozen=True, slots=True, kw_only=True)
class _NarrowLink:
    """A device lspci shows trained on fewer lanes than its LnkCap."""

    host: str
    where: dict[str, Any]
    lanes: int
    capable: int


def _narrow_link(link: _NarrowLink, verdict: Verdict, said: str, evidence: dict[str, Any]) -> Check:
    part, bdf = str(link.where["part"]), link.where["bdf"]
    return Check(
        node=link.host,
        rule="pcie_width",
        verdict=verdict,
        title=f"{part.upper()} {bdf} PCIe link x{link.lanes} of x{link.capable}"
        + (" (down)" if link.lanes == 0 else said),
        evidence={**link.where, "width": link.lanes, "width_max": link.capable, **evidence},
    )


def _narrow_gpu_link(link: _NarrowLink, util: _Series | None, own_report: Check | None, config: HealthConfig) -> Check:
    """An NVIDIA GPU lspci finds narrow: an idle GPU may train its link down to save power (nvidia-smi(1): the
    width "may be reduced when the GPU is not in use"; the real idle L4 of tests/data/nvidia_smi reads x8 of x16),
    so it drains only when the GPU was busy as lspci read it (its utilisation then, at or before the reading and
    no older than ``missing_after_s``, at ``pcie_busy_util_pct`` or more), or when its own report says the link
    is narrow under load; otherwise it warns, saying why."""
    if own_report is not None:
        busy = own_report.evidence.get("gpu_util_pct")
        return _narrow_link(link, "drain", f" at {busy:.0f} % utilisation", {"reported_by_gpu": own_report.evidence})
    pct = _value_at(util, float(link.where["t_last"]), config.missing_after_s)
    if pct is not None and pct >= config.pcie_busy_util_pct:
        return _narrow_link(link, "drain", f" at {pct:.0f} % utilisation", {"gpu_util_pct": pct})
    why = (
        f"at {pct:.0f} % utilisation, not busy" if pct is not None else "no utilisation of this GPU beside the reading"
    )
    return _narrow_link(
        link,
        "warn",
        f" ({why}: may be power-managed)",
        {
            "gpu_util_pct": pct,
            "why": f"{why}; an idle GPU may reduce its link width (nvidia-smi(1)): drains when a sample at "
            f">= {config.pcie_busy_util_pct:g} % utilisation corroborates it",
        },
    )


def _newest_by_host(table: _Window, metric: str) -> dict[str, _Series]:
    out: dict[str, _Series] = {}
    for s in table.series(metric):
        if s.host not in out or s.t[-1] >= out[s.host].t[-1]:
            out[s.host] = s
    return out


def _check_clock(table: _Window, config: HealthConfig) -> list[Check]:
    """chronyc tracking: the clock's offset from NTP time, and whether chrony is synchronised at all."""
    checks = []
    for host, s in sorted(_newest_by_host(table, vocab.CHRONY_TRACKING_SYSTEM_TIME_SECONDS).items()):
        offset = float(s.v[-1])
        if abs(offset) >= config.clock_offset_warn_s:
            verdict: Verdict = "drain" if abs(offset) >= config.clock_offset_drain_s else "warn"
            side = "ahead of" if offset > 0 else "behind"
            checks.append(
                Check(
                    node=host,
                    rule="clock_offset",
                    verdict=verdict,
                    title=f"clock {abs(offset):.3g} s {side} NTP time",
                    evidence={"offset_s": offset, "reference": s.labels.get("reference"), "t_last": float(s.t[-1])},
                )
            )
    for host, s in sorted(_newest_by_host(table, vocab.CHRONY_TRACKING_LEAP_STATUS).items()):
        if int(s.v[-1]) == LEAP_UNSYNCHRONISED:
            checks.append(
                Check(
                    node=host,
                    rule="clock_unsynchronised",
                    verdict="warn",
                    title=f"chrony is not synchronised (reference {s.labels.get('reference') or 'none'})",
                    evidence={
                        "leap": s.labels.get("leap"),
                        "reference": s.labels.get("reference"),
                        "t_last": float(s.t[-1]),
                    },
                )
            )
    return checks


def _check_kernel(events: Sequence[Event]) -> list[Check]:
    """The kernel log: hung tasks and OOM kills warn (one check per node and rule, counting them), hardware
    errors warn when corrected and drain when not."""
    grouped: dict[tuple[str, HealthRuleId, Verdict], list[Event]] = defaultdict(list)
    for e in events:
        rule = _KERNEL_RULES.get(e.kind)
        node = e.attrs.get("node")
        if rule is None or not node:
            continue
        severity = str(e.attrs.get("severity"))
        verdicts = _HW_VERDICTS if rule == "hw_error" else _NIC_VERDICTS if rule == "nic_driver" else {}
        verdict = verdicts.get(severity, "warn")
        grouped[(str(node), rule, verdict)].append(e)
    checks = []
    for (node, rule, verdict), found in sorted(grouped.items()):
        first = min(found, key=lambda e: e.t)
        if rule == "hung_task":
            tasks = sorted({f"{e.attrs.get('task')}:{e.attrs.get('pid')}" for e in found})
            title = f"{len(tasks)} task(s) blocked in D state ({', '.join(tasks[:3])})"
        elif rule == "oom_kill":
            procs = sorted({f"{e.attrs.get('process')}:{e.attrs.get('pid')}" for e in found})
            title = f"OOM killer killed {len(procs)} process(es) ({', '.join(procs[:3])})"
        elif rule == "nic_driver":
            patterns = sorted({f"{e.attrs.get('device') or 'mlx5'} {e.attrs.get('pattern')}" for e in found})
            title = f"{len(found)} mlx5_core driver error(s) ({', '.join(patterns[:3])})"
        else:
            severities = sorted({str(e.attrs.get("severity")) for e in found})
            title = f"{len(found)} {'/'.join(severities)} hardware error(s) in the kernel log"
        checks.append(
            Check(
                node=node,
                rule=rule,
                verdict=verdict,
                title=title,
                evidence={
                    "count": len(found),
                    "first_seen": first.t,
                    "first_line": first.attrs.get("message"),
                    "line": first.attrs.get("line"),
                },
            )
        )
    return checks


def _newest_by_filesystem(table: _Window, metric: str) -> dict[tuple[str, str], _Series]:
    """(host, mount point or, without one, the device) -> the file system's newest series of ``metric``."""
    out: dict[tuple[str, str], _Series] = {}
    for s in table.series(metric):
        key = (s.host, str(s.labels.get("mountpoint") or s.labels.get("device") or s.key))
        if key not in out or s.t[-1] >= out[key].t[-1]:
            out[key] = s
    return out


def _judged_filesystem(labels: dict[str, str], config: HealthConfig) -> bool:
    """A local disk's file system: by its type where df -T or the exporter said it, else by its source being a
    block device (loop devices hold squashfs images, full by design)."""
    if labels.get("mountpoint") in config.filesystem_skip_mounts:
        return False
    if labels.get("fstype"):
        return labels["fstype"] in LOCAL_FSTYPES
    device = labels.get("device", "")
    return device.startswith("/dev/") and not device.startswith("/dev/loop")


def _check_filesystems(table: _Window, config: HealthConfig) -> list[Check]:
    """df: a local file system almost out of space or of inodes (node_exporter mixin's levels)."""
    checks = []
    kinds: tuple[tuple[HealthRuleId, str, str, float, float, str], ...] = (
        (
            "disk_space",
            vocab.NODE_FILESYSTEM_AVAIL_BYTES,
            vocab.NODE_FILESYSTEM_SIZE_BYTES,
            config.disk_free_warn_pct,
            config.disk_free_drain_pct,
            "space",
        ),
        (
            "disk_inodes",
            vocab.NODE_FILESYSTEM_FILES_FREE,
            vocab.NODE_FILESYSTEM_FILES,
            config.inodes_free_warn_pct,
            config.inodes_free_drain_pct,
            "inodes",
        ),
    )
    for rule, free_metric, total_metric, warn_pct, drain_pct, what in kinds:
        totals = _newest_by_filesystem(table, total_metric)
        for (host, where), free in sorted(_newest_by_filesystem(table, free_metric).items()):
            total = totals.get((host, where))
            if total is None or total.v[-1] <= 0 or not _judged_filesystem(free.labels, config):
                continue
            free_pct = 100.0 * float(free.v[-1]) / float(total.v[-1])
            if free_pct >= warn_pct:
                continue
            device = free.labels.get("device", where)
            name = where if device == where else f"{where} ({device})"
            checks.append(
                Check(
                    node=host,
                    rule=rule,
                    verdict="drain" if free_pct < drain_pct else "warn",
                    title=f"file system {name}: {free_pct:.1f} % of its {what} free",
                    evidence={
                        **{k: free.labels[k] for k in ("mountpoint", "device", "fstype") if free.labels.get(k)},
                        "free": float(free.v[-1]),
                        "total": float(total.v[-1]),
                        "free_pct": round(free_pct, 3),
                        "t_last": float(free.t[-1]),
                    },
                )
            )
    return checks


def _worst_locations(table: _Window, metric: str, host: str, controller: str) -> list[str]:
    """The controller's locations with errors at their newest reading, most first (which DIMM to replace)."""
    found = [
        (float(s.v[-1]), str(s.labels.get("location")))
        for (h, _), s in _latest_by(table, metric, "location").items()
        if h == host and s.labels.get("controller") == controller and s.v[-1] > 0
    ]
    return [f"{loc}: {n:.0f}" for n, loc in sorted(found, reverse=True)[:3]]


def _check_edac(table: _Window, config: HealthConfig) -> list[Check]:
    """EDAC: any uncorrected memory error drains, corrected ones past mcelog's per-DIMM trigger warn."""
    checks = []
    kinds: tuple[tuple[HealthRuleId, str, str, float, str], ...] = (
        (
            "memory_uncorrected",
            vocab.NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL,
            vocab.EDAC_LOCATION_UNCORRECTABLE_ERRORS_TOTAL,
            1,
            "uncorrected",
        ),
        (
            "memory_corrected",
            vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL,
            vocab.EDAC_LOCATION_CORRECTABLE_ERRORS_TOTAL,
            config.edac_ce_warn,
            "corrected",
        ),
    )
    for rule, metric, location_metric, at_least, what in kinds:
        for (host, controller), s in sorted(_latest_by(table, metric, "controller").items()):
            count, grew = float(s.v[-1]), _increase(s.v)
            if count < at_least:
                continue
            worst = _worst_locations(table, location_metric, host, controller)
            checks.append(
                Check(
                    node=host,
                    rule=rule,
                    verdict="drain" if rule == "memory_uncorrected" else "warn",
                    title=f"memory controller mc{controller}: {count:.0f} {what} errors since its counters' reset"
                    + (f", +{grew:.0f} in the window" if grew > 0 else "")
                    + (f" (most on {worst[0].rsplit(': ', 1)[0]})" if worst else ""),
                    evidence={
                        "controller": controller,
                        "count": count,
                        "increase": grew,
                        "locations": worst,
                        "t_last": float(s.t[-1]),
                    },
                )
            )
    return checks


def _check_units(table: _Window, config: HealthConfig) -> list[Check]:
    """systemctl's failed units, from each node's newest listing: one check per node naming them."""
    newest = _newest_by_host(table, vocab.SYSTEMD_UNITS_FAILED)
    failed: dict[str, list[str]] = defaultdict(list)
    for s in table.series(vocab.SYSTEMD_UNIT_FAILED):
        listing = newest.get(s.host)
        if s.v[-1] >= 1 and (listing is None or s.t[-1] >= listing.t[-1]):
            failed[s.host].append(str(s.labels.get("unit")))
    checks = []
    for host, units in sorted(failed.items()):
        critical = sorted(u for u in units if u in config.critical_units)
        checks.append(
            Check(
                node=host,
                rule="failed_units",
                verdict="drain" if critical else "warn",
                title=f"{len(units)} failed systemd unit(s): {', '.join(sorted(units)[:5])}",
                evidence={"units": sorted(units), "critical": critical},
            )
        )
    return checks


def _check_sel(events: Sequence[Event]) -> list[Check]:
    """The BMC's event log: asserted entries matching ``SEL_VERDICTS``, one check per node and verdict."""
    grouped: dict[tuple[str, Verdict], list[str]] = defaultdict(list)
    for e in events:
        if e.kind != EventKind.IPMI_SEL or not e.attrs.get("node") or e.attrs.get("direction") == "Deasserted":
            continue
        entry = f"{e.attrs.get('sensor')} | {e.attrs.get('event')}"
        verdict = next((v for pattern, v in SEL_VERDICTS if pattern.search(entry)), None)
        if verdict is not None:
            grouped[(str(e.attrs["node"]), verdict)].append(entry)
    return [
        Check(
            node=node,
            rule="ipmi_sel",
            verdict=verdict,
            title=f"BMC event log: {'; '.join(sorted(set(entries))[:3])}",
            evidence={"entries": sorted(set(entries)), "count": len(entries)},
        )
        for (node, verdict), entries in sorted(grouped.items())
    ]


def _check_bmc_sensors(table: _Window) -> list[Check]:
    """ipmitool sdr / sensor: each sensor's newest status, judged by the BMC's own thresholds; one check per node
    and verdict, naming the sensors."""
    grouped: dict[tuple[str, Verdict], list[dict[str, Any]]] = defaultdict(list)
    for (host, sensor), s in sorted(_latest_by(table, BMC_STATUS, "sensor").items()):
        code = int(s.v[-1])
        verdict = BMC_STATUS_VERDICTS.get(code)
        if verdict is not None:
            shown = {k: s.labels[k] for k in ("unit", "entity", *_BMC_THRESHOLDS) if k in s.labels}
            grouped[(host, verdict)].append(
                {
                    "sensor": sensor,
                    "status": s.labels.get("status"),
                    "level": _BMC_STATUS_NAMES[code],
                    **shown,
                    "t_last": float(s.t[-1]),
                }
            )
    return [
        Check(
            node=host,
            rule="bmc_sensor",
            verdict=verdict,
            title=f"{len(found)} BMC sensor(s) {'/'.join(sorted({f['level'] for f in found}))}: "
            + ", ".join(f["sensor"] for f in found[:5]),
            evidence={"sensors": found},
        )
        for (host, verdict), found in sorted(grouped.items())
    ]


_BMC_THRESHOLDS = ("lnr", "lcr", "lnc", "unc", "ucr", "unr")


def _is_psu_or_fan(s: _Series) -> bool:
    entity = str(s.labels.get("entity", "")).partition(".")[0]
    return entity in PSU_FAN_ENTITIES or PSU_FAN_NAME.search(str(s.labels.get("sensor", ""))) is not None


def _check_psu_fan(table: _Window) -> list[Check]:
    """ipmitool sdr elist: the asserted states of each power supply and fan sensor (newest listing)."""
    grouped: dict[tuple[str, Verdict], list[str]] = defaultdict(list)
    for (host, sensor), s in sorted(_latest_by(table, BMC_STATUS, "sensor").items()):
        states = str(s.labels.get("states", ""))
        if not states or not _is_psu_or_fan(s):
            continue
        verdict = next((v for pattern, v in PSU_FAN_STATES if pattern.search(states)), None)
        if verdict is not None:
            grouped[(host, verdict)].append(f"{sensor}: {states}")
    return [
        Check(
            node=host,
            rule="bmc_psu_fan",
            verdict=verdict,
            title=f"power supply / fan: {'; '.join(found[:3])}",
            evidence={"sensors": found},
        )
        for (host, verdict), found in sorted(grouped.items())
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSource:
    """Where a fleet rule finds one component's version: a label of the samples (of ``metric`` only, or of any
    sample carrying it), on nodes whose ``vendor`` label is ``vendor`` when one is given."""

    rule: HealthRuleId
    words: str
    """How a title names the component ("NVIDIA driver")."""
    label: str
    metric: str | None = None
    vendor: str = ""
    prefix_label: str = ""
    """A label whose value prefixes the version (an HCA's type: firmware is compared model by model)."""


#: Every version the fleet rules compare across the nodes of a partition, by rule (``FLEET_RULES``).
FLEET_SOURCES: tuple[FleetSource, ...] = (
    FleetSource(rule="driver_mismatch", words="NVIDIA driver", label=vocab.DCGM_FI_DRIVER_VERSION),  # dcgm-exp., smi
    FleetSource(rule="driver_mismatch", words="AMD GPU driver", label="driver_version", vendor="amd"),
    FleetSource(rule="firmware_mismatch", words="AMD GPU VBIOS", label="vbios_version", vendor="amd"),
    FleetSource(rule="firmware_mismatch", words="NVIDIA GPU VBIOS", label=vocab.DCGM_FI_DEV_VBIOS_VERSION),
    FleetSource(rule="kernel_mismatch", words="kernel", label="release", metric=vocab.NODE_UNAME_INFO),
    FleetSource(rule="cuda_mismatch", words="CUDA (driver)", label="cuda_version"),  # nvidia-smi -q -x
    FleetSource(rule="ofed_mismatch", words="OFED", label="version", metric=vocab.OFED_INFO),  # ofed_info -s
    FleetSource(
        rule="hca_firmware_mismatch",
        words="HCA firmware",
        label="firmware_version",
        metric=vocab.NODE_INFINIBAND_INFO,  # ibstat, node-exporter
        prefix_label="hca_type",
    ),
)
#: The attrs of NCCL's rank events (sources.nccl_log) the fleet rules compare -> the rule comparing them.
NCCL_FLEET_ATTRS: dict[str, HealthRuleId] = {"version": "nccl_fleet_mismatch", "cuda_driver": "cuda_mismatch"}
#: The fleet rules, in the order they are judged.
FLEET_RULES: tuple[HealthRuleId, ...] = tuple(
    dict.fromkeys([*(src.rule for src in FLEET_SOURCES), *NCCL_FLEET_ATTRS.values()])
)
#: Rules judged only among nodes whose partition is known: NCCL comes with the job (a container brings its own),
#: so across a store holding unrelated clusters' logs (or jobs) a difference says nothing about a node.
PARTITION_ONLY_RULES: frozenset[HealthRuleId] = frozenset({"nccl_fleet_mismatch"})
#: Metrics the fleet rules read besides the GPU samples' labels (fetch these too).
FLEET_METRICS: tuple[str, ...] = tuple(dict.fromkeys(src.metric for src in FLEET_SOURCES if src.metric))
_ALL_NODES = "(all nodes)"


def _label_sets(table: pa.Table) -> pa.Table:
    """The distinct (host, metric, labels) of ``table``: a window's millions of samples carry a few label sets
    per node, and the fleet rules read only those."""
    if table.num_rows == 0 or "labels" not in table.column_names:
        return pa.table(
            {
                "host": pa.array([], pa.string()),
                "metric": pa.array([], pa.string()),
                "labels": pa.array([], pa.string()),
            }
        )
    sets = table.select(["host", "metric", "labels"]).group_by(["host", "metric", "labels"]).aggregate([])
    return sets.set_column(2, "labels", as_text(sets["labels"]))  # the rules read the text


def _source_versions(sets: pa.Table, src: FleetSource) -> dict[str, set[str]]:
    """host -> the versions its label sets (``_label_sets``; for a source of any metric, their host and labels only)
    name under ``src`` ("<words> <version>")."""
    out: dict[str, set[str]] = defaultdict(set)
    sub = sets if src.metric is None else sets.filter(pc.equal(sets["metric"], src.metric))  # the cheaper test first
    sub = sub.filter(pc.match_substring(sub["labels"], f'"{src.label}"'))
    for host, raw in zip(sub["host"].to_pylist(), sub["labels"].to_pylist()):
        labels = orjson.loads(raw or "{}")
        version = labels.get(src.label) if host and (not src.vendor or labels.get("vendor") == src.vendor) else None
        if version:
            prefix = f"{labels.get(src.prefix_label)} " if src.prefix_label and labels.get(src.prefix_label) else ""
            out[host].add(f"{src.words} {prefix}{version}")
    return out


def _cuda_from_driver(number: Any) -> str | None:
    """NCCL's ``cudaDriverVersion 12020`` -> ``12.2`` (cudaDriverGetVersion: 1000 × major + 10 × minor)."""
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        return None
    return f"{number // 1000}.{number % 1000 // 10}"


def _nccl_versions(events: Sequence[Event]) -> dict[str, dict[str, set[str]]]:
    """``NCCL_FLEET_ATTRS`` attr -> host -> what its NCCL ranks say: the newest NCCL version (a node runs the jobs
    it is given: its last one speaks for it now), and every CUDA driver version printed."""
    newest: dict[str, tuple[float, str]] = {}
    cuda: dict[str, set[str]] = defaultdict(set)
    for e in events:
        host = e.attrs.get("host")
        if e.kind != EventKind.NCCL_RANK or not host:
            continue
        if e.attrs.get("version") and (str(host) not in newest or e.t >= newest[str(host)][0]):
            newest[str(host)] = (e.t, f"NCCL {e.attrs['version']}")
        if (driver := _cuda_from_driver(e.attrs.get("cuda_driver"))) is not None:
            cuda[str(host)].add(f"CUDA (driver) {driver}")
    return {"version": {host: {version} for host, (_, version) in newest.items()}, "cuda_driver": cuda}


def version_checks(
    samples: pa.Table, partitions: Mapping[str, str] | None = None, events: Sequence[Event] = ()
) -> list[Check]:
    """Nodes of one partition (``partitions``: node -> partition; absent nodes form one group) whose GPU driver,
    GPU VBIOS, kernel, CUDA, NCCL, OFED or HCA firmware differs from the one most of the partition's nodes run
    (``FLEET_SOURCES``; NCCL and CUDA also from ``events``' NCCL ranks). Judged over every node at once: pass
    the samples and events of all hosts, not one node's. One check per odd node (a node's verdict is its own),
    each naming the partition's majority and all its odd nodes."""
    by_rule: dict[HealthRuleId, dict[str, set[str]]] = {rule: defaultdict(set) for rule in FLEET_RULES}
    sets = _label_sets(samples)
    # a GPU's label set is the same under each of its metrics: the sources of any metric read it once
    any_metric = sets.group_by(["host", "labels"]).aggregate([])
    for src in FLEET_SOURCES:
        for host, found in _source_versions(sets if src.metric else any_metric, src).items():
            by_rule[src.rule][host] |= found
    for attr, found_by_host in _nccl_versions(events).items():
        for host, found in found_by_host.items():
            by_rule[NCCL_FLEET_ATTRS[attr]][host] |= found
    checks = []
    for rule, versions in by_rule.items():
        groups: dict[str, list[str]] = defaultdict(list)
        for host in versions:
            groups[(partitions or {}).get(host, _ALL_NODES)].append(host)
        for partition, hosts in sorted(groups.items()):
            if partition == _ALL_NODES and rule in PARTITION_ONLY_RULES:
                continue
            checks += _odd_ones(rule, partition, {h: ",".join(sorted(versions[h])) for h in hosts})
    return checks


def _odd_ones(rule: HealthRuleId, partition: str, mine: dict[str, str]) -> list[Check]:
    """The hosts of one partition whose version differs from the one most of them run (a tie: all of them)."""
    if len(mine) < 2:
        return []
    counts: dict[str, int] = defaultdict(int)
    for version in mine.values():
        counts[version] += 1
    if len(counts) < 2:
        return []
    top = max(counts.values())
    majority = sorted(v for v, n in counts.items() if n == top)
    common = majority[0] if len(majority) == 1 else None
    odd = sorted(host for host, version in mine.items() if version != common)
    shown = ", ".join(odd[:5]) + (f" and {len(odd) - 5} more" if len(odd) > 5 else "")
    where = "the whole fleet" if partition == _ALL_NODES else f"partition {partition}"
    return [
        Check(
            node=host,
            rule=rule,
            verdict="warn",
            title=f"{mine[host]} differs from {where}'s "
            + (f"{common} ({top} of {len(mine)} nodes)" if common else "nodes (" + ", ".join(sorted(counts)) + ")")
            + f"; odd: {shown}",
            evidence={
                "partition": partition,
                "version": mine[host],
                "majority": common,
                "odd_nodes": odd,
                "partition_versions": dict(counts),
            },
        )
        for host in odd
    ]


def passive_checks(
    samples: pa.Table, events: Sequence[Event] = (), *, config: HealthConfig = HealthConfig(), link: str = "ndr"
) -> list[Check]:
    """Every passive rule that fired, over samples (``SAMPLE_SCHEMA`` columns) and ``xid`` events; ``link``: the
    catalog's fabric (``model.catalog.LINKS``) whose rate ibstat ports should run at."""
    window = _Window(samples)
    return [
        *_check_xid(window, events),
        *_check_threshold(
            window, ECC_DBE, rule="ecc_dbe", verdict="drain", what="uncorrectable ECC errors since driver load"
        ),
        *_check_threshold(window, REMAP_FAILURE, rule="row_remap", verdict="drain", what="row remapping failed"),
        *_check_threshold(
            window,
            REMAP_UNCORRECTABLE,
            rule="row_remap",
            verdict="warn",
            what="rows remapped after uncorrectable errors",
            grew=True,
        ),
        *_check_threshold(
            window, REMAP_PENDING, rule="row_remap", verdict="warn", what="row remap pending (reset the GPU)"
        ),
        *_check_pcie_replay(window, config),
        *_check_throttle(window, config),
        *_check_threshold(
            window,
            ECC_SBE,
            rule="ecc_correctable",
            verdict="warn",
            what="correctable ECC errors",
            grew=True,
            min_value=config.ecc_correctable_warn - 1,
        ),
        *_check_threshold(
            window,
            vocab.GPU_ECC_UNCORRECT_XGMI_WAFL,
            rule="xgmi_errors",
            verdict="drain",
            what="uncorrectable XGMI link (WAFL) errors",
        ),
        *_check_threshold(
            window,
            vocab.GPU_ECC_CORRECT_XGMI_WAFL,
            rule="xgmi_errors",
            verdict="warn",
            what="correctable XGMI link (WAFL) errors",
            grew=True,
        ),
        *_check_amd_throttle(window, config),
        *_check_ib(window, config),
        *_check_ib_ports(window, config, link),
        *_check_ib_devices(window),
        *_check_gpu_activity(window, config),
        *_check_missing(window, config),
        *_check_storage(window, config),
        *_check_pcie(window, config),
        *_check_clock(window, config),
        *_check_kernel(events),
        *_check_units(window, config),
        *_check_filesystems(window, config),
        *_check_edac(window, config),
        *_check_sel(events),
        *_check_bmc_sensors(window),
        *_check_psu_fan(window),
    ]


def _rules_with_data(samples: pa.Table, events: Sequence[Event]) -> dict[str, set[HealthRuleId]]:
    """node -> the passive rules that had something to judge there (so 'ok' means 'looked, fine')."""
    metric_rules: dict[str, HealthRuleId] = {
        XID: "xid",
        ECC_DBE: "ecc_dbe",
        REMAP_FAILURE: "row_remap",
        REMAP_UNCORRECTABLE: "row_remap",
        REMAP_PENDING: "row_remap",
        PCIE_REPLAY: "pcie_replay",
        ECC_SBE: "ecc_correctable",
        **dict.fromkeys(XGMI_ERRORS, "xgmi_errors"),
        **dict.fromkeys(AMD_THERMAL_RESIDENCY, "amd_throttle"),
        UTIL: "gpu_missing",
        **dict.fromkeys(THROTTLE, "throttle"),
        **dict.fromkeys(IB_PORT_METRICS + IB_DEVICE_METRICS, "ib_port"),
        SMART_STATUS: "smart_status",
        NVME_WARNING: "nvme_critical_warning",
        NVME_SPARE: "nvme_spare",
        NVME_USED: "nvme_wear",
        NVME_MEDIA_ERRORS: "nvme_media_errors",
        vocab.PCIE_LINK_WIDTH: "pcie_width",
        vocab.PCIE_LINK_SPEED_GTS: "pcie_speed",
        vocab.DCGM_FI_DEV_PCIE_LINK_WIDTH: "pcie_width",
        vocab.DCGM_FI_DEV_PCIE_LINK_GEN: "pcie_gen",
        vocab.CHRONY_TRACKING_SYSTEM_TIME_SECONDS: "clock_offset",
        vocab.CHRONY_TRACKING_LEAP_STATUS: "clock_unsynchronised",
        vocab.SYSTEMD_UNITS_FAILED: "failed_units",
        BMC_STATUS: "bmc_sensor",
        vocab.NODE_FILESYSTEM_AVAIL_BYTES: "disk_space",
        vocab.NODE_FILESYSTEM_FILES_FREE: "disk_inodes",
        vocab.NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL: "memory_uncorrected",
        vocab.NODE_EDAC_CORRECTABLE_ERRORS_TOTAL: "memory_corrected",
    }
    for name, pair in IB_COUNTERS.items():
        for m in pair:
            metric_rules[m] = "ib_link" if name == "link_downed" else "ib_errors"
    out: dict[str, set[HealthRuleId]] = defaultdict(set)
    if samples.num_rows:
        pairs = samples.select(["metric", "host"]).group_by(["metric", "host"]).aggregate([])
        for metric, host in zip(pairs["metric"].to_pylist(), pairs["host"].to_pylist()):
            if host and metric in metric_rules:
                out[host].add(metric_rules[metric])
                if metric == UTIL:
                    out[host].update({"stalled_nccl", "idle_allocated"})
                if metric == NVME_WARNING:
                    out[host].add("nvme_temperature")
                if metric == BMC_STATUS:
                    out[host].add("bmc_psu_fan")
    for e in events:
        if e.kind == EventKind.XID and e.attrs.get("node"):
            out[str(e.attrs["node"])].add("xid")
        if e.kind == EventKind.IPMI_SEL and e.attrs.get("node"):
            out[str(e.attrs["node"])].add("ipmi_sel")
        if e.kind in _KERNEL_RULES and e.attrs.get("node"):
            out[str(e.attrs["node"])].add(_KERNEL_RULES[e.kind])
        if e.kind in _ACTIVE_KINDS and e.attrs.get("node"):
            out[str(e.attrs["node"])].add(_ACTIVE_KINDS[e.kind])
    return out


# -- active rules ----------------------------------------------------------------------------------

_ACTIVE_KINDS: dict[str, HealthRuleId] = {
    "dcgm_diag": "dcgm_diag",
    "nccl_test": "nccl_tests",
    "ib_write_bw": "ib_write_bw",
}
#: A dcgmi diag test's status -> our verdict (a pass is no check).
_DIAG_VERDICTS: dict[str, Verdict] = {"fail": "drain", "warn": "warn"}


def _check_dcgm_diag(e: Event) -> list[Check]:
    node = str(e.attrs.get("node") or "(unknown node)")
    checks = []
    for r in e.attrs.get("results", []):
        status = str(r.get("status", "")).lower()
        verdict = _DIAG_VERDICTS.get(status)
        if verdict is not None:
            checks.append(
                Check(
                    node=node,
                    rule="dcgm_diag",
                    verdict=verdict,
                    title=f"dcgmi diag {r.get('test')} {status} on GPU {r.get('gpu')}",
                    evidence={**r, "level": e.attrs.get("level"), "version": e.attrs.get("version")},
                )
            )
    return checks


def _expected_busbw_gbs(e: Event, link_key: str) -> tuple[float | None, str]:
    """The catalog's figure a healthy run should approach: NVLink in a node, the NICs across nodes."""
    spec = gpu_spec(str(e.attrs.get("gpu_model") or ""))
    if spec is None:
        return None, "unknown GPU model"
    if len(e.attrs.get("hosts") or []) <= 1:
        return spec.nvlink_bandwidth_bytes_s / 2 / 1e9, "NVLink, one direction"
    link = link_spec(link_key)
    return (link.rate_bits_s / 8 / 1e9, f"one {link.name} port per GPU") if link else (None, "unknown link")


def _check_nccl(e: Event, config: HealthConfig, link_key: str) -> list[Check]:
    node = str(e.attrs.get("node") or "(unknown node)")
    rows = e.attrs.get("rows") or []
    checks = []
    wrong = sum(int(r.get("oop_wrong") or 0) + int(r.get("ip_wrong") or 0) for r in rows)
    if wrong:
        checks.append(
            Check(
                node=node,
                rule="nccl_tests",
                verdict="drain",
                title=f"nccl-tests {e.attrs.get('collective')}: {wrong} wrong results",
                evidence={"wrong": wrong, "hosts": e.attrs.get("hosts")},
            )
        )
    bad = [r for r in rows if r.get("busbw_mismatch")]
    if bad:
        checks.append(
            Check(
                node=node,
                rule="nccl_tests",
                verdict="warn",
                title=f"nccl-tests busbw disagrees with algbw × factor on {len(bad)} rows",
                evidence={"rows": [r["size_bytes"] for r in bad][:10]},
            )
        )
    expected, basis = _expected_busbw_gbs(e, link_key)
    if rows and expected:
        top = max(rows, key=lambda r: r["size_bytes"])
        busbw = max(top.get("oop_busbw_gbs") or 0.0, top.get("ip_busbw_gbs") or 0.0)
        if busbw < config.busbw_warn_fraction * expected:
            checks.append(
                Check(
                    node=node,
                    rule="nccl_tests",
                    verdict="warn",
                    title=f"nccl-tests busbw {busbw:.1f} GB/s < {config.busbw_warn_fraction:.0%} of "
                    f"{expected:.0f} GB/s ({basis})",
                    evidence={
                        "size_bytes": top["size_bytes"],
                        "busbw_gbs": busbw,
                        "expected_gbs": expected,
                        "basis": basis,
                    },
                )
            )
    return checks


def _check_ib_write_bw(e: Event, config: HealthConfig, link_key: str) -> list[Check]:
    node = str(e.attrs.get("node") or "(unknown node)")
    link = link_spec(link_key)
    rows = e.attrs.get("rows") or []
    if link is None or not rows:
        return []
    top = max(rows, key=lambda r: r["size_bytes"])
    gbps = float(top["bw_avg_gbps"])
    share = gbps * 1e9 / link.rate_bits_s
    if share >= config.ib_bw_warn_fraction:
        return []
    verdict: Verdict = "drain" if share < config.ib_bw_drain_fraction else "warn"
    return [
        Check(
            node=node,
            rule="ib_write_bw",
            verdict=verdict,
            title=f"ib_write_bw {gbps:.1f} Gb/s on {e.attrs.get('device')} is {share:.0%} of {link.name}",
            evidence={
                "device": e.attrs.get("device"),
                "size_bytes": top["size_bytes"],
                "bw_avg_gbps": gbps,
                "link_gbps": link.rate_bits_s / 1e9,
            },
        )
    ]


def nccl_log_checks(
    events: Sequence[Event],
    *,
    ib_hosts: frozenset[str] = frozenset(),
    job_of: Callable[[Sequence[Event]], str | None] | None = None,
) -> list[Check]:
    """The NCCL log rules (``analysis.nccl``) as per-host checks, judged job by job (``nccl_jobs``: logs of
    unrelated jobs are never compared); watchdog timeouts warn on their host. ``ib_hosts``: the hosts
    the store knows have HCAs (a Socket transport of theirs is a fallback)."""
    from hpcwatch.analysis.nccl import NcclConfig, nccl_jobs, nccl_rules, summarize_nccl

    config = NcclConfig(ib_hosts=ib_hosts)
    jobs = nccl_jobs([e for e in events if e.kind == EventKind.NCCL_RANK], job_of)
    checks = [
        Check(node=host, rule=r.rule, verdict=r.verdict, title=r.title, evidence=dict(r.evidence))
        for job in jobs
        for r in nccl_rules(summarize_nccl([dict(e.attrs) for e in job]), config=config)
        for host in r.hosts
    ]
    for e in events:
        if e.kind == EventKind.NCCL_TIMEOUT and e.attrs.get("node"):
            checks.append(
                Check(
                    node=str(e.attrs["node"]),
                    rule="nccl_timeout",
                    verdict="warn",
                    title=f"collective {e.attrs.get('op')} seq {e.attrs.get('seq')} timed out",
                    evidence=dict(e.attrs),
                )
            )
    return checks


def active_checks(
    events: Sequence[Event],
    *,
    config: HealthConfig = HealthConfig(),
    link: str = "ndr",
    nccl_checks: Sequence[Check] | None = None,
) -> list[Check]:
    """Judge dcgmi diag, nccl-tests and ib_write_bw results (``sources.healthtools`` events), and NCCL logs
    (``nccl_checks``: those already judged over the whole job, when ``events`` are one node's)."""
    checks: list[Check] = list(nccl_checks) if nccl_checks is not None else nccl_log_checks(events)
    for e in events:
        if e.kind == EventKind.DCGM_DIAG:
            checks += _check_dcgm_diag(e)
        elif e.kind == EventKind.NCCL_TEST:
            checks += _check_nccl(e, config, link)
        elif e.kind == EventKind.IB_WRITE_BW:
            checks += _check_ib_write_bw(e, config, link)
    return checks


_NO_SAMPLES = pa.table({"metric": pa.array([], pa.string()), "host": pa.array([], pa.string())})


# -- verdicts --------------------------------------------------------------------------------------


def judge(
    checks: Sequence[Check], *, samples: pa.Table | None = None, events: Sequence[Event] = (), nodes: Iterable[str] = ()
) -> HealthReport:
    """One verdict per node: the worst of its checks; rules that looked and found nothing are listed as ``ok``."""
    looked = _rules_with_data(samples if samples is not None else _NO_SAMPLES, events)
    by_node: dict[str, list[Check]] = defaultdict(list)
    for c in checks:
        by_node[c.node].append(c)
    names = sorted(set(by_node) | set(looked) | set(nodes))
    out = []
    for node in names:
        fired = by_node.get(node, [])
        fired_rules = {c.rule for c in fired}
        quiet = [
            Check(node=node, rule=r, verdict="ok", title="nothing found")
            for r in sorted(looked.get(node, set()) - fired_rules)
        ]
        all_checks = tuple(sorted(fired, key=lambda c: -VERDICTS.index(c.verdict)) + quiet)
        out.append(NodeHealth(node=node, verdict=worst(c.verdict for c in fired), checks=all_checks))
    return HealthReport(nodes=tuple(out))


def health_report(
    samples: pa.Table,
    events: Sequence[Event] = (),
    *,
    config: HealthConfig = HealthConfig(),
    link: str = "ndr",
    nodes: Iterable[str] = (),
    nccl_checks: Sequence[Check] | None = None,
    fleet_checks: Sequence[Check] | None = None,
    partitions: Mapping[str, str] | None = None,
) -> HealthReport:
    """Passive and active rules, then one verdict per node: what views call.

    ``samples``: the store's ``SAMPLE_SCHEMA`` table (fetch ``PASSIVE_METRICS``); ``events``: ``xid``
    events and the ``sources.healthtools`` results. ``nccl_checks``: ``nccl_log_checks`` of every host's
    NCCL events, for a caller that passes one node's ``events`` (the NCCL rules compare hosts: a host
    alone cannot be told it is the one without HCAs or on another NCCL version). ``fleet_checks``: likewise
    ``version_checks`` of every host (else computed from ``samples``, grouped by ``partitions``).
    """
    checks = passive_checks(samples, events, config=config, link=link) + active_checks(
        events, config=config, link=link, nccl_checks=nccl_checks
    )
    checks += list(fleet_checks) if fleet_checks is not None else version_checks(samples, partitions, events)
    return judge(checks, samples=samples, events=events, nodes=nodes)
