"""Host faults the node-level checks find: one scenario per family of host rule, each writing the real output
of the tool that shows it (``out/host/<node>/...``) beside the twin's scrapes.

=======================  ======================================================  =========================
scenario                 what it writes (node2 unless said)                      rule that fires
=======================  ======================================================  =========================
``nvme_failing``         ``smartctl --json`` of an NVMe drive: critical warning  ``nvme_critical_warning``
                         0x04 (reliability degraded), media errors
``disk_full``            the agent's ``df --output``: / at 98 % used             ``disk_space``
``dimm_failing``         EDAC counters (``grep -H`` of sysfs): an uncorrected    ``memory_uncorrected``
                         error and 25 corrected ones on controller 0's DIMM 1
``pcie_degraded``        ``lspci -vv``: node1's GPU 3 (an H100) trained at x8    ``pcie_width``
``clock_drift``          ``chronyc tracking``: 2.5 s fast of NTP time            ``clock_offset``
``service_failed``       ``systemctl --failed --output=json``: fabric manager    ``failed_units``
``kernel_hung_task``     ``dmesg -T``: a task blocked for more than 120 s        ``hung_task``
``hca_firmware_hung``    ``dmesg -T``: node1's mlx5_0 firmware stops answering   ``nic_driver``
                         commands (mlx5_core command timeouts)
``bmc_psu_failure``      ``ipmitool sel elist``: PSU2 Failure detected           ``ipmi_sel``
``bmc_fan_critical``     ``ipmitool sdr elist``: a fan at 0 RPM in critical, its ``bmc_sensor``
                         neighbour PSU failed under an ``ok`` status
``diag_failed``          ``dcgmi diag -r 3 -j`` (DCGM 4) run between jobs: GPU 4  ``dcgm_diag``
                         fails the memory test (double-bit ECC errors)
=======================  ======================================================  =========================

``diag_failed`` is an active check's output (a benchmark the node ran between jobs, as ``hpcwatch act`` runs
it), not a passive reading; the other files are what an agent collects. Live, it is also the one fault here the
exporters show (GPU 4's XID 48) and that a check job fails on (``diag_failures``): the demo's remediation keeps
its node drained. Each file is dated by the run's end (its write time is set to it; smartctl's ``local_time``, dmesg's and the
SEL's clocks read the twin's), so it is judged in the window. None of these tools prints the host it ran on:
ingest a node's folder naming it, ``hpcwatch ingest --host node2 out/host/node2``, as an agent would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

from hpcwatch import vocab
from hpcwatch.twin.devices import DRIVER_VERSION
from hpcwatch.twin.failures import Onset
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["HOST_FAULT_RULES", "DIAG_TESTS", "dcgmi_diag_json"]

#: scenario -> the health rule its file makes fire (tests/unit/test_twin_host_faults.py checks each).
HOST_FAULT_RULES: dict[str, str] = {}


def _write(out: Path, node: str, name: str, text: str, t1: float) -> Path:
    folder = out / "host" / node
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    os.utime(path, (t1, t1))
    return path


def _ctime(t: float) -> str:
    """``dmesg -T``'s clock: ``Mon Mar  4 10:00:00 2024`` (the day padded with a space)."""
    g = time.gmtime(t)
    return f"{time.strftime('%a %b', g)} {g.tm_mday:>2} {time.strftime('%H:%M:%S %Y', g)}"


def _host_fault(name: str, rule: str, description: str) -> Any:
    def wrap(cls: type[Scenario]) -> type[Scenario]:
        cls.name, cls.description = name, description
        HOST_FAULT_RULES[name] = rule
        return register(cls)

    return wrap


@_host_fault("nvme_failing", "nvme_critical_warning", "node2's NVMe drive reports reliability degraded (smartctl)")
class NvmeFailing(Scenario):
    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        doc = {
            "json_format_version": [1, 0],
            "smartctl": {"version": [7, 3], "argv": ["smartctl", "--json", "-a", "/dev/nvme0"], "exit_status": 8},
            "device": {"name": "/dev/nvme0", "info_name": "/dev/nvme0", "type": "nvme", "protocol": "NVMe"},
            "model_name": "SAMSUNG MZQL23T8HCLS-00A07",
            "serial_number": "S64HNE0T000000",
            "local_time": {"time_t": int(t1)},
            "smart_status": {"passed": False, "nvme": {"value": 4, "reliability_degraded": True}},
            "nvme_smart_health_information_log": {
                "critical_warning": 4,
                "temperature": 41,
                "available_spare": 100,
                "available_spare_threshold": 10,
                "percentage_used": 3,
                "media_errors": 12,
                "num_err_log_entries": 40,
            },
            "temperature": {"current": 41},
        }
        _write(out, self.node, "smartctl_nvme0.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode(), t1)


@_host_fault("disk_full", "disk_space", "node2's root file system is 98 % full (df, as the agent runs it)")
class DiskFull(Scenario):
    """The agent's ``df --local --output=...`` (deploy/hpcwatch-agent.toml): / at 2 % available (under the 3 %
    that drains), a local NVMe scratch half full, and a tmpfs at 100 % that the rules leave alone."""

    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        text = (
            "Filesystem     Type   Inodes  IUsed   IFree IUse%  1K-blocks      Used     Avail Use% Mounted on\n"
            "/dev/nvme0n1p2 ext4  6553600 412377 6141223    7%  102626232  98464216   2064152  98% /\n"
            "tmpfs          tmpfs 2050305      1 2050304    1%     819200    819200         0 100% /run/user/0\n"
            "/dev/md0       xfs 750000000  20118 749979882  1% 7500000000 3600000000 3900000000  49% /scratch\n"
        )
        _write(out, self.node, "df.txt", text, t1)


@_host_fault("dimm_failing", "memory_uncorrected", "node2's memory controller 0 logged an uncorrected error (EDAC)")
class DimmFailing(Scenario):
    """The agent's ``grep -H . .../edac/mc/mc*/*e_count ...`` (deploy/hpcwatch-agent.toml): controller 0 has an
    uncorrected error and 25 corrected ones, all on one DIMM; controller 1 is clean."""

    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        base = "/sys/devices/system/edac/mc"
        text = (
            f"{base}/mc0/ce_count:25\n{base}/mc0/ue_count:1\n{base}/mc1/ce_count:0\n{base}/mc1/ue_count:0\n"
            f"{base}/mc0/dimm0/dimm_ce_count:0\n{base}/mc0/dimm0/dimm_ue_count:0\n"
            f"{base}/mc0/dimm1/dimm_ce_count:25\n{base}/mc0/dimm1/dimm_ue_count:1\n"
            f"{base}/mc1/dimm0/dimm_ce_count:0\n{base}/mc1/dimm0/dimm_ue_count:0\n"
        )
        _write(out, self.node, "edac_counts.txt", text, t1)


@_host_fault("pcie_degraded", "pcie_width", "node1's GPU 3 trained its PCIe link at x8 of x16 (lspci -vv)")
class PcieDegraded(Scenario):
    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        blocks = []
        for gpu, bdf in enumerate(("18:00.0", "2a:00.0", "3a:00.0", "5d:00.0")):
            width = "x8 (downgraded)" if gpu == 3 else "x16 (ok)"
            blocks.append(
                f"{bdf} 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
                "\tSubsystem: NVIDIA Corporation Device [10de:16c1]\n"
                "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B- DisINTx+\n"
                "\tCapabilities: [60] Express (v2) Endpoint, MSI 00\n"
                "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
                f"\t\tLnkSta:\tSpeed 32GT/s (ok), Width {width}\n"
                "\tKernel driver in use: nvidia\n"
            )
        _write(out, self.node, "lspci_vv.txt", "\n".join(blocks), t1)


@_host_fault("clock_drift", "clock_offset", "node2's clock runs 2.5 s fast of NTP time (chronyc tracking)")
class ClockDrift(Scenario):
    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        text = (
            "Reference ID    : C0A80001 (ntp1.cluster.local)\n"
            "Stratum         : 3\n"
            f"Ref time (UTC)  : {time.strftime('%a %b %d %H:%M:%S %Y', time.gmtime(t1 - 64))}\n"
            "System time     : 2.500000000 seconds fast of NTP time\n"
            "Last offset     : +0.000812000 seconds\n"
            "RMS offset      : 0.000950000 seconds\n"
            "Frequency       : 12.416 ppm slow\n"
            "Leap status     : Normal\n"
        )
        _write(out, self.node, "chronyc_tracking.txt", text, t1)


@_host_fault("service_failed", "failed_units", "node2's nvidia-fabricmanager unit failed (systemctl --failed)")
class ServiceFailed(Scenario):
    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        units = [
            {
                "unit": "nvidia-fabricmanager.service",
                "load": "loaded",
                "active": "failed",
                "sub": "failed",
                "description": "NVIDIA fabric manager service",
            }
        ]
        _write(out, self.node, "systemctl_failed.json", orjson.dumps(units).decode() + "\n", t1)


@_host_fault("kernel_hung_task", "hung_task", "a process on node2 is stuck in D state for 120 s (dmesg -T)")
class KernelHungTask(Scenario):
    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        t = _ctime(t1 - 30)
        text = (
            f"[{t}] INFO: task python:48211 blocked for more than 120 seconds.\n"
            f"[{t}]       Not tainted 6.8.0-45-generic #45-Ubuntu\n"
            f'[{t}] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.\n'
            f"[{t}] task:python          state:D stack:0     pid:48211 tgid:48211 ppid:48190 flags:0x00004002\n"
        )
        _write(out, self.node, "dmesg.txt", text, t1)


@_host_fault("hca_firmware_hung", "nic_driver", "node1's ConnectX HCA stops answering driver commands (dmesg -T)")
class HcaFirmwareHung(Scenario):
    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        t = _ctime(t1 - 45)
        pci = "0000:18:00.0"
        text = (
            f"[{t}] mlx5_core {pci}: wait_func_handle_exec_timeout:1108:(pid 51734): cmd[3]: "
            "CREATE_QP(0x500) No done completion\n"
            f"[{t}] mlx5_core {pci}: wait_func:1136:(pid 51734): CREATE_QP(0x500) timeout. "
            "Will cause a leak of a command resource\n"
            f"[{t}] infiniband mlx5_0: create_qp:3206:(pid 51734): Create QP type 2 failed\n"
        )
        _write(out, self.node, "dmesg.txt", text, t1)


@_host_fault("bmc_psu_failure", "ipmi_sel", "node1's BMC logs a power supply failure (ipmitool sel elist)")
class BmcPsuFailure(Scenario):
    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        day, clock = time.strftime("%m/%d/%Y", time.gmtime(t1 - 60)), time.strftime("%H:%M:%S", time.gmtime(t1 - 60))
        text = (
            f"   1 | {day} | {clock} | Power Supply PSU2_Status | Failure detected | Asserted\n"
            f"   2 | {day} | {clock} | Power Supply PSU_Redundancy | Redundancy Lost | Asserted\n"
        )
        _write(out, self.node, "ipmitool_sel_elist.txt", text, t1)


@_host_fault("bmc_fan_critical", "bmc_sensor", "node2's BMC reads a fan stopped below its critical threshold")
class BmcFanCritical(Scenario):
    """``ipmitool sdr elist`` in a Dell / HP BMC's shape: Fan3B at 0 RPM (``cr``, the BMC's own lower critical),
    and PSU 2 asserting Failure detected beside ``ok`` (``bmc_psu_fan``), as real BMCs print a failed supply."""

    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        text = (
            "Fan3A            | 30h | ok  | 29.5 | 7320 RPM\n"
            "Fan3B            | 31h | cr  | 29.6 | 0 RPM\n"
            "Inlet Temp       | 04h | ok  |  7.1 | 24 degrees C\n"
            "PS1 Status       | 62h | ok  | 10.1 | Presence detected\n"
            "PS2 Status       | 63h | ok  | 10.2 | Presence detected, Failure detected\n"
        )
        _write(out, self.node, "ipmitool_sdr_elist.txt", text, t1)


#: The tests of a ``dcgmi diag -r 3 -j`` of DCGM 4 the twin writes, by category (as dcgmi_diag_r3_dcgm4_fail.json).
DIAG_TESTS = (("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory"))


def dcgmi_diag_json(gpus: int, failing: Mapping[int, tuple[str, dict[str, Any]]]) -> str:
    """``dcgmi diag -r 3 -j`` in DCGM 4's shape (``entity_group`` / ``entity_id`` results, ``warnings`` objects,
    ``metadata``): every test of ``DIAG_TESTS`` passes on every GPU but those of ``failing``, GPU index ->
    (the test it fails, DCGM's warning object)."""

    def results(test: str) -> list[dict[str, Any]]:
        out = []
        for g in range(gpus):
            result: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": g, "status": "Pass"}
            if g in failing and failing[g][0] == test:
                result.update({"status": "Fail", "warnings": [failing[g][1]]})
            out.append(result)
        return out

    categories = []
    for category, name in DIAG_TESTS:
        rows = results(name)
        summary = "Fail" if any(r["status"] == "Fail" for r in rows) else "Pass"
        categories.append(
            {"category": category, "tests": [{"name": name, "results": rows, "test_summary": {"status": summary}}]}
        )
    doc = {
        "DCGM Diagnostic": {"test_categories": categories},
        "metadata": {"Driver Version Detected": DRIVER_VERSION, "version": "4.1.1"},
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


@_host_fault("diag_failed", "dcgm_diag", "node2's dcgmi diag between jobs: GPU 4 fails the memory test")
class DiagFailed(Scenario):
    """``dcgmi diag -r 3 -j`` in DCGM 4's shape (``dcgmi_diag_json``), as tests/data/health/dcgmi_diag_r3_dcgm4_fail.json:
    software and PCIe pass on every GPU, GPU 4 fails ``memory`` with the double-bit ECC message DCGM gives
    (NVIDIA/DCGM issue #215).

    Live (``hpcwatch demo``), the same fault from ``SCENARIO_ONSET_S`` on: dcgm-exporter's last XID of GPU 4 reads
    48, the driver's "DBE (Double Bit Error) ECC Error" (https://docs.nvidia.com/deploy/xid-errors/), and stays
    there (the gauge holds the last XID until the driver reloads), so the ``xid`` rule drains node2; a check job
    the twin's Slurm runs there fails ``memory`` on GPU 4 (``diag_failures``): the fault persists."""

    node = "node2"
    bad_gpu = 4
    XID = 48
    WARNING: ClassVar[Mapping[str, Any]] = {
        "error_category": 10,
        "error_id": 12,
        "error_severity": 6,
        "warning": f"Detected 2 double-bit ECC error(s) on GPU {bad_gpu}.",
    }

    def __init__(self) -> None:
        self._onset = Onset()

    def _sick(self, t: float) -> bool:
        return self._onset.elapsed_s(t) >= 0

    def adjust_gpu(self, *, node: str, gpu: int, t: float, fields: dict[str, float]) -> None:
        if node == self.node and gpu == self.bad_gpu and self._sick(t):
            fields[vocab.DCGM_FI_DEV_XID_ERRORS] = float(self.XID)

    def diag_failures(self, *, node: str, t: float) -> dict[int, tuple[str, dict[str, Any]]]:
        return {self.bad_gpu: ("memory", dict(self.WARNING))} if node == self.node and self._sick(t) else {}

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        gpus = len(twin.gpus_of_node(self.node))
        text = dcgmi_diag_json(gpus, {self.bad_gpu: ("memory", dict(self.WARNING))})
        _write(out, self.node, "dcgmi_diag.json", text, t1)
