"""The twin: a simulated cluster that writes the real formats (see twin/core.py).

Importing the package registers every scenario: ``straggler``, ``failures``
(one sick node: health), ``host_faults`` (a node's drives, links, clock, kernel, services, BMC, diagnostics),
``gpu_faults`` (NVIDIA GPU fields the twin does not simulate), ``amd_faults`` (AMD GPUs), ``fleet_faults`` (driver,
firmware, kernel, OFED, NCCL drift), ``threats`` (security), ``nccl_hang`` and
``nccl_socket_fallback`` (twin/nccl.py), ``well_kept`` / ``neglected`` (assessment), ``kubernetes`` (pods, MIG, no
Slurm: twin/kubernetes.py). ``twin/plants.py`` says which health rule each fault scenario makes fire, and where.
"""

from hpcwatch.twin import (  # noqa: F401  (each registers its scenarios)
    amd_faults,
    assess_scenarios,
    failures,
    fleet_faults,
    gpu_faults,
    host_faults,
    kubernetes,
    nccl,
    straggler,
    threats,
)
from hpcwatch.twin.core import DEFAULT_START_S, JobTruth, Twin
from hpcwatch.twin.scenarios import Scenario, get_scenario, register, scenario_names

__all__ = ["Twin", "JobTruth", "DEFAULT_START_S", "Scenario", "register", "get_scenario", "scenario_names"]
