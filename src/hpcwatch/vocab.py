"""Names that travel between layers: the kinds of ``Event`` and the metric names of ``Sample``.

A reader writes them, an analysis or a detector reads them, the twin writes them
again: a typo in one place would be a silent empty result in another, so every
module names them through these constants. Metric constants are the metric's own
name in capitals (``DCGM_FI_DEV_GPU_UTIL``, ``NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL``),
so grepping for either finds both. ``tests/unit/test_vocab.py`` checks that no module
spells one as a string literal.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["EventKind", "EVENT_KINDS", "EventKindName", "METRICS"]

EventKindName = Literal[
    "xid",
    "gpu_xid",
    "gpu_process",
    "failure",
    "checkpoint",
    "checkpoint_save",
    "checkpoint_restore",
    "job_start",
    "job_end",
    "falco",
    "tetragon",
    "shard_check",
    "shard_manifest",
    "osv_advisory",
    "pip_package",
    "pth_file",
    "opensm_partitions",
    "nvidia_params",
    "dcgm_diag",
    "nccl_test",
    "ib_write_bw",
    "nccl_rank",
    "nccl_warn",
    "nccl_timeout",
    "kernel_hung_task",
    "kernel_oom_kill",
    "kernel_hw_error",
    "kernel_nic_error",
    "ipmi_sel",
    "flight_recorder_dump",
    "nccl_inspector",
    "slurm_config",
    "health_verdict",
    "assessment",
    "agent_check",
    "act_action",
    "act_undo",
    "auth_login",
    "auth_login_failed",
    "auth_lockout",
    "auth_logout",
    "hook_enter",
    "live_straggler",
    "live_hang",
    "live_dump",
    "live_trace",
    "live_refused",
    "access_job",
    "access_finding",
    "active_run",
    "active_result",
]


class EventKind:
    """``Event.kind`` values, by who writes them."""

    # GPUs (kernel log, nvidia-smi)
    XID: Final = "xid"
    GPU_XID: Final = "gpu_xid"
    GPU_PROCESS: Final = "gpu_process"
    # the kernel log (sources/kernel_log.py): hung tasks, OOM kills, machine-check / EDAC / CPER errors
    KERNEL_HUNG_TASK: Final = "kernel_hung_task"
    KERNEL_OOM_KILL: Final = "kernel_oom_kill"
    KERNEL_HW_ERROR: Final = "kernel_hw_error"
    KERNEL_NIC_ERROR: Final = "kernel_nic_error"
    """An ``mlx5_core`` driver line that says the HCA's firmware or driver failed (a command timeout, a lost
    health heartbeat, a probe that failed) or is degraded (a TX/RX timeout, low slot power, a hot module)."""
    # the BMC's System Event Log (sources/ipmitool.py)
    IPMI_SEL: Final = "ipmi_sel"
    # training jobs (the twin, the hook, Slurm)
    FAILURE: Final = "failure"
    CHECKPOINT: Final = "checkpoint"
    CHECKPOINT_SAVE: Final = "checkpoint_save"
    CHECKPOINT_RESTORE: Final = "checkpoint_restore"
    JOB_START: Final = "job_start"
    JOB_END: Final = "job_end"
    # security logs and inputs
    FALCO: Final = "falco"
    TETRAGON: Final = "tetragon"
    SHARD_CHECK: Final = "shard_check"
    SHARD_MANIFEST: Final = "shard_manifest"
    OSV_ADVISORY: Final = "osv_advisory"
    PIP_PACKAGE: Final = "pip_package"
    PTH_FILE: Final = "pth_file"
    OPENSM_PARTITIONS: Final = "opensm_partitions"
    NVIDIA_PARAMS: Final = "nvidia_params"
    # active health checks
    DCGM_DIAG: Final = "dcgm_diag"
    NCCL_TEST: Final = "nccl_test"
    IB_WRITE_BW: Final = "ib_write_bw"
    # the ML stack's own logs: NCCL_DEBUG=INFO, PyTorch's Flight Recorder, NCCL Inspector
    NCCL_RANK: Final = "nccl_rank"
    NCCL_WARN: Final = "nccl_warn"
    NCCL_TIMEOUT: Final = "nccl_timeout"
    FLIGHT_RECORDER_DUMP: Final = "flight_recorder_dump"
    NCCL_INSPECTOR: Final = "nccl_inspector"
    # scheduler configuration (scontrol show config)
    SLURM_CONFIG: Final = "slurm_config"
    # scheduled work of hpcwatch collect (collect/schedule.py)
    HEALTH_VERDICT: Final = "health_verdict"
    AGENT_CHECK: Final = "agent_check"
    """One host check a node's agent ran (collect/agent.py): node, check, command, format, exit status,
    duration, whether its output was cut or timed out, and what the centre's reader made of it."""
    ASSESSMENT: Final = "assessment"
    """The scheduled assessment's verdict (reports/assess.assessment_event): tier, per-category tiers."""
    # policies that act (hpcwatch act, act/audit.py): the audit trail
    ACT_ACTION: Final = "act_action"
    """One action of a policy (a warning, a hold, a cancel, a reservation, a resume, a drain, a check job):
    id, policy, step, who, why, evidence, argv, rc, undo (argv) or undo_note (why none)."""
    ACT_UNDO: Final = "act_undo"
    """An action undone by ``hpcwatch act undo ID``: of (the action's id), who, argv, rc."""
    # who logged in (access/identity.py): user, address, and via/roles, why (bad, locked, rate, unavailable)
    AUTH_LOGIN: Final = "auth_login"
    AUTH_LOGIN_FAILED: Final = "auth_login_failed"
    AUTH_LOCKOUT: Final = "auth_lockout"
    """A user locked out after ``[login] lockout_failures`` failures in a row, for ``minutes``."""
    AUTH_LOGOUT: Final = "auth_logout"
    # the training hook's live stream (sources/livehook.py) and its collector (collect/live.py)
    HOOK_ENTER: Final = "hook_enter"
    """A rank began a phase (job, rank, step, phase, collective): where a rank that stops advancing stopped."""
    LIVE_STRAGGLER: Final = "live_straggler"
    """A running job's straggler, named from its last steps (job, rank, node, gpu, phase, score, steps)."""
    LIVE_HANG: Final = "live_hang"
    """A running job no rank of which advanced for ``hang_after_s`` (job, step, stalled_s, where each rank
    stopped: phase and collective), and the Flight Recorder dump asked for."""
    LIVE_DUMP: Final = "live_dump"
    """The Flight Recorder dumps of a hang, read (job, request, ranks dumped, verdict, wavefront)."""
    LIVE_TRACE: Final = "live_trace"
    """An on-demand Kineto trace landed and was read (job, request, rank, path, steps)."""
    LIVE_REFUSED: Final = "live_refused"
    """Stream lines refused in one run (job, rank, why: garbage, over the size cap, over the rate cap; count)."""
    # who opened what on the web (web/access.py, access/audit.py): the audit trail shown to security
    ACCESS_JOB: Final = "access_job"
    """A job's page, API or steps opened: who, via, job, route."""
    ACCESS_FINDING: Final = "access_finding"
    """Findings read (one vector or all): who, via, vector, route."""
    # scheduled active tests of hpcwatch collect (collect/active.py)
    ACTIVE_RUN: Final = "active_run"
    """A check job the ``[active]`` collector started on an idle node, or could not: run (its id), node, checks,
    step (``submit``, ``refused``: the controller found the node busy, ``failed``), reservation, job, dir, argv,
    rc, output, undo (argv)."""
    ACTIVE_RESULT: Final = "active_result"
    """What a check job of ``[active]`` gave: run, node, job, passed, verdict and reason (the health rules' active
    checks on its outputs), checks, problems (an output missing or unreadable, a job cancelled)."""


EVENT_KINDS: Final[frozenset[str]] = frozenset(v for k, v in vars(EventKind).items() if k.isupper())

# -- metric names ----------------------------------------------------------------------------------------------
# dcgm-exporter fields (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv)
DCGM_FI_DEV_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FI_DEV_POWER_USAGE: Final = "DCGM_FI_DEV_POWER_USAGE"
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_FI_DEV_FB_USED: Final = "DCGM_FI_DEV_FB_USED"
DCGM_FI_DEV_FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"
DCGM_FI_DEV_FB_TOTAL: Final = "DCGM_FI_DEV_FB_TOTAL"
DCGM_FI_DEV_SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"
DCGM_FI_DEV_MEM_CLOCK: Final = "DCGM_FI_DEV_MEM_CLOCK"
DCGM_FI_DEV_GPU_TEMP: Final = "DCGM_FI_DEV_GPU_TEMP"
DCGM_FI_DEV_MEMORY_TEMP: Final = "DCGM_FI_DEV_MEMORY_TEMP"
DCGM_FI_DEV_MEM_COPY_UTIL: Final = "DCGM_FI_DEV_MEM_COPY_UTIL"
DCGM_FI_DEV_XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: Final = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: Final = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_FI_DEV_ROW_REMAP_FAILURE: Final = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_FI_DEV_ROW_REMAP_PENDING: Final = "DCGM_FI_DEV_ROW_REMAP_PENDING"
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: Final = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
DCGM_FI_DEV_PCIE_REPLAY_COUNTER: Final = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
#: The GPU's PCIe link now (generation 1-6, lanes) and the most this GPU and slot allow (fields 235-238); nvidia-smi's
#: "GPU Link Info". dcgm-exporter lists them in its metric catalogue (not in its default counters file).
DCGM_FI_DEV_PCIE_LINK_GEN: Final = "DCGM_FI_DEV_PCIE_LINK_GEN"
DCGM_FI_DEV_PCIE_LINK_WIDTH: Final = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
DCGM_FI_DEV_PCIE_MAX_LINK_GEN: Final = "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH: Final = "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
DCGM_FI_DEV_CLOCKS_EVENT_REASONS: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
DCGM_FI_DRIVER_VERSION: Final = "DCGM_FI_DRIVER_VERSION"
DCGM_FI_DEV_VBIOS_VERSION: Final = "DCGM_FI_DEV_VBIOS_VERSION"
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: Final = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DCGM_FI_PROF_GR_ENGINE_ACTIVE: Final = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DCGM_FI_PROF_DRAM_ACTIVE: Final = "DCGM_FI_PROF_DRAM_ACTIVE"
# AMD's device-metrics-exporter (https://github.com/ROCm/device-metrics-exporter, docs/configuration/metricslist.md).
# The AMD readers rename the ones with a DCGM twin to the DCGM name (sources/amd_gpu.py, EXPORTER_TO_DCGM) and keep
# the others as exposed; the twin writes these names for an AMD cluster.
GPU_GFX_ACTIVITY: Final = "gpu_gfx_activity"
GPU_UMC_ACTIVITY: Final = "gpu_umc_activity"
GPU_POWER_USAGE: Final = "gpu_power_usage"
GPU_PACKAGE_POWER: Final = "gpu_package_power"
GPU_JUNCTION_TEMPERATURE: Final = "gpu_junction_temperature"
GPU_EDGE_TEMPERATURE: Final = "gpu_edge_temperature"
GPU_MEMORY_TEMPERATURE: Final = "gpu_memory_temperature"
GPU_ENERGY_CONSUMED: Final = "gpu_energy_consumed"
GPU_USED_VRAM: Final = "gpu_used_vram"
GPU_FREE_VRAM: Final = "gpu_free_vram"
GPU_TOTAL_VRAM: Final = "gpu_total_vram"
GPU_ECC_UNCORRECT_TOTAL: Final = "gpu_ecc_uncorrect_total"
GPU_ECC_CORRECT_TOTAL: Final = "gpu_ecc_correct_total"
PCIE_REPLAY_COUNT: Final = "pcie_replay_count"
#: Accumulated XGMI link data read / written, KB (per ``link_index``); kept under these names (no DCGM twin).
GPU_XGMI_LINK_RX: Final = "gpu_xgmi_link_rx"
GPU_XGMI_LINK_TX: Final = "gpu_xgmi_link_tx"
#: ECC errors of the XGMI WAFL block (the GPU-to-GPU link's physical layer), correctable / uncorrectable counts.
GPU_ECC_CORRECT_XGMI_WAFL: Final = "gpu_ecc_correct_xgmi_wafl"
GPU_ECC_UNCORRECT_XGMI_WAFL: Final = "gpu_ecc_uncorrect_xgmi_wafl"
#: Share of time (%) the GPU's clocks were held down by a thermal limit (MI3xx): socket, voltage rail, HBM, PROCHOT.
GPU_VIOLATION_SOCKET_THERMAL_RESIDENCY_PERCENTAGE: Final = "gpu_violation_socket_thermal_residency_percentage"
GPU_VIOLATION_VR_THERMAL_RESIDENCY_PERCENTAGE: Final = "gpu_violation_vr_thermal_residency_percentage"
GPU_VIOLATION_HBM_THERMAL_RESIDENCY_PERCENTAGE: Final = "gpu_violation_hbm_thermal_residency_percentage"
GPU_VIOLATION_PROCESSOR_HOT_RESIDENCY_PERCENTAGE: Final = "gpu_violation_processor_hot_residency_percentage"
# node-exporter's infiniband collector (https://github.com/prometheus/node_exporter, collector/infiniband_linux.go)
#: 1, with labels device, firmware_version, hca_type (board_id): node-exporter's, and ibstat's per HCA.
NODE_INFINIBAND_INFO: Final = "node_infiniband_info"
#: 1, with labels release, version, machine, nodename: node-exporter's uname collector (collector/uname.go).
NODE_UNAME_INFO: Final = "node_uname_info"
#: 1, with label version (``MLNX_OFED_LINUX-5.8-3.0.7.0``): ``ofed_info -s`` (sources/ofed_info.py).
OFED_INFO: Final = "ofed_info"
NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL: Final = "node_infiniband_port_data_received_bytes_total"
NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL: Final = "node_infiniband_port_data_transmitted_bytes_total"
NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_RECEIVED_TOTAL: Final = "node_infiniband_port_constraint_errors_received_total"
NODE_INFINIBAND_PORT_CONSTRAINT_ERRORS_TRANSMITTED_TOTAL: Final = (
    "node_infiniband_port_constraint_errors_transmitted_total"
)
NODE_INFINIBAND_LINK_DOWNED_TOTAL: Final = "node_infiniband_link_downed_total"
NODE_INFINIBAND_LINK_ERROR_RECOVERY_TOTAL: Final = "node_infiniband_link_error_recovery_total"
NODE_INFINIBAND_PORT_ERRORS_RECEIVED_TOTAL: Final = "node_infiniband_port_errors_received_total"
# perfquery counters (sources/infiniband.py: data counters already x4, in bytes)
IB_PORTXMITDATA_BYTES: Final = "ib_PortXmitData_bytes"
IB_PORTRCVDATA_BYTES: Final = "ib_PortRcvData_bytes"
# Slurm accounting, per job (sources/slurm.py from sacct's TRES and steps; labels job_id, and node where per node)
SLURM_JOB_CPUS: Final = "slurm_job_cpus"
SLURM_JOB_CPU_SECONDS: Final = "slurm_job_cpu_seconds"
SLURM_JOB_MEMORY_REQUESTED_BYTES: Final = "slurm_job_memory_requested_bytes"
SLURM_JOB_MAX_RSS_BYTES: Final = "slurm_job_max_rss_bytes"
SLURM_JOB_TIME_LIMIT_SECONDS: Final = "slurm_job_time_limit_seconds"
#: A running job's elapsed time as Slurm reported it at the sample's time (squeue/slurmrestd snapshot, sacct)
SLURM_JOB_ELAPSED_SECONDS: Final = "slurm_job_elapsed_seconds"
# ibstat (sources/infiniband.py)
IB_PORT_RATE_GBPS: Final = "ib_port_rate_gbps"
IB_PORT_UP: Final = "ib_port_up"
#: 0 for an HCA ibstat could not stat ("ibpanic: ... stat of IB device 'mlx5_8' failed"), labels device, error
IB_DEVICE_UP: Final = "ib_device_up"
# Lustre job_stats (sources/lustre.py)
LUSTRE_JOB_READ_BYTES_TOTAL: Final = "lustre_job_read_bytes_total"
LUSTRE_JOB_WRITE_BYTES_TOTAL: Final = "lustre_job_write_bytes_total"
# the PyTorch hook (instrument/torch.py)
TRAIN_STEP_TIME_S: Final = "train_step_time_s"
TRAIN_PHASE_S: Final = "train_phase_s"
TRAIN_LOSS: Final = "train_loss"
TRAIN_GRAD_NORM: Final = "train_grad_norm"
TRAIN_GRAD_NONFINITE: Final = "train_grad_nonfinite"
TRAIN_GRAD_SKETCH: Final = "train_grad_sketch"
# Slurm through slurmrestd or sinfo --json (sources/slurmrest.py; node label = the Slurm node name)
SLURM_NODE_UP: Final = "slurm_node_up"
SLURM_NODE_CPUS: Final = "slurm_node_cpus"
SLURM_NODE_ALLOC_CPUS: Final = "slurm_node_alloc_cpus"
SLURM_NODE_GPUS: Final = "slurm_node_gpus"
SLURM_NODE_ALLOC_GPUS: Final = "slurm_node_alloc_gpus"
SLURM_PARTITION_NODES: Final = "slurm_partition_nodes"
SLURM_PARTITION_CPUS: Final = "slurm_partition_cpus"
# smartctl --json (sources/smartctl.py), named as prometheus-community/smartctl_exporter names them (metrics.go)
SMARTCTL_DEVICE_SMART_STATUS: Final = "smartctl_device_smart_status"
SMARTCTL_DEVICE_CRITICAL_WARNING: Final = "smartctl_device_critical_warning"
SMARTCTL_DEVICE_MEDIA_ERRORS: Final = "smartctl_device_media_errors"
SMARTCTL_DEVICE_AVAILABLE_SPARE: Final = "smartctl_device_available_spare"
SMARTCTL_DEVICE_AVAILABLE_SPARE_THRESHOLD: Final = "smartctl_device_available_spare_threshold"
SMARTCTL_DEVICE_PERCENTAGE_USED: Final = "smartctl_device_percentage_used"
SMARTCTL_DEVICE_TEMPERATURE: Final = "smartctl_device_temperature"
# lspci -vv (sources/lspci.py): a PCIe link as trained (LnkSta) and as capable (LnkCap); labels bdf, vendor, device_class
PCIE_LINK_SPEED_GTS: Final = "pcie_link_speed_gts"
PCIE_LINK_SPEED_MAX_GTS: Final = "pcie_link_speed_max_gts"
PCIE_LINK_WIDTH: Final = "pcie_link_width"
PCIE_LINK_WIDTH_MAX: Final = "pcie_link_width_max"
# chronyc tracking (sources/chrony.py): the clock's offset from NTP time (s, fast positive), leap status 0-3
CHRONY_TRACKING_SYSTEM_TIME_SECONDS: Final = "chrony_tracking_system_time_seconds"
CHRONY_TRACKING_LAST_OFFSET_SECONDS: Final = "chrony_tracking_last_offset_seconds"
CHRONY_TRACKING_STRATUM: Final = "chrony_tracking_stratum"
CHRONY_TRACKING_LEAP_STATUS: Final = "chrony_tracking_leap_status"
# systemctl --failed --output=json (sources/systemd_units.py): failed units, per unit (label unit) and counted
SYSTEMD_UNIT_FAILED: Final = "systemd_unit_failed"
SYSTEMD_UNITS_FAILED: Final = "systemd_units_failed"
# ipmitool sdr list / sdr elist / sensor (sources/ipmitool_sdr.py): the BMC's status of each sensor against its own
# thresholds (0 ok, 1 non-critical, 2 critical, 3 non-recoverable, -1 no reading), the reading, a discrete state
IPMI_SENSOR_STATUS: Final = "ipmi_sensor_status"
IPMI_SENSOR_READING: Final = "ipmi_sensor_reading"
IPMI_SENSOR_STATE: Final = "ipmi_sensor_state"
# EDAC memory error counters (sources/edac.py), per memory controller as node_exporter's edac collector names them
# (label controller), and per location (rank, DIMM, csrow, channel; label location)
NODE_EDAC_CORRECTABLE_ERRORS_TOTAL: Final = "node_edac_correctable_errors_total"
NODE_EDAC_UNCORRECTABLE_ERRORS_TOTAL: Final = "node_edac_uncorrectable_errors_total"
EDAC_LOCATION_CORRECTABLE_ERRORS_TOTAL: Final = "edac_location_correctable_errors_total"
EDAC_LOCATION_UNCORRECTABLE_ERRORS_TOTAL: Final = "edac_location_uncorrectable_errors_total"
# df (sources/df.py): blocks and inodes of each mounted file system, named as node_exporter's filesystem collector
# names them (labels device, fstype, mountpoint)
NODE_FILESYSTEM_SIZE_BYTES: Final = "node_filesystem_size_bytes"
NODE_FILESYSTEM_AVAIL_BYTES: Final = "node_filesystem_avail_bytes"
NODE_FILESYSTEM_FILES: Final = "node_filesystem_files"
NODE_FILESYSTEM_FILES_FREE: Final = "node_filesystem_files_free"

#: Every metric name above.
METRICS: Final[frozenset[str]] = frozenset(
    v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str) and k not in ("METRICS",)
)
