"""Fleet drift: the last node of the twin runs another GPU driver, firmware, kernel or stack than the rest of its
partition.

The fleet rules compare the nodes of a partition, so these need three nodes at least (with two, a difference is
a tie and warns both): ``hpcwatch twin run --nodes 3 --scenario driver_drift``. Each writes its source on every
node, so the rule compares all of them and finds the last one odd.

=========================  ==============================================================  ========================
scenario                   what the twin writes (node3 of 3 odd)                           rules that fire (warn)
=========================  ==============================================================  ========================
``driver_drift``           dcgm-exporter's ``DCGM_FI_DRIVER_VERSION`` label: R570's         ``driver_mismatch``,
                           570.211.01 where the others run 580.159.03; its NCCL ranks say   ``cuda_mismatch``
                           so too (``cudaDriverVersion 12080``, CUDA 12.8, the others'
                           13000)
``amd_vbios_drift``        (``--model mi300x``) device-metrics-exporter's ``vbios_version``  ``firmware_mismatch``
                           label: 022.040.003.043.000001 where the others run ...042...
``kernel_drift``           node-exporter's ``node_uname_info``: release 6.8.0-40-generic     ``kernel_mismatch``
                           where the others run 6.8.0-45-generic
``ofed_drift``             ``ofed_info -s`` (``out/host/<node>/ofed_info.txt``):             ``ofed_mismatch``
                           MLNX_OFED_LINUX-23.07-0.5.1.2 where the others run 23.10-2.1.3.1
``hca_firmware_drift``     ``ibstat`` (``out/host/<node>/ibstat.txt``): the ConnectX-7s'     ``hca_firmware_mismatch``
                           Firmware version 28.39.1002 where the others run 28.41.1000
``nccl_drift``             each node's acceptance run's ``NCCL_DEBUG=INFO`` logs             ``nccl_fleet_mismatch``
                           (``out/nccl/nccl.<node>.70xx.log``): NCCL 2.19.3 where the
                           others load 2.21.5
=========================  ==============================================================  ========================

Every version is a real one: 570.211.01 is R570's first release with the May 2026 fixes (assess/versions.py), and
its CUDA 12.8 the release notes' (twin/devices.DRIVER_CUDA); 022.040.003.043.000001 the VBIOS of an MI300X OAM in a
device-metrics-exporter scrape quoted in silogen/kaiwo's metrics watcher (the twin's own, ...042..., is the one of
ROCm/device-metrics-exporter issue #171); 6.8.0-45-generic the Ubuntu 24.04 kernel of the twin's own dmesg
(host_faults.kernel_hung_task) and 6.8.0-40 an earlier one of that series (their ``uname -v`` as real hosts print
it); MLNX_OFED_LINUX-23.07-0.5.1.2 the
``ofed_info -s`` of tests/data/ofed_info, 23.10-2.1.3.1 a later MLNX_OFED LTS release; 28.41.1000 the ConnectX-7 firmware of a real H100 node's ibstat
(tests/data/infiniband, leptonai/gpud) and 28.39.1002 an earlier ConnectX-7 release; NCCL 2.19.3+cuda12.3 the
version of nccl-tests issue 185's log (tests/data/nccl).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from hpcwatch import vocab
from hpcwatch.errors import ConfigError
from hpcwatch.twin.amd_faults import require_amd
from hpcwatch.twin.devices import R570_DRIVER_VERSION
from hpcwatch.twin.host_tools import HCA_FIRMWARE, ibstat_text, write_host_file
from hpcwatch.twin.nccl import NCCL_VERSION, write_acceptance_logs
from hpcwatch.twin.scenarios import Scenario, register

__all__ = [
    "DriverDrift",
    "AmdVbiosDrift",
    "KernelDrift",
    "OfedDrift",
    "HcaFirmwareDrift",
    "NcclDrift",
    "FLEET_MIN_NODES",
    "KERNEL_RELEASE",
    "OFED_VERSION",
]

#: Nodes a fleet scenario needs: with two, the odd one out is a tie and both warn.
FLEET_MIN_NODES = 3
#: The kernel the twin's nodes run (``uname -r``), and its build as ``uname -v`` prints it: the Ubuntu 24.04
#: kernel of the twin's own kernel log (host_faults.KernelHungTask's "Not tainted 6.8.0-45-generic #45-Ubuntu").
KERNEL_RELEASE, KERNEL_BUILD = "6.8.0-45-generic", "#45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024"
#: The OFED the twin's nodes run, as ``ofed_info -s`` names it.
OFED_VERSION = "MLNX_OFED_LINUX-23.10-2.1.3.1"


def _require_fleet(twin: Any, scenario: str) -> str:
    """The node a fleet scenario makes odd (the last one); ``ConfigError`` when the twin has too few to compare."""
    if len(twin.node_names) < FLEET_MIN_NODES:
        raise ConfigError(
            f"scenario {scenario}: the fleet rules compare nodes, it needs {FLEET_MIN_NODES} at least "
            f"(--nodes {FLEET_MIN_NODES}), the model has {len(twin.node_names)}"
        )
    return str(twin.node_names[-1])


class _Drift(Scenario):
    """Relabels every GPU of the twin's last node when the twin is built (``bind``)."""

    label = ""
    version = ""

    def bind(self, twin: Any) -> None:
        twin.set_gpu_label(_require_fleet(twin, self.name), self.label, self.version)


@register
class DriverDrift(_Drift):
    """The GPU exporter's driver label, and the NCCL logs of the node's ranks (their ``cudaDriverVersion`` is the
    CUDA version of the node's driver, twin/nccl.cuda_driver_of)."""

    name = "driver_drift"
    description = "the last node (of 3 or more) still runs NVIDIA driver 570.211.01, the others 580.159.03"
    label, version = vocab.DCGM_FI_DRIVER_VERSION, R570_DRIVER_VERSION


@register
class AmdVbiosDrift(_Drift):
    name = "amd_vbios_drift"
    description = "the last AMD node (of 3 or more) runs another MI300X VBIOS than the rest (--model mi300x)"
    label, version = "vbios_version", "022.040.003.043.000001"

    def bind(self, twin: Any) -> None:
        require_amd(twin, self.name, twin.node_names[-1])
        super().bind(twin)


class _NodeVersions(Scenario):
    """A version every node reports, ``odd`` on the last one and ``usual`` on the others."""

    usual = ""
    odd = ""

    def bind(self, twin: Any) -> None:
        _require_fleet(twin, self.name)

    def version_of(self, twin: Any, node: str) -> str:
        return self.odd if node == twin.node_names[-1] else self.usual


@register
class KernelDrift(_NodeVersions):
    """node-exporter's uname collector (on by default) in every scrape of every node: ``node_uname_info``, its
    help text and labels as collector/uname.go writes them (tests/data/prometheus/node_uname_info_*.prom)."""

    name = "kernel_drift"
    description = "the last node (of 3 or more) boots kernel 6.8.0-40-generic, the others 6.8.0-45-generic"
    usual, odd = KERNEL_RELEASE, "6.8.0-40-generic"
    BUILDS: ClassVar[dict[str, str]] = {
        KERNEL_RELEASE: KERNEL_BUILD,
        "6.8.0-40-generic": "#40-Ubuntu SMP PREEMPT_DYNAMIC Fri Jul  5 10:34:03 UTC 2024",
    }
    """``uname -v`` of each release, as the hosts running them print it."""

    def node_exporter_lines(self, *, twin: Any, node: str, stamp: str, target: str) -> str:
        release = self.version_of(twin, node)
        name = vocab.NODE_UNAME_INFO
        return (
            f"# HELP {name} Labeled system information as provided by the uname system call.\n"
            f"# TYPE {name} gauge\n"
            f'{name}{{domainname="(none)",machine="x86_64",nodename="{node}",release="{release}",sysname="Linux",'
            f'version="{self.BUILDS[release]}"{target}}} 1{stamp}\n'
        )


@register
class OfedDrift(_NodeVersions):
    """``ofed_info -s`` of every node, its one line (tests/data/ofed_info's shape)."""

    name = "ofed_drift"
    description = "the last node (of 3 or more) runs MLNX_OFED 23.07, the others 23.10 (ofed_info -s)"
    usual, odd = OFED_VERSION, "MLNX_OFED_LINUX-23.07-0.5.1.2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        for node in twin.node_names:
            write_host_file(out, node, "ofed_info.txt", f"{self.version_of(twin, node)}:\n", t1)


@register
class HcaFirmwareDrift(_NodeVersions):
    """``ibstat`` of every node (twin/host_tools.ibstat_text): the last node's ConnectX-7s on older firmware."""

    name = "hca_firmware_drift"
    description = "the last node's (of 3 or more) ConnectX-7 HCAs run firmware 28.39.1002, the others 28.41.1000"
    usual, odd = HCA_FIRMWARE, "28.39.1002"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        for node in twin.node_names:
            write_host_file(out, node, "ibstat.txt", ibstat_text(twin, node, firmware=self.version_of(twin, node)), t1)


@register
class NcclDrift(_NodeVersions):
    """Each node ran an acceptance run (nccl-tests on its own GPUs, ``NCCL_DEBUG=INFO``) before the jobs: the last
    node's image still loads the previous NCCL (its libnccl2 was not upgraded with the others')."""

    name = "nccl_drift"
    description = "the last node (of 3 or more) still loads NCCL 2.19.3, the others 2.21.5 (acceptance runs' logs)"
    usual, odd = NCCL_VERSION, "2.19.3+cuda12.3"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        for node in twin.node_names:
            write_acceptance_logs(twin, out, node, version=self.version_of(twin, node))
