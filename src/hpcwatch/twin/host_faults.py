"""Host faults the node-level checks find: one scenario per host rule, each writing the real output of the tool
that shows it (``out/host/<node>/...``) beside the twin's scrapes.

=======================  ======================================================  =========================
scenario                 what it writes (node2 unless said)                      rules that fire
=======================  ======================================================  =========================
``nvme_failing``         ``smartctl --json`` of an NVMe drive: critical warning  ``nvme_critical_warning``,
                         0x04 (reliability degraded), media errors               ``nvme_media_errors``
``nvme_worn_out``        ``smartctl --json``: node1's scratch NVMe at 104 % of   ``nvme_spare``,
                         its endurance, spare 4 % under its 10 % threshold       ``nvme_wear``
``nvme_overheating``     ``smartctl --json``: critical warning 0x02 (past its    ``nvme_temperature``
                         temperature threshold)
``sata_drive_failing``   ``smartctl --json``: node1's SATA boot SSD FAILED its   ``smart_status``
                         SMART self-assessment
``disk_full``            the agent's ``df --output``: / at 98 % used             ``disk_space``
``inodes_exhausted``     the agent's ``df --output``: node1's / with 2,288 of    ``disk_inodes``
                         6,553,600 inodes left, 57 % of its space free
``dimm_failing``         EDAC counters (``grep -H`` of sysfs): an uncorrected    ``memory_uncorrected``,
                         error and 25 corrected ones on controller 0's DIMM 1    ``memory_corrected``
``pcie_degraded``        ``lspci -vv``: node1's GPU 3 (an H100) trained at x8,   ``pcie_width``
                         busy as lspci reads it
``hca_pcie_slow``        ``lspci -vv -d 15b3:``: mlx5_5 at 16 of 32 GT/s         ``pcie_speed``
``pcie_gen_degraded``    ``nvidia-smi --query-gpu=...pcie.link.gen...`` on        ``pcie_gen``
                         every node: node1's GPU 2 at Gen 4 of 5, busy
``clock_drift``          ``chronyc tracking``: 2.5 s fast of NTP time            ``clock_offset``
``clock_unsynchronised`` ``chronyc tracking``: node1's chrony has no source,     ``clock_unsynchronised``
                         Not synchronised
``service_failed``       ``systemctl --failed --output=json``: fabric manager    ``failed_units``
``kernel_hung_task``     ``dmesg -T``: a task blocked for more than 120 s        ``hung_task``
``oom_killed``           ``dmesg -T``: a job step's cgroup OOM kill              ``oom_kill``
``hardware_error``       ``dmesg -T``: node1's firmware reports a corrected      ``hw_error``
                         DRAM error (EDAC CE, APEI GHES)
``hca_firmware_hung``    ``dmesg -T``: node1's mlx5_0 firmware stops answering   ``nic_driver``
                         commands (mlx5_core command timeouts)
``ib_port_down``         ``ibstat``: mlx5_3's port Down / Polling                ``ib_port``
``bmc_psu_failure``      ``ipmitool sel elist``: PSU2 Failure detected           ``ipmi_sel``
``bmc_fan_critical``     ``ipmitool sdr elist``: a fan at 0 RPM in critical, its ``bmc_sensor``,
                         neighbour PSU failed under an ``ok`` status             ``bmc_psu_fan``
``diag_failed``          ``dcgmi diag -r 3 -j`` (DCGM 4) run between jobs: GPU 4  ``dcgm_diag``
                         fails the memory test (double-bit ECC errors)
``nccl_tests_wrong``     nccl-tests ``all_reduce_perf`` over node1's GPUs        ``nccl_tests``
                         between jobs: wrong in-place results
``ib_write_bw_low``      ``ib_write_bw`` between jobs: mlx5_3 at 188 Gb/s of     ``ib_write_bw``
                         NDR's 400
=======================  ======================================================  =========================

``diag_failed``, ``nccl_tests_wrong`` and ``ib_write_bw_low`` are active checks' outputs (benchmarks the node ran
between jobs, as ``hpcwatch act`` runs them), not passive readings; the other files are what an agent collects.
Live, ``diag_failed`` is also the one fault here the exporters show (GPU 4's XID 48) and that a check job fails on
(``diag_failures``): the demo's remediation keeps its node drained. Each file is dated by the run's end (its write
time is set to it; smartctl's ``local_time``, dmesg's and the SEL's clocks read the twin's), so it is judged in the
window. None of these tools prints the host it ran on: ingest a node's folder naming it, ``hpcwatch ingest --host
node2 out/host/node2``, as an agent would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

from hpcwatch import vocab
from hpcwatch.twin.devices import DRIVER_VERSION, FIELD, bus_id
from hpcwatch.twin.failures import Onset
from hpcwatch.twin.host_tools import ibstat_text, write_host_file
from hpcwatch.twin.scenarios import Scenario, register

__all__ = ["HOST_FAULT_RULES", "DIAG_TESTS", "dcgmi_diag_json"]

#: scenario -> the health rule its file makes fire (tests/unit/test_twin_host_faults.py checks each).
HOST_FAULT_RULES: dict[str, str] = {}


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


def _smartctl_nvme(device: str, serial: str, t1: float, status: dict[str, Any], log: dict[str, int]) -> str:
    """``smartctl --json -a /dev/<device>`` of one of the twin's NVMe drives (smartctl 7.3's shape, as
    tests/data/smartctl's captures): ``status`` its ``smart_status``, ``log`` its SMART / Health log."""
    failing = not status.get("passed", True)
    doc = {
        "json_format_version": [1, 0],
        "smartctl": {
            "version": [7, 3],
            "argv": ["smartctl", "--json", "-a", f"/dev/{device}"],
            "exit_status": 8 if failing else 0,  # bit 3: SMART status check returned "DISK FAILING"
        },
        "device": {"name": f"/dev/{device}", "info_name": f"/dev/{device}", "type": "nvme", "protocol": "NVMe"},
        "model_name": "SAMSUNG MZQL23T8HCLS-00A07",
        "serial_number": serial,
        "local_time": {"time_t": int(t1)},
        "smart_status": status,
        "nvme_smart_health_information_log": log,
        "temperature": {"current": log["temperature"]},
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()


class _HostCapture(Scenario):
    """A tool's output that does not change with time: ``text`` as the node's ``file``, dated by the run's end."""

    node = "node2"
    file = ""
    text = ""

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        write_host_file(out, self.node, self.file, self.text, t1)


class _NvmeFault(Scenario):
    """One NVMe drive's ``smartctl --json -a``: its ``smart_status`` and SMART / Health log are the scenario's."""

    node = "node2"
    device, serial = "nvme0", "S64HNE0T000000"
    status: ClassVar[Mapping[str, Any]] = {}
    log: ClassVar[Mapping[str, int]] = {}

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        text = _smartctl_nvme(self.device, self.serial, t1, dict(self.status), dict(self.log))
        write_host_file(out, self.node, f"smartctl_{self.device}.json", text, t1)


def _health_log(**log: int) -> dict[str, int]:
    """A SMART / Health log: a sound drive's (cool, all spare left, 10 % threshold), with ``log``'s fields."""
    sound = {
        "critical_warning": 0,
        "temperature": 41,
        "available_spare": 100,
        "available_spare_threshold": 10,
        "percentage_used": 3,
        "media_errors": 0,
        "num_err_log_entries": 0,
    }
    return {**sound, **log}


@_host_fault("nvme_failing", "nvme_critical_warning", "node2's NVMe drive reports reliability degraded (smartctl)")
class NvmeFailing(_NvmeFault):
    status: ClassVar[Mapping[str, Any]] = {"passed": False, "nvme": {"value": 4, "reliability_degraded": True}}
    log: ClassVar[Mapping[str, int]] = _health_log(critical_warning=4, media_errors=12, num_err_log_entries=40)


@_host_fault("nvme_worn_out", "nvme_spare", "node1's scratch NVMe drive is past its rated endurance, spare used up")
class NvmeWornOut(_NvmeFault):
    """A scratch drive written to death by checkpoints: 104 % of its rated endurance used (the log may pass 100),
    available spare at 4 % under the drive's own 10 % threshold, so the controller raises Critical Warning bit
    0x01. Both drain (``nvme_spare``, ``nvme_wear``); no data lost yet (no media errors)."""

    node = "node1"
    device, serial = "nvme1", "S64HNE0T000017"
    status: ClassVar[Mapping[str, Any]] = {"passed": False, "nvme": {"value": 1, "spare_below_threshold": True}}
    log: ClassVar[Mapping[str, int]] = _health_log(
        critical_warning=1, temperature=44, available_spare=4, percentage_used=104
    )


@_host_fault("nvme_overheating", "nvme_temperature", "node2's NVMe drive passed its temperature threshold (smartctl)")
class NvmeOverheating(_NvmeFault):
    """A drive behind a failed fan: its composite temperature passed the over-temperature threshold the drive
    holds, so it raises Critical Warning bit 0x02 (``nvme_temperature`` warns; the drive throttles itself)."""

    serial = "S64HNE0T000002"
    status: ClassVar[Mapping[str, Any]] = {"passed": False, "nvme": {"value": 2, "temperature": True}}
    log: ClassVar[Mapping[str, int]] = _health_log(critical_warning=2, temperature=84, percentage_used=6)


@_host_fault("sata_drive_failing", "smart_status", "node1's SATA boot drive fails its SMART self-assessment")
class SataDriveFailing(Scenario):
    """``smartctl --json -a /dev/sda`` of a SATA boot SSD whose overall-health self-assessment FAILED (the shape of
    tests/data/smartctl/sat_wdc_wd20efrx_passed.json, ``smart_status.passed`` false, exit status bit 3)."""

    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        doc = {
            "json_format_version": [1, 0],
            "smartctl": {"version": [7, 3], "argv": ["smartctl", "--json", "-a", "/dev/sda"], "exit_status": 8},
            "device": {"name": "/dev/sda", "info_name": "/dev/sda [SAT]", "type": "sat", "protocol": "ATA"},
            "model_name": "Micron_5300_MTFDDAV480TDS",
            "serial_number": "MSA2140000X",
            "local_time": {"time_t": int(t1)},
            "smart_status": {"passed": False},
            "temperature": {"current": 38},
            "power_on_time": {"hours": 31022},
        }
        write_host_file(out, self.node, "smartctl_sda.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode(), t1)


@_host_fault("disk_full", "disk_space", "node2's root file system is 98 % full (df, as the agent runs it)")
class DiskFull(_HostCapture):
    """The agent's ``df --local --output=...`` (deploy/hpcwatch-agent.toml): / at 2 % available (under the 3 %
    that drains), a local NVMe scratch half full, and a tmpfs at 100 % that the rules leave alone."""

    node = "node2"
    file = "df.txt"
    text = (
        "Filesystem     Type   Inodes  IUsed   IFree IUse%  1K-blocks      Used     Avail Use% Mounted on\n"
        "/dev/nvme0n1p2 ext4  6553600 412377 6141223    7%  102626232  98464216   2064152  98% /\n"
        "tmpfs          tmpfs 2050305      1 2050304    1%     819200    819200         0 100% /run/user/0\n"
        "/dev/md0       xfs 750000000  20118 749979882  1% 7500000000 3600000000 3900000000  49% /scratch\n"
    )


@_host_fault("inodes_exhausted", "disk_inodes", "node1's root file system has no inode left (df, as the agent runs it)")
class InodesExhausted(_HostCapture):
    """The agent's ``df --local --output=...`` (as ``disk_full``): a job untarred millions of small files into /tmp
    on the root file system, 2,288 inodes of 6,553,600 left (under the 3 % that drains) while 57 % of its space is
    free: no file can be created there."""

    node = "node1"
    file = "df.txt"
    text = (
        "Filesystem     Type   Inodes   IUsed   IFree IUse%  1K-blocks      Used     Avail Use% Mounted on\n"
        "/dev/nvme0n1p2 ext4  6553600 6551312    2288  100%  102626232  41230712  56264208  43% /\n"
        "tmpfs          tmpfs 2050305       1 2050304    1%     819200         0    819200   0% /run/user/0\n"
        "/dev/md0       xfs 750000000  20118 749979882  1% 7500000000 3600000000 3900000000  49% /scratch\n"
    )


@_host_fault("dimm_failing", "memory_uncorrected", "node2's memory controller 0 logged an uncorrected error (EDAC)")
class DimmFailing(_HostCapture):
    """The agent's ``grep -H . .../edac/mc/mc*/*e_count ...`` (deploy/hpcwatch-agent.toml): controller 0 has an
    uncorrected error and 25 corrected ones, all on one DIMM; controller 1 is clean."""

    node = "node2"
    file = "edac_counts.txt"
    text = "".join(
        f"/sys/devices/system/edac/mc/{counter}\n"
        for counter in (
            "mc0/ce_count:25",
            "mc0/ue_count:1",
            "mc1/ce_count:0",
            "mc1/ue_count:0",
            "mc0/dimm0/dimm_ce_count:0",
            "mc0/dimm0/dimm_ue_count:0",
            "mc0/dimm1/dimm_ce_count:25",
            "mc0/dimm1/dimm_ue_count:1",
            "mc1/dimm0/dimm_ce_count:0",
            "mc1/dimm0/dimm_ue_count:0",
        )
    )


@_host_fault("pcie_degraded", "pcie_width", "node1's GPU 3 trained its PCIe link at x8 of x16 (lspci -vv)")
class PcieDegraded(Scenario):
    """node1's GPU 3 (bus 5d:00.0, ``devices.bus_id(3)``) at x8 of x16 while the training job keeps it busy:
    dcgm-exporter's utilisation of that bus id, scraped as lspci runs, corroborates the narrow link, so it drains
    (an idle GPU narrow in lspci only warns: its link may be power-managed)."""

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
        write_host_file(out, self.node, "lspci_vv.txt", "\n".join(blocks), t1)


#: The twin's HCAs' PCI bus numbers, by HCA (its own layout: no vendor's is copied; apart from the GPUs',
#: devices.HGX_BUS_IDS).
HCA_BUSES = ("10", "20", "30", "40", "80", "90", "a0", "b0")


@_host_fault("hca_pcie_slow", "pcie_speed", "node2's mlx5_5 trained its PCIe link at 16 of 32 GT/s (lspci -vv)")
class HcaPcieSlow(Scenario):
    """``sudo lspci -vv -d 15b3:`` (the node's Mellanox devices, named as the real ConnectX-7 of
    tests/data/lspci/lspci_vvv_rtx6000ada_connectx7_stelline.txt): every one at Gen5 x16 but HCA 5, which trained
    at Gen4's 16 GT/s (a riser or slot of an older generation reads the same): ``pcie_speed`` warns."""

    node = "node2"
    slow_hca = 5

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        blocks = []
        for hca in range(len(twin.ports_of_node(self.node))):
            speed = "16GT/s (downgraded)" if hca == self.slow_hca else "32GT/s"
            blocks.append(
                f"{HCA_BUSES[hca % len(HCA_BUSES)]}:00.0 Infiniband controller: Mellanox Technologies MT2910 Family "
                "[ConnectX-7]\n"
                "\tSubsystem: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
                "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+\n"
                "\tCapabilities: [60] Express (v2) Endpoint, MSI 00\n"
                "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
                f"\t\tLnkSta:\tSpeed {speed}, Width x16\n"
                "\tKernel driver in use: mlx5_core\n"
            )
        write_host_file(out, self.node, "lspci_vv.txt", "\n".join(blocks), t1)


@_host_fault("pcie_gen_degraded", "pcie_gen", "node1's GPU 2 runs its PCIe link at Gen 4 of 5 under load (nvidia-smi)")
class PcieGenDegraded(Scenario):
    """``nvidia-smi --query-gpu=timestamp,index,pci.bus_id,utilization.gpu,pcie.link.gen.current,
    pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv`` on every node at the run's end
    (the utilisation the twin's GPUs have then): node1's GPU 2, busy in the training job, at Gen 4 where it and its
    slot allow Gen 5 (H100 SXM5, 32 GT/s as lspci's LnkCap gives it). The others at Gen 5 x16, or Gen 1 when idle."""

    node = "node1"
    gpu = 2

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(t1)) + f".{int(t1 * 1000) % 1000:03d}"
        header = (
            "timestamp, index, pci.bus_id, utilization.gpu [%], pcie.link.gen.current, pcie.link.gen.max, "
            "pcie.link.width.current, pcie.link.width.max\n"
        )
        for node in twin.node_names:
            rows = []
            for index, row in enumerate(twin.gpus_of_node(node)):
                util = int(twin.fields[row, FIELD[vocab.DCGM_FI_DEV_GPU_UTIL]])
                # a GPU with no work drops its link to Gen 1 to save power, as the real idle GPUs of
                # tests/data/nvidia_smi do (the rule does not judge it); the planted one stays at Gen 4 under load
                gen = 4 if (node, index) == (self.node, self.gpu) else 1 if util == 0 else 5
                rows.append(f"{stamp}, {index}, {bus_id(index)}, {util} %, {gen}, 5, 16, 16\n")
            write_host_file(out, node, "nvidia_smi_pcie.csv", header + "".join(rows), t1)


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
        write_host_file(out, self.node, "chronyc_tracking.txt", text, t1)


@_host_fault("clock_unsynchronised", "clock_unsynchronised", "node1's chrony has no time source (chronyc tracking)")
class ClockUnsynchronised(_HostCapture):
    """``chronyc tracking`` of a chronyd that never reached a server (the NTP servers unreachable from the node's
    network): reference 00000000, stratum 0, Leap status Not synchronised, as the real capture
    tests/data/chrony/chronyc_tracking_not_synchronised_liaosirui.txt prints it. The clock drifts on its own."""

    node = "node1"
    file = "chronyc_tracking.txt"
    text = (
        "Reference ID    : 00000000 ()\n"
        "Stratum         : 0\n"
        "Ref time (UTC)  : Thu Jan 01 00:00:00 1970\n"
        "System time     : 0.000000000 seconds fast of NTP time\n"
        "Last offset     : +0.000000000 seconds\n"
        "RMS offset      : 0.000000000 seconds\n"
        "Frequency       : 0.000 ppm slow\n"
        "Residual freq   : +0.000 ppm\n"
        "Skew            : 0.000 ppm\n"
        "Root delay      : 1.000000000 seconds\n"
        "Root dispersion : 1.000000000 seconds\n"
        "Update interval : 0.0 seconds\n"
        "Leap status     : Not synchronised\n"
    )


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
        write_host_file(out, self.node, "systemctl_failed.json", orjson.dumps(units).decode() + "\n", t1)


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
        write_host_file(out, self.node, "dmesg.txt", text, t1)


@_host_fault("oom_killed", "oom_kill", "the OOM killer ends a job's process on node2 (dmesg -T)")
class OomKilled(Scenario):
    """A job step on node2 outgrows its Slurm memory cgroup: the kernel's OOM killer ends its Python process, the
    lines a 6.x kernel prints (``invoked oom-killer``, ``oom-kill:constraint=CONSTRAINT_MEMCG``, ``Memory cgroup
    out of memory: Killed process``). The job died; the node may be fine (``oom_kill`` warns)."""

    node = "node2"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        t = _ctime(t1 - 20)
        cgroup = "/system.slice/slurmstepd.scope/job_4104/step_0"
        text = (
            f"[{t}] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n"
            f"[{t}] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=step_0,mems_allowed=0-1,"
            f"oom_memcg={cgroup},task_memcg={cgroup}/user/task_0,task=python,pid=51207,uid=1001\n"
            f"[{t}] Memory cgroup out of memory: Killed process 51207 (python) total-vm:412734208kB, "
            "anon-rss:250611712kB, file-rss:131072kB, shmem-rss:0kB, UID:1001 pgtables:493568kB oom_score_adj:0\n"
        )
        write_host_file(out, self.node, "dmesg.txt", text, t1)


@_host_fault("hardware_error", "hw_error", "node1's firmware reports a corrected memory error (dmesg -T, APEI GHES)")
class HardwareError(Scenario):
    """A DIMM of node1 corrects an error and the firmware reports it through APEI GHES: the EDAC line and the
    ``[Hardware Error]`` block of tests/data/kernel_log/syslog_edac_mc2_ce_ghes_corrected_liaosirui.txt, as
    ``dmesg -T`` prints them. Corrected: ``hw_error`` warns (a fatal or uncorrected one would drain)."""

    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        t = _ctime(t1 - 40)
        text = (
            f"[{t}] EDAC MC2: 1 CE memory read error on CPU_SrcID#0_MC#2_Chan#0_DIMM#0 (channel:0 slot:0 "
            "page:0x90ba03 offset:0x400 grain:32 syndrome:0x0 -  err_code:0x0080:0x0090)\n"
            f"[{t}] {{1}}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0\n"
            f"[{t}] {{1}}[Hardware Error]: It has been corrected by h/w and requires no further action\n"
            f"[{t}] {{1}}[Hardware Error]: event severity: corrected\n"
            f"[{t}] {{1}}[Hardware Error]:  Error 0, type: corrected\n"
            f"[{t}] {{1}}[Hardware Error]:   section_type: memory error\n"
            f"[{t}] {{1}}[Hardware Error]:    error_status: Storage error in DRAM memory (0x0000000000000400)\n"
        )
        write_host_file(out, self.node, "dmesg.txt", text, t1)


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
        write_host_file(out, self.node, "dmesg.txt", text, t1)


@_host_fault("ib_port_down", "ib_port", "node2's mlx5_3 port is down, polling for a peer (ibstat)")
class IbPortDown(Scenario):
    """``ibstat`` of node2 (twin/host_tools.ibstat_text): mlx5_3's port Down / Polling, as an unplugged or dead
    cable leaves it (rate 10, no lid); the others Active at the fabric's rate. ``ib_port`` drains."""

    node = "node2"
    hca = 3

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        write_host_file(out, self.node, "ibstat.txt", ibstat_text(twin, self.node, down=self.hca), t1)


@_host_fault("bmc_psu_failure", "ipmi_sel", "node1's BMC logs a power supply failure (ipmitool sel elist)")
class BmcPsuFailure(Scenario):
    node = "node1"

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        day, clock = time.strftime("%m/%d/%Y", time.gmtime(t1 - 60)), time.strftime("%H:%M:%S", time.gmtime(t1 - 60))
        text = (
            f"   1 | {day} | {clock} | Power Supply PSU2_Status | Failure detected | Asserted\n"
            f"   2 | {day} | {clock} | Power Supply PSU_Redundancy | Redundancy Lost | Asserted\n"
        )
        write_host_file(out, self.node, "ipmitool_sel_elist.txt", text, t1)


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
        write_host_file(out, self.node, "ipmitool_sdr_elist.txt", text, t1)


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
        write_host_file(out, self.node, "dcgmi_diag.json", text, t1)


#: Message sizes of the twin's all_reduce_perf run: -b 1M -e 8G -f 2, as tests/data/health's 8 x H100 output.
NCCL_TESTS_SIZES = tuple(1 << k for k in range(20, 34))


def _nccl_tests_time_s(size: int, ranks: int, bytes_s: float) -> float:
    """The twin's ring all-reduce time of ``size`` bytes over ``ranks`` GPUs (twin/training.py's model, T =
    2(p-1)alpha + 2(p-1)/p n/B, B one NVLink direction)."""
    from hpcwatch.twin.training import RING_ALPHA_S

    return 2 * (ranks - 1) * RING_ALPHA_S + 2 * (ranks - 1) / ranks * size / bytes_s


def _nccl_time(us: float) -> str:
    """nccl-tests' time column: two decimals under 100 us, one under 10,000, none past it."""
    return f"{us:7.2f}" if us < 100 else f"{us:7.1f}" if us < 10_000 else f"{us:7.0f}"


@_host_fault("nccl_tests_wrong", "nccl_tests", "node1's all_reduce_perf between jobs returns wrong results in place")
class NcclTestsWrong(Scenario):
    """nccl-tests' ``all_reduce_perf -b 1M -e 8G -f 2 -g 1`` under mpirun over node1's 8 GPUs (the layout of
    tests/data/health/nccl_all_reduce_perf_1node_8xh100.out, times from the twin's ring model over NVLink): from
    256 MiB on, the in-place results are wrong (a GPU corrupts data silently), so nccl-tests ends FAILED and
    ``nccl_tests`` drains."""

    node = "node1"
    WRONG_FROM = 1 << 28
    WRONG = 2
    """Wrong elements nccl-tests counts in each in-place result from WRONG_FROM on."""

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        flat = twin.gpus_of_node(self.node)
        model = twin.gpu_labels[flat[0]]["modelName"]
        ranks, bytes_s = len(flat), twin.cluster.gpus[flat[0]].spec.nvlink_bandwidth_bytes_s / 2
        lines = [
            "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0",
            "#",
            "# Using devices",
            *(
                f"#  Rank {r:2d} Group  0 Pid {41873 + r:6d} on {self.node:>10} device {r:2d} "
                f"[0x{bus_id(r)[9:11].lower()}] {model}"
                for r in range(ranks)
            ),
            "#",
            "#                                                              out-of-place                       "
            "in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
            "busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
            "(GB/s)       ",
        ]
        busbws, wrong_total = [], 0
        for size in NCCL_TESTS_SIZES:
            time_us = _nccl_tests_time_s(size, ranks, bytes_s) * 1e6
            algbw = size / time_us / 1e3
            busbw = algbw * 2 * (ranks - 1) / ranks
            wrong = self.WRONG if size >= self.WRONG_FROM else 0
            wrong_total += wrong
            busbws += [busbw, busbw]
            result = f"{_nccl_time(time_us)}  {algbw:6.2f}  {busbw:6.2f}"
            lines.append(
                f"{size:12d}  {size // 4:12d}     float     sum      -1  {result}  {0:5d}  {result}  {wrong:5d}"
            )
        lines += [
            f"# Out of bounds values : {wrong_total} {'FAILED' if wrong_total else 'OK'}",
            f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f} ",
            "#",
        ]
        write_host_file(out, self.node, "all_reduce_perf.out", "\n".join(lines) + "\n", t1)


@_host_fault("ib_write_bw_low", "ib_write_bw", "node2's mlx5_3 reaches under half of NDR in ib_write_bw between jobs")
class IbWriteBwLow(Scenario):
    """perftest's ``ib_write_bw -d mlx5_3 --report_gbits`` from node2 to a peer between jobs, in the layout of
    tests/data/health/ib_write_bw_ndr_gbits.out: 188 Gb/s on a 400 Gb/s NDR port (a link that lost lanes or a
    congested path), under the half of the link rate that drains (``ib_write_bw``)."""

    node = "node2"
    hca = 3
    BW_GBPS = ((65536, 187.91, 187.62), (1048576, 188.44, 188.31))
    """(message bytes, BW peak, BW average) the run measures, Gb/s."""

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        rule = "-" * 87
        rows = [
            f" {size:<10d} 5000           {peak:8.2f}           {avg:8.2f} \t\t   {avg * 1e9 / 8 / size / 1e6:.6f}"
            for size, peak, avg in self.BW_GBPS
        ]
        text = (
            f"{rule}\n                    RDMA_Write BW Test\n"
            f" Dual-port       : OFF\t\tDevice         : mlx5_{self.hca}\n"
            " Number of qps   : 1\t\tTransport type : IB\n"
            " Connection type : RC\t\tUsing SRQ      : OFF\n"
            " PCIe relax order: ON\n ibv_wr* API     : ON\n TX depth        : 128\n CQ Moderation   : 1\n"
            " Mtu             : 4096[B]\n Link type       : IB\n Max inline data : 0[B]\n rdma_cm QPs\t : OFF\n"
            f" Data ex. method : Ethernet\n{rule}\n"
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            + "\n".join(rows)
            + f"\n{rule}\n"
        )
        write_host_file(out, self.node, "ib_write_bw.out", text, t1)
