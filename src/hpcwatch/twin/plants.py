"""Which health rule each fault scenario of the twin makes fire, on which node, with which verdict.

One row per fault scenario: run the twin with it (``model``, ``nodes``), ingest what it wrote (each
``out/host/<node>`` folder with ``--host <node>``, as an agent ships it) and ``hpcwatch health`` gives
``verdict`` under ``rule`` on ``node``, and nothing on the other nodes. tests/unit/test_twin_fault_plants.py runs
every row, and fails when a family of health rule (``analysis.health_rules.HEALTH_RULES``) has no row: a new family
comes with the scenario that plants it. The twin names rules by their id only (it sits below ``analysis``).
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


#: Every fault scenario that plants a health fault, by family of the rule it makes fire; a scenario whose fault
#: fires several rules has a row for each. Left out: ``stalled_nccl`` (every GPU of every node: a hung collective
#: is the job's, not one node's), ``neglected`` (many faults at once, for ``hpcwatch assess``), ``nccl_hang`` (read
#: by ``hpcwatch hang``, not a health rule).
FAULT_PLANTS: tuple[Plant, ...] = (
    # gpu
    Plant(scenario="xid79", rule="xid", verdict="drain", node="node2"),
    Plant(scenario="amd_xgmi_errors", rule="xgmi_errors", verdict="drain", node="node2", model="mi300x"),
    Plant(scenario="amd_xgmi_errors", rule="xgmi_errors", verdict="warn", node="node2", model="mi300x"),
    Plant(scenario="amd_xgmi_errors", rule="ecc_dbe", verdict="drain", node="node2", model="mi300x"),
    Plant(scenario="amd_thermal_throttle", rule="amd_throttle", verdict="warn", node="node1", model="mi300x"),
    # fabric
    Plant(scenario="ib_flap", rule="ib_link", verdict="warn", node="node1"),
    Plant(scenario="ib_flap", rule="ib_errors", verdict="warn", node="node1"),
    # benchmark
    Plant(scenario="diag_failed", rule="dcgm_diag", verdict="drain", node="node2"),
    Plant(scenario="diag_failed", rule="xid", verdict="drain", node="node2"),  # its XID 48, what a live demo sees
    # nccl
    Plant(scenario="nccl_socket_fallback", rule="nccl_socket_fallback", verdict="warn", node="node2"),
    Plant(scenario="nccl_socket_fallback", rule="nccl_ib_missing", verdict="drain", node="node2"),
    # storage, memory, pcie, clock, services, kernel, bmc: twin/host_faults.py
    Plant(scenario="nvme_failing", rule="nvme_critical_warning", verdict="drain", node="node2"),
    Plant(scenario="nvme_failing", rule="nvme_media_errors", verdict="warn", node="node2"),
    Plant(scenario="disk_full", rule="disk_space", verdict="drain", node="node2"),
    # memory
    Plant(scenario="dimm_failing", rule="memory_uncorrected", verdict="drain", node="node2"),
    Plant(scenario="dimm_failing", rule="memory_corrected", verdict="warn", node="node2"),
    Plant(scenario="pcie_degraded", rule="pcie_width", verdict="drain", node="node1"),
    Plant(scenario="clock_drift", rule="clock_offset", verdict="warn", node="node2"),
    Plant(scenario="service_failed", rule="failed_units", verdict="drain", node="node2"),
    Plant(scenario="kernel_hung_task", rule="hung_task", verdict="warn", node="node2"),
    Plant(scenario="hca_firmware_hung", rule="nic_driver", verdict="drain", node="node1"),
    Plant(scenario="bmc_psu_failure", rule="ipmi_sel", verdict="drain", node="node1"),
    Plant(scenario="bmc_fan_critical", rule="bmc_sensor", verdict="drain", node="node2"),
    Plant(scenario="bmc_fan_critical", rule="bmc_psu_fan", verdict="drain", node="node2"),
    # fleet
    Plant(scenario="driver_drift", rule="driver_mismatch", verdict="warn", node="node3", nodes=3),
    Plant(scenario="amd_vbios_drift", rule="firmware_mismatch", verdict="warn", node="node3", model="mi300x", nodes=3),
)
