"""The twin: a simulated cluster that writes the real formats (see twin/core.py).

Importing the package registers every scenario: ``straggler``, ``failures``
(one sick node: health), ``threats`` (security), ``nccl_hang`` and ``nccl_socket_fallback``
(twin/nccl.py), ``well_kept`` / ``neglected`` (assessment), ``kubernetes`` (pods, MIG, no Slurm: twin/kubernetes.py).
"""

from hpcwatch.twin import assess_scenarios, failures, host_faults, kubernetes, nccl, straggler, threats  # noqa: F401  (each registers its scenarios)
from hpcwatch.twin.core import DEFAULT_START_S, JobTruth, Twin
from hpcwatch.twin.scenarios import Scenario, get_scenario, register, scenario_names

__all__ = ["Twin", "JobTruth", "DEFAULT_START_S", "Scenario", "register", "get_scenario", "scenario_names"]
