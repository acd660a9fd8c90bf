"""Two clusters to assess: one kept well, one neglected (``hpcwatch assess`` should tell them apart).

Both write, beside the twin's own scrapes (``extra_files``, under ``out/assess/``), what an
operator's collectors would leave: ``scontrol show config``, each node's
``/proc/driver/nvidia/params`` (as ``<node>/params``) and ``ibstat``, OpenSM's ``partitions.conf``, a dcgm-exporter
scrape of the passive health fields, nccl-tests output, and (well kept only) the active
checks ``dcgmi diag -j`` and ``ib_write_bw``. The neglected one breaks, on purpose:

    scrub off            node2's driver loaded with RMDisableScrubOnFree=1
    NCCL_ALGO forced     the training job's NCCL_DEBUG=INFO log says "NCCL_ALGO set by environment to Ring"
    a port at half rate  node2's mlx5_3 trained at 200 Gb/s on an NDR fabric
    no health checks     HealthCheckProgram = (null): no dcgmi diag, no ib_write_bw ran
    no topology          TopologyPlugin = topology/none
    gaps in monitoring   node2's dcgm-exporter silent for GAP_S in the middle of the run

``BREAKS`` names the assessment criteria those choices must fail, and only those.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson

from hpcwatch import vocab
from hpcwatch.twin.scenarios import Scenario, register

__all__ = [
    "WellKept",
    "Neglected",
    "NEGLECTED_BREAKS",
    "GAP_START_S",
    "GAP_S",
    "nccl_tests_text",
    "ib_write_bw_text",
]

#: The neglected node's dcgm-exporter stops this long after the run's first tick, for GAP_S.
GAP_START_S = 120.0
GAP_S = 90.0

#: Criteria (assess/criteria.py ids) the neglected cluster fails (its NCCL log forces NCCL_ALGO).
NEGLECTED_BREAKS = frozenset(
    {
        "monitoring-stack",
        "gpu-job-attribution",
        "healthcheck-program",
        "dcgm-healthchecks",
        "port-rate",
        "topology-conf",
        "hbm-memory-scrub",
        "detector-findings",
        "nccl-autoconfig",
    }
)

#: busbw of a healthy 2-node all-reduce at 8 GB over 8 NDR rails: 46.9 GB/s per 400 Gb/s NIC ("for NDR @ 400Gbps you
#: should see 46-48GB/s per NIC", https://github.com/NVIDIA/nccl-tests/issues/290) x 8 NICs per node (peak 400 GB/s).
_NCCL_GB_S = 8 * 46.9


def _config_text(*, healthcheck: bool, topology: bool) -> str:
    program = "/usr/sbin/nhc" if healthcheck else "(null)"
    return "\n".join(
        [
            "Configuration data as of 2026-07-01T00:00:00",
            "AccountingStorageType   = accounting_storage/slurmdbd",
            "AuthType                = auth/munge",
            "ClusterName             = reference",
            "GresTypes               = gpu",
            f"HealthCheckInterval     = {300 if healthcheck else 0} sec",
            "HealthCheckNodeState    = ANY",
            f"HealthCheckProgram      = {program}",
            "SlurmctldHost[0]        = head",
            f"TopologyPlugin          = {'topology/tree' if topology else 'topology/none'}",
            "",
        ]
    )


def _params_text(*, scrub_off: bool) -> str:
    dwords = '"RMDisableScrubOnFree=1"' if scrub_off else '""'
    return f"ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nRegistryDwords: {dwords}\n"


def _ibstat_text(hcas: int, *, slow: set[int]) -> str:
    out = []
    for h in range(hcas):
        rate = 200 if h in slow else 400
        out += [
            f"CA 'mlx5_{h}'",
            "\tCA type: MT4129",
            "\tNumber of ports: 1",
            "\tFirmware version: 28.39.1002",
            "\tPort 1:",
            "\t\tState: Active",
            "\t\tPhysical state: LinkUp",
            f"\t\tRate: {rate}",
            f"\t\tBase lid: {10 + h}",
            "\t\tLink layer: InfiniBand",
        ]
    return "\n".join(out) + "\n"


def _diag_json(gpus: int) -> str:
    ids = ",".join(str(g) for g in range(gpus))
    tests = [
        {"name": n, "results": [{"gpu_ids": ids, "status": "Pass"}]}
        for n in ("Denylist", "NVML Library", "Persistence Mode", "Page Retirement/Row Remap")
    ]
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": tests}], "version": "3.3.5"}}
    return "Successfully ran diagnostic for group.\n" + orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()


def nccl_tests_text(nodes: list[str], gpus: int, model: str) -> str:
    """``all_reduce_perf`` (nccl-tests) over ``gpus`` GPUs of each of ``nodes``, at the busbw of ``_NCCL_GB_S``."""
    lines = [
        "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    rank = 0
    for node in nodes:
        for g in range(gpus):
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {40000 + rank:6d} on {node:>10s} device {g:2d} "
                f"[0x{0x18 + g:02x}] {model}"
            )
            rank += 1
    n = rank
    factor = 2 * (n - 1) / n
    lines += [
        "#",
        "#                                                              out-of-place                  "
        "     in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw "
        "  busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s) "
        " (GB/s)       ",
    ]
    for size in (1 << 30, 1 << 33):
        algbw = _NCCL_GB_S / factor
        time_us = size / (algbw * 1e9) * 1e6
        busbw = algbw * factor
        lines.append(
            f"{size:12d} {size // 4:13d}     float     sum      -1 {time_us:8.1f} {algbw:7.2f} {busbw:7.2f}"
            f"       0 {time_us:8.1f} {algbw:7.2f} {busbw:7.2f}       0"
        )
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {_NCCL_GB_S:.3f} ", "#", ""]
    return "\n".join(lines)


def ib_write_bw_text(device: str) -> str:
    """``ib_write_bw -d DEVICE --report_gbits`` (perftest), the client's table, at NDR line rate."""
    return "\n".join(
        [
            "---------------------------------------------------------------------------------------",
            "                    RDMA_Write BW Test",
            f" Dual-port       : OFF\t\tDevice         : {device}",
            " Number of qps   : 1\t\tTransport type : IB",
            "---------------------------------------------------------------------------------------",
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
            " 65536      5000             391.87             391.62 \t\t   0.746956",
            " 1048576    5000             393.12             393.05 \t\t   0.046856",
            "---------------------------------------------------------------------------------------",
            "",
        ]
    )


def _nccl_log(node: str, *, forced_algo: bool) -> str:
    lines = [
        f"{node}:41873:41873 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
        f"{node}:41873:41873 [0] NCCL INFO cudaDriverVersion 12040",
        f"{node}:41873:41873 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ]
    if forced_algo:
        lines.append(f"{node}:41873:41873 [0] NCCL INFO NCCL_ALGO set by environment to Ring")
    return "\n".join(lines) + "\n"


def _health_scrape(twin: Any, node: str, t_ms: int) -> str:
    """A dcgm-exporter scrape of the passive health fields (default-counters.csv has them all), zeros."""
    fields = (
        vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
        vocab.DCGM_FI_DEV_ROW_REMAP_FAILURE,
        vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
        vocab.DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
    )
    out = []
    for name in fields:
        out += [f"# HELP {name} {name}.", f"# TYPE {name} gauge"]
        for labels in twin.labels_by_gpu(node, jobs_by_gpu={}):
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} 0 {t_ms}")
    return "\n".join(out) + "\n"


class _Kept(Scenario):
    """What both write; the neglected one overrides the choices."""

    neglected = False

    def __init__(self) -> None:
        self._t_first: float | None = None

    def _put(self, path: Path, text: str, t: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (t, t))  # readers of untimed formats date them by the file: the moment it was taken

    def absent_gpus(self, *, t: float) -> list[tuple[str, int]]:
        if self._t_first is None:
            self._t_first = t
        if not self.neglected or not GAP_START_S <= t - self._t_first < GAP_START_S + GAP_S:
            return []
        return [("node2", g) for g in range(8)]

    def extra_files(self, *, twin: Any, out: Path, t0: float, t1: float) -> None:
        root = out / "assess"
        shutil.rmtree(root, ignore_errors=True)  # a rerun into the same folder must not keep the last run's files
        bad = self.neglected
        self._put(root / "slurm" / "scontrol_show_config.txt", _config_text(healthcheck=not bad, topology=not bad), t1)
        self._put(
            root / "opensm" / "partitions.conf",
            "# tenants isolated: every port a limited member of the default partition\n"
            "Default=0x7fff, ipoib : ALL=limited, SELF=full;\n",
            t1,
        )
        nodes = list(twin.node_names)
        model = twin.cluster.nodes[0].gpus[0].spec.name
        for node in nodes:
            gpus = len(twin.cluster.node(node).gpus)
            n_hcas = len(twin.ports_of_node(node))
            folder = root / node
            # ingest names the host from the file's folder: <node>/params, as `cp /proc/driver/nvidia/params node1/`
            self._put(folder / "params", _params_text(scrub_off=bad and node == "node2"), t1)
            self._put(folder / "ibstat.txt", _ibstat_text(n_hcas, slow={3} if bad and node == "node2" else set()), t1)
            self._put(folder / "dcgm-health.prom", _health_scrape(twin, node, int(t1 * 1000)), t1)
            if not bad:
                self._put(folder / "dcgmi_diag.json", _diag_json(gpus), t1)
                self._put(folder / "ib_write_bw.txt", ib_write_bw_text("mlx5_0"), t1)
        self._put(root / nodes[0] / "all_reduce_perf.txt", nccl_tests_text(nodes, 8, model), t1)
        self._put(root / nodes[0] / "nccl_debug.log", _nccl_log(nodes[0], forced_algo=bad), t1)


@register
class WellKept(_Kept):
    name = "well_kept"
    description = "a well-kept cluster: health checks, topology, scrubbing, every port at rate (for hpcwatch assess)"


@register
class Neglected(_Kept):
    name = "neglected"
    description = (
        "a neglected cluster: scrub off, NCCL_ALGO forced, a port at half rate, no HealthCheckProgram, "
        "gaps in monitoring (for hpcwatch assess)"
    )
    neglected = True
