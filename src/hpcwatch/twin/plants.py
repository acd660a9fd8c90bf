"""Which health rule each fault scenario of the twin makes fire, on which node, with which verdict.

One row per rule a fault scenario makes fire: run the twin with it (``model``, ``nodes``, ``duration_s``), ingest
what it wrote (each ``out/host/<node>`` folder with ``--host <node>``, as an agent ships it) and ``hpcwatch health``
gives ``verdict`` under ``rule`` on ``node``, and nothing on the other nodes. tests/unit/test_twin_fault_plants.py
runs every row, and fails when a health rule (``analysis.health_rules.HEALTH_RULES``) has no row and no stated
reason why no one-node plant can show it: a new rule comes with the scenario that plants it. The twin names rules by
their id only (it sits below ``analysis``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Plant", "FAULT_PLANTS", "PLANT_DURATION_S"]

#: How long a plant's run lasts: four scrapes (t0 and three ticks of 10 s), enough for every row's story.
PLANT_DURATION_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Plant:
    """A fault scenario and what the health rules must say of it."""

    scenario: str
    rule: str
    """The health rule id (``HEALTH_RULE_IDS``) that fires."""
    verdict: Literal["warn", "drain"]
    node: str
    """The node it fires on (the only one where anything fires)."""
    model: str = "reference"
    """The packaged cluster model (``twin run --model``)."""
    nodes: int | None = None
    """Nodes of the model's first group (``twin run --nodes``); None: the model's own count."""
    duration_s: float = PLANT_DURATION_S
    """How long the run lasts (``twin run --duration``): longer only where the story needs it."""


#: Every fault scenario that plants a health fault, by family of the rule it makes fire; a scenario whose fault
#: fires several rules has a row for each (and its rows share model, nodes and duration: one run shows them all).
#: Left out: ``stalled_nccl`` (every GPU of every node: a hung collective is the job's, not one node's),
#: ``neglected`` (many faults at once, for ``hpcwatch assess``), ``nccl_hang`` (read by ``hpcwatch hang``, not a
#: health rule). tests/unit/test_twin_fault_plants.py lists the rules no one-node plant can show, and why.
FAULT_PLANTS: tuple[Plant, ...] = (
    # gpu
    Plant(scenario="xid79", rule="xid", verdict="drain", node="node2", duration_s=120.0),
    # the exporter loses the GPU 20 s after the XID and the rule waits missing_after_s (60 s): a longer run
    Plant(scenario="xid79", rule="gpu_missing", verdict="drain", node="node2", duration_s=120.0),
    Plant(scenario="row_remap_failed", rule="row_remap", verdict="drain", node="node2"),
    Plant(scenario="pcie_replays", rule="pcie_replay", verdict="warn", node="node1"),
    Plant(scenario="thermal_throttle", rule="throttle", verdict="warn", node="node1"),
    Plant(scenario="ecc_sbe_storm", rule="ecc_correctable", verdict="warn", node="node2"),
    Plant(scenario="amd_xgmi_errors", rule="xgmi_errors", verdict="drain", node="node2", model="mi300x"),
    Plant(scenario="amd_xgmi_errors", rule="xgmi_errors", verdict="warn", node="node2", model="mi300x"),
    Plant(scenario="amd_xgmi_errors", rule="ecc_dbe", verdict="drain", node="node2", model="mi300x"),
    Plant(scenario="amd_thermal_throttle", rule="amd_throttle", verdict="warn", node="node1", model="mi300x"),
    # fabric
    Plant(scenario="ib_flap", rule="ib_link", verdict="warn", node="node1"),
    Plant(scenario="ib_flap", rule="ib_errors", verdict="warn", node="node1"),
    Plant(scenario="ib_port_down", rule="ib_port", verdict="drain", node="node2"),
    # benchmark
    Plant(scenario="diag_failed", rule="dcgm_diag", verdict="drain", node="node2"),
    Plant(scenario="nccl_tests_wrong", rule="nccl_tests", verdict="drain", node="node1"),
    Plant(scenario="ib_write_bw_low", rule="ib_write_bw", verdict="drain", node="node2"),
    Plant(scenario="diag_failed", rule="xid", verdict="drain", node="node2"),  # its XID 48, what a live demo sees
    # nccl
    Plant(scenario="nccl_socket_fallback", rule="nccl_socket_fallback", verdict="warn", node="node2"),
    Plant(scenario="nccl_socket_fallback", rule="nccl_ib_missing", verdict="drain", node="node2"),
    Plant(scenario="nccl_conf_stale", rule="nccl_intranode_net", verdict="warn", node="node2"),
    Plant(scenario="nccl_conf_stale", rule="nccl_forced_tuning", verdict="warn", node="node2"),
    # storage, memory, pcie, clock, services, kernel, bmc: twin/host_faults.py
    Plant(scenario="nvme_failing", rule="nvme_critical_warning", verdict="drain", node="node2"),
    Plant(scenario="nvme_failing", rule="nvme_media_errors", verdict="warn", node="node2"),
    Plant(scenario="nvme_worn_out", rule="nvme_spare", verdict="drain", node="node1"),
    Plant(scenario="nvme_worn_out", rule="nvme_wear", verdict="drain", node="node1"),
    Plant(scenario="nvme_overheating", rule="nvme_temperature", verdict="warn", node="node2"),
    Plant(scenario="sata_drive_failing", rule="smart_status", verdict="drain", node="node1"),
    Plant(scenario="disk_full", rule="disk_space", verdict="drain", node="node2"),
    Plant(scenario="inodes_exhausted", rule="disk_inodes", verdict="drain", node="node1"),
    # memory
    Plant(scenario="dimm_failing", rule="memory_uncorrected", verdict="drain", node="node2"),
    Plant(scenario="dimm_failing", rule="memory_corrected", verdict="warn", node="node2"),
    # pcie
    Plant(scenario="pcie_degraded", rule="pcie_width", verdict="drain", node="node1"),
    Plant(scenario="hca_pcie_slow", rule="pcie_speed", verdict="warn", node="node2"),
    Plant(scenario="pcie_gen_degraded", rule="pcie_gen", verdict="warn", node="node1"),
    # clock
    Plant(scenario="clock_drift", rule="clock_offset", verdict="warn", node="node2"),
    Plant(scenario="clock_unsynchronised", rule="clock_unsynchronised", verdict="warn", node="node1"),
    # services
    Plant(scenario="service_failed", rule="failed_units", verdict="drain", node="node2"),
    # kernel
    Plant(scenario="kernel_hung_task", rule="hung_task", verdict="warn", node="node2"),
    Plant(scenario="oom_killed", rule="oom_kill", verdict="warn", node="node2"),
    Plant(scenario="hardware_error", rule="hw_error", verdict="warn", node="node1"),
    Plant(scenario="hca_firmware_hung", rule="nic_driver", verdict="drain", node="node1"),
    # bmc
    Plant(scenario="bmc_psu_failure", rule="ipmi_sel", verdict="drain", node="node1"),
    Plant(scenario="bmc_fan_critical", rule="bmc_sensor", verdict="drain", node="node2"),
    Plant(scenario="bmc_fan_critical", rule="bmc_psu_fan", verdict="drain", node="node2"),
    # fleet: twin/fleet_faults.py, three nodes (with two, the odd one out is a tie)
    Plant(scenario="driver_drift", rule="driver_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="driver_drift", rule="cuda_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="amd_vbios_drift", rule="firmware_mismatch", verdict="warn", node="node3", model="mi300x", nodes=3),
    Plant(scenario="kernel_drift", rule="kernel_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="ofed_drift", rule="ofed_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="hca_firmware_drift", rule="hca_firmware_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="nccl_drift", rule="nccl_fleet_mismatch", verdict="warn", node="node3", nodes=3),
)
