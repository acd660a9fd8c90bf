"""Fleet drift: the last node of the twin runs another GPU driver or firmware than the rest of its partition.

The fleet rules compare the nodes of a partition, so these need three nodes at least (with two, a difference is
a tie and warns both): ``hpcwatch twin run --nodes 3 --scenario driver_drift``.

=======================  =============================================================  =====================
scenario                 what the exporter writes on the last node (node3 of 3)          rule that fires
=======================  =============================================================  =====================
``driver_drift``         dcgm-exporter's ``DCGM_FI_DRIVER_VERSION`` label: R570's          ``driver_mismatch``
                         570.211.01 where the others run 580.159.03
``amd_vbios_drift``      (``--model mi300x``) device-metrics-exporter's ``vbios_version``  ``firmware_mismatch``
                         label: 022.040.003.043.000001 where the others run ...042...
=======================  =============================================================  =====================

Both versions are real: 570.211.01 is R570's first release with the May 2026 fixes (assess/versions.py), and
022.040.003.043.000001 the VBIOS of an MI300X OAM in a device-metrics-exporter scrape quoted in
silogen/kaiwo's metrics watcher (the twin's own, ...042..., is the one of ROCm/device-metrics-exporter issue #171).
"""

from __future__ import annotations

from typing import Any

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.twin.amd_faults import require_amd
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["DriverDrift", "AmdVbiosDrift", "FLEET_MIN_NODES"]

#: Nodes a fleet scenario needs: with two, the odd one out is a tie and both warn.
FLEET_MIN_NODES = 3


class _Drift(Scenario):
    """Relabels every GPU of the twin's last node when the twin is built (``bind``)."""

    label = ""
    version = ""

    def bind(self, twin: Any) -> None:
        if len(twin.node_names) < FLEET_MIN_NODES:
            raise ConfigError(
                f"scenario {self.name}: the fleet rules compare nodes, it needs {FLEET_MIN_NODES} at least "
                f"(--nodes {FLEET_MIN_NODES}), the model has {len(twin.node_names)}"
            )
        twin.set_gpu_label(twin.node_names[-1], self.label, self.version)


@register
class DriverDrift(_Drift):
    name = "driver_drift"
    description = "the last node (of 3 or more) still runs NVIDIA driver 570.211.01, the others 580.159.03"
    label, version = vocab.DCGM_FI_DRIVER_VERSION, "570.211.01"


@register
class AmdVbiosDrift(_Drift):
    name = "amd_vbios_drift"
    description = "the last AMD node (of 3 or more) runs another MI300X VBIOS than the rest (--model mi300x)"
    label, version = "vbios_version", "022.040.003.043.000001"

    def bind(self, twin: Any) -> None:
        require_amd(twin, self.name, twin.node_names[-1])
        super().bind(twin)
