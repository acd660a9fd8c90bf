"""The twin: a simulated cluster that writes the real formats (see twin/core.py).

Importing the package registers every scenario: ``straggler`` here, and the
optional ``failures`` (goodput / health) and ``threats`` (security) modules
when they are present.
"""

from hpcwatch.twin import straggler  # noqa: F401  (registers the scenario)
from hpcwatch.twin.core import DEFAULT_START_S, JobTruth, Twin
from hpcwatch.twin.scenarios import Scenario, get_scenario, register, scenario_names

try:  # written by other parts of the project; the twin works without them
    from hpcwatch.twin import failures  # noqa: F401
except ImportError:
    pass
try:
    from hpcwatch.twin import threats  # noqa: F401
except ImportError:
    pass

__all__ = ["Twin", "JobTruth", "DEFAULT_START_S", "Scenario", "register", "get_scenario", "scenario_names"]
