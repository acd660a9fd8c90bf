"""The built-in formats, registered in sniff order (specific first, lenient last).

Each line is one format: its name, its sniff, an adapter that hands the reader what
the context knows (the node a file belongs to, what to do with a bad line), what it
yields. Readers are imported when a file of theirs is read, not when this table loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpcwatch.sources.registry import Format, Head, ReadContext, register

if TYPE_CHECKING:  # the readers load with their first file, not with this table
    import pyarrow as pa

    from hpcwatch.records import Event, Job, Sample, Span
    from hpcwatch.sources.manifest import ShardManifest
    from hpcwatch.sources.osv import OsvDatabase
    from hpcwatch.traces import KinetoTrace

__all__: list[str] = []

S, E, SP, J = frozenset({"samples"}), frozenset({"events"}), frozenset({"spans"}), frozenset({"jobs"})


def _first_line(head: Head) -> str:
    return head.text.lstrip().split("\n", 1)[0]


def _json_object_head(head: Head) -> str:
    return head.text.lstrip() if head.text.lstrip().startswith("{") else ""


# -- training-loop hook, security logs (JSON lines: the first line decides) ----------------------------------


def _hook(p: Path, c: ReadContext) -> Iterator[Span | Sample]:
    from hpcwatch.sources import hook

    return hook.read_hook_jsonl(p, on_bad_line=c.on_bad_line)


def _sniff_hook(h: Head) -> bool:
    from hpcwatch.sources import hook

    return hook.is_hook_jsonl(h.text)


def _falco(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import falco

    return falco.read_falco_json(p, on_bad_line=c.on_bad_line)


def _tetragon(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import tetragon

    return tetragon.read_tetragon_json(p, on_bad_line=c.on_bad_line)


def _sniff_falco(h: Head) -> bool:
    from hpcwatch.sources import falco

    return falco.is_falco_json(h.text)


def _sniff_tetragon(h: Head) -> bool:
    from hpcwatch.sources import tetragon

    return tetragon.is_tetragon_json(h.text)


register(
    Format(
        name="hook-jsonl",
        sniff=_sniff_hook,
        read=_hook,
        kinds=SP | S,
        line_oriented=True,
        summary="the PyTorch hook's spans and samples (instrument/torch.py), one JSON object a line",
    )
)
register(
    Format(
        name="falco-json",
        sniff=_sniff_falco,
        read=_falco,
        kinds=E,
        line_oriented=True,
        summary="Falco alerts, JSON lines",
    )
)
register(
    Format(
        name="tetragon-json",
        sniff=_sniff_tetragon,
        read=_tetragon,
        kinds=E,
        line_oriented=True,
        summary="Tetragon events (process_exec, process_kprobe...), JSON lines",
    )
)

# -- active health tools ---------------------------------------------------------------------------------------


def _health(reader_name: str) -> Callable[[Path, ReadContext], Iterator[Event]]:
    def read(p: Path, c: ReadContext) -> Iterator[Event]:
        from hpcwatch.sources import healthtools

        events: Iterator[Event] = getattr(healthtools, reader_name)(p, node=c.host)
        return events

    return read


register(
    Format(
        name="dcgmi-diag",
        read=_health("read_dcgmi_diag"),
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        sniff=lambda h: '"DCGM GPU Diagnostic"' in h.text or '"DCGM Diagnostic"' in h.text,
        summary="dcgmi diag -j output (DCGM 3 and 4)",
    )
)
register(
    Format(
        name="nccl-tests",
        read=_health("read_nccl_tests"),
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        sniff=lambda h: "# nThread" in h.text and "algbw" in h.text,
        summary="nccl-tests output",
    )
)
register(
    Format(
        name="ib-write-bw",
        read=_health("read_ib_write_bw"),
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        sniff=lambda h: "#bytes" in h.text and "BW peak[" in h.text,
        summary="perftest ib_write_bw output",
    )
)

# -- the ML stack's own logs: NCCL_DEBUG=INFO, PyTorch's Flight Recorder (after nccl-tests, whose output
# carries NCCL INFO lines too) -----------------------------------------------------------------------------


def _nccl_log(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import nccl_log

    return nccl_log.read_nccl_log(p, on_bad_line=c.on_bad_line)


def _sniff_nccl_log(h: Head) -> bool:
    # The sniff's own module, not the reader's: that one compiles ~20 patterns when it loads, a cost
    # every `steps` start would pay, as its traces are sniffed after this format (benchmarks/RESULTS.md).
    from hpcwatch.sources.nccl_sniff import is_nccl_log

    return is_nccl_log(h.text)


def _flight_recorder(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import flight_recorder

    return iter([flight_recorder.read_flight_recorder(p)])


def _sniff_flight_recorder(h: Head) -> bool:
    from hpcwatch.sources import flight_recorder

    return flight_recorder.is_flight_recorder(h.raw)


register(
    Format(
        name="flight-recorder",
        sniff=_sniff_flight_recorder,
        read=_flight_recorder,
        kinds=E,
        dated_by_file=True,
        summary="PyTorch Flight Recorder dump of one rank (pickle, read without running code, or JSON)",
    )
)


def _nccl_inspector(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import nccl_inspector

    return nccl_inspector.read_nccl_inspector(p)


def _sniff_nccl_inspector(h: Head) -> bool:
    from hpcwatch.sources import nccl_inspector

    return nccl_inspector.is_nccl_inspector(h.text)


register(
    Format(
        name="nccl-inspector",
        sniff=_sniff_nccl_inspector,
        read=_nccl_inspector,
        kinds=E,
        summary="NCCL Inspector JSON (per-collective timing from NCCL's profiler plugin)",
    )
)
register(
    Format(
        name="nccl-log",
        sniff=_sniff_nccl_log,
        read=_nccl_log,
        kinds=E,
        line_oriented=True,
        dated_by_file=True,
        summary="NCCL_DEBUG=INFO log (and PyTorch watchdog timeout lines)",
    )
)

# -- host settings ---------------------------------------------------------------------------------------------


def _params(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import procparams

    return procparams.read_nvidia_params(p, host=c.host)


def _sniff_params(h: Head) -> bool:
    from hpcwatch.sources import procparams

    return procparams.is_nvidia_params(h.text, h.name)


def _partitions(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import opensm

    return opensm.read_partitions_conf(p)


def _sniff_partitions(h: Head) -> bool:
    from hpcwatch.sources import opensm

    return opensm.is_partitions_conf(h.text, h.name)


register(
    Format(
        name="nvidia-params",
        sniff=_sniff_params,
        read=_params,
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        summary="/proc/driver/nvidia/params",
    )
)
register(
    Format(
        name="opensm-partitions",
        sniff=_sniff_partitions,
        read=_partitions,
        kinds=E,
        dated_by_file=True,
        summary="OpenSM partitions.conf",
    )
)

# -- documents that are not records: a shard manifest, OSV advisories, a trace, an op table ----------------------


def _manifest(p: Path, c: ReadContext) -> ShardManifest:
    from hpcwatch.sources import manifest

    return manifest.read_manifest(p)


def _osv(p: Path, c: ReadContext) -> OsvDatabase:
    from hpcwatch.sources import osv

    return osv.read_osv(p)


def _sniff_osv_record(h: Head) -> bool:
    text = _json_object_head(h)
    return bool(text) and '"affected"' in text and '"id"' in text and '"traceEvents"' not in text[:4096]


def _sniff_osv_zip(h: Head) -> bool:
    return h.raw.startswith(b"PK\x03\x04") and h.name.endswith(".zip")


def _sniff_osv_dir(h: Head) -> bool:
    names = h.text.split("\n")
    return (
        bool(names)
        and all(n.endswith(".json") for n in names if n)
        and any(re.match(r"(MAL|GHSA|PYSEC|OSV|CVE|HPCWATCH)-", n) for n in names)
    )


def _kineto(p: Path, c: ReadContext) -> KinetoTrace:
    from hpcwatch.sources import kineto

    return kineto.read_kineto(p)


def _optrace(p: Path, c: ReadContext) -> pa.Table:
    from hpcwatch.sources import optrace

    return optrace.read_optrace(p)


register(
    Format(
        name="shard-manifest",
        yields="manifest",
        read=_manifest,
        sniff=lambda h: '"shards"' in _json_object_head(h)[:4096] and '"dataset"' in h.text[:4096],
        summary="a training-data shard manifest (sources/manifest.py)",
    )
)
register(
    Format(
        name="osv-record", yields="advisories", read=_osv, sniff=_sniff_osv_record, summary="one OSV advisory (JSON)"
    )
)
register(
    Format(name="osv-zip", yields="advisories", read=_osv, sniff=_sniff_osv_zip, summary="an OSV dump (PyPI/all.zip)")
)
register(
    Format(
        name="osv-dir",
        yields="advisories",
        read=_osv,
        sniff=_sniff_osv_dir,
        folder=True,
        summary="a folder of OSV advisories",
    )
)
register(
    Format(
        name="kineto",
        yields="trace",
        read=_kineto,
        sniff=lambda h: '"traceEvents"' in h.text or '"schemaVersion"' in h.text[:4096],
        summary="PyTorch profiler (Kineto) trace, .json or .json.gz (read by `hpcwatch steps`)",
    )
)
register(
    Format(
        name="optrace",
        yields="op-table",
        read=_optrace,
        sniff=lambda h: h.raw.startswith(b"PAR1") and h.name.endswith(".parquet"),
        summary="per-operation trace, Parquet (ByteDance what-if; read by `hpcwatch whatif`)",
    )
)

# -- packages --------------------------------------------------------------------------------------------------


def _site_packages(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import pip

    return pip.read_site_packages(p)


def _sniff_site_packages(h: Head) -> bool:
    return h.name in ("site-packages", "dist-packages") or any(n.endswith(".pth") for n in h.text.split("\n"))


register(
    Format(
        name="site-packages",
        sniff=_sniff_site_packages,
        read=_site_packages,
        kinds=E,
        folder=True,
        dated_by_file=True,
        summary="a site-packages folder: the .pth lines Python executes at start-up",
    )
)

# -- cluster state -------------------------------------------------------------------------------------------


def _slurm(reader_name: str) -> Callable[[Path, ReadContext], Iterator[Job | Event | Sample]]:
    def read(p: Path, c: ReadContext) -> Iterator[Job | Event | Sample]:
        from hpcwatch.sources import slurm

        records: Iterator[Job | Event | Sample] = getattr(slurm, reader_name)(p)
        return records

    return read


def _kubernetes() -> ModuleType:
    from hpcwatch.sources import kubernetes

    return kubernetes


def _json_jobs(h: Head) -> bool:
    return h.text.lstrip().startswith("{") and '"jobs"' in h.text


def _nvsmi(reader_name: str) -> Callable[[Path, ReadContext], Iterator[Sample | Event]]:
    def read(p: Path, c: ReadContext) -> Iterator[Sample | Event]:
        from hpcwatch.sources import nvidia_smi

        records: Iterator[Sample | Event] = getattr(nvidia_smi, reader_name)(p, hostname=c.host)
        return records

    return read


def _sniff_nvsmi(test_name: str) -> Callable[[Head], bool]:
    def sniff(h: Head) -> bool:
        from hpcwatch.sources import nvidia_smi

        found: bool = getattr(nvidia_smi, test_name)(h.text)
        return found

    return sniff


def _perfquery(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import infiniband

    return infiniband.read_perfquery(p, node=c.host)


def _ibstat(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import infiniband

    return infiniband.read_ibstat(p, node=c.host)


def _sniff_ib(test_name: str) -> Callable[[Head], bool]:
    def sniff(h: Head) -> bool:
        from hpcwatch.sources import infiniband

        found: bool = getattr(infiniband, test_name)(h.text)
        return found

    return sniff


def _lustre(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import lustre

    return lustre.read_job_stats(p)


def _sniff_lustre(h: Head) -> bool:
    from hpcwatch.sources import lustre

    return lustre.is_job_stats(h.text)


register(
    Format(
        name="nvidia-smi-xml",
        sniff=_sniff_nvsmi("is_nvidia_smi_xml"),
        read=_nvsmi("read_nvidia_smi_xml"),
        kinds=S | E,
        uses_host=True,
        summary="nvidia-smi -q -x",
    )
)
register(
    Format(
        name="nvidia-smi-q",
        sniff=_sniff_nvsmi("is_nvidia_smi_q"),
        read=_nvsmi("read_nvidia_smi_q"),
        kinds=S,
        uses_host=True,
        summary="nvidia-smi -q (text: utilisation, memory, power, clocks, PCIe link, versions)",
    )
)
register(
    Format(
        name="squeue-json",
        read=_slurm("read_squeue_records"),
        kinds=J | S,
        dated_by_file=True,  # without last_update (22.05), running jobs' samples take the file's time
        sniff=lambda h: _json_jobs(h) and ('"job_state"' in h.text or "squeue" in h.name),
        summary="squeue --json (jobs; a running job's elapsed time and time limit at the snapshot as samples)",
    )
)
register(
    Format(
        name="sacct-json",
        read=_slurm("read_sacct_records"),
        kinds=J | E | S,
        sniff=lambda h: _json_jobs(h) and ('"steps"' in h.text or '"current"' in h.text or "sacct" in h.name),
        summary="sacct --json (jobs, their requeued attempts as events, and their CPUs, memory, MaxRSS per "
        "node, time limit as samples)",
    )
)
register(
    Format(
        name="kubectl-pods",
        read=lambda p, c: _kubernetes().read_kubectl_pods(p),
        kinds=J,
        sniff=lambda h: _kubernetes().is_kubectl_pods(h.text),
        summary="kubectl get pods -o json",
    )
)
register(
    Format(
        name="scontrol-job",
        read=_slurm("read_scontrol_show_job"),
        kinds=J,
        sniff=lambda h: h.text.lstrip().startswith("JobId="),
        summary="scontrol -d -o show job",
    )
)


def _slurm_config(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import slurm_config

    return slurm_config.read_scontrol_show_config(p)


def _sniff_slurm_config(h: Head) -> bool:
    from hpcwatch.sources import slurm_config

    return slurm_config.is_scontrol_show_config(h.text)


register(
    Format(
        name="scontrol-config",
        read=_slurm_config,
        kinds=E,
        dated_by_file=True,
        sniff=_sniff_slurm_config,
        summary="scontrol show config (HealthCheckProgram, TopologyPlugin...)",
    )
)


def _smartctl(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import smartctl

    return smartctl.read_smartctl_json(p, node=c.host)


def _sniff_smartctl(h: Head) -> bool:
    from hpcwatch.sources import smartctl

    return smartctl.is_smartctl_json(h.text)


register(
    Format(
        name="smartctl-json",
        sniff=_sniff_smartctl,
        read=_smartctl,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="smartctl --json (NVMe SMART / Health log, SMART status, temperature)",
    )
)


def _lspci(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import lspci

    return lspci.read_lspci_vv(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_lspci(h: Head) -> bool:
    from hpcwatch.sources import lspci

    return lspci.is_lspci_vv(h.text)


register(
    Format(
        name="lspci-vv",
        sniff=_sniff_lspci,
        read=_lspci,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="lspci -vv (PCIe LnkCap / LnkSta of each device)",
    )
)


def _ofed_info(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import ofed_info

    return ofed_info.read_ofed_info(p, node=c.host)


def _sniff_ofed_info(h: Head) -> bool:
    from hpcwatch.sources import ofed_info

    return ofed_info.is_ofed_info(h.text)


register(
    Format(
        name="ofed-info",
        sniff=_sniff_ofed_info,
        read=_ofed_info,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="ofed_info -s (the MLNX_OFED / DOCA-Host OFED version of a node)",
    )
)


def _chrony(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import chrony

    return chrony.read_chronyc_tracking(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_chrony(h: Head) -> bool:
    from hpcwatch.sources import chrony

    return chrony.is_chronyc_tracking(h.text)


register(
    Format(
        name="chronyc-tracking",
        sniff=_sniff_chrony,
        read=_chrony,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="chronyc tracking (clock offset from NTP time, leap status)",
    )
)


def _systemctl(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import systemd_units

    return systemd_units.read_systemctl_json(p, node=c.host)


def _sniff_systemctl(h: Head) -> bool:
    from hpcwatch.sources import systemd_units

    return systemd_units.is_systemctl_json(h.text)


register(
    Format(
        name="systemctl-json",
        sniff=_sniff_systemctl,
        read=_systemctl,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="systemctl --failed --output=json (failed units)",
    )
)


def _df(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import df

    return df.read_df(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_df(h: Head) -> bool:
    from hpcwatch.sources import df

    return df.is_df(h.text)


register(
    Format(
        name="df",
        sniff=_sniff_df,
        read=_df,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="df --output / df -P[T] / df -Pi / df -h (space and inodes of each file system)",
    )
)


def _edac(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import edac

    return edac.read_edac(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_edac(h: Head) -> bool:
    from hpcwatch.sources import edac

    return edac.is_edac(h.text)


register(
    Format(
        name="edac",
        sniff=_sniff_edac,
        read=_edac,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="EDAC memory error counters: grep -H . /sys/devices/system/edac/mc/mc*/*e_count, edac-util -v",
    )
)


def _ipmi_sel(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import ipmitool

    return ipmitool.read_ipmitool_sel(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_ipmi_sel(h: Head) -> bool:
    from hpcwatch.sources import ipmitool

    return ipmitool.is_ipmitool_sel(h.text)


register(
    Format(
        name="ipmitool-sel",
        sniff=_sniff_ipmi_sel,
        read=_ipmi_sel,
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="ipmitool sel elist / sel list (the BMC's System Event Log)",
    )
)


def _ipmi_sdr(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import ipmitool_sdr

    return ipmitool_sdr.read_ipmitool_sdr(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_ipmi_sdr(h: Head) -> bool:
    from hpcwatch.sources import ipmitool_sdr

    return ipmitool_sdr.is_ipmitool_sdr(h.text)


register(
    Format(
        name="ipmitool-sdr",
        sniff=_sniff_ipmi_sdr,
        read=_ipmi_sdr,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="ipmitool sdr list / sdr elist / sensor (the BMC's sensors: PSUs, fans, temperatures, voltages)",
    )
)
register(
    Format(
        name="perfquery",
        sniff=_sniff_ib("is_perfquery"),
        read=_perfquery,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="perfquery / perfquery -x",
    )
)
register(
    Format(
        name="ibstat",
        sniff=_sniff_ib("is_ibstat"),
        read=_ibstat,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="ibstat",
    )
)
register(
    Format(
        name="lustre-job-stats",
        sniff=_sniff_lustre,
        read=_lustre,
        kinds=S,
        dated_by_file=True,
        summary="lctl get_param *.*.job_stats",
    )
)
register(
    Format(
        name="nvidia-smi-csv",
        sniff=_sniff_nvsmi("is_nvidia_smi_csv"),
        read=_nvsmi("read_nvidia_smi_csv"),
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="nvidia-smi --query-gpu ... --format=csv",
    )
)


# -- AMD GPUs: readings renamed to the DCGM fields (sources/amd_gpu.py); the exporter's text before `prometheus`


def _amd_smi(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import amd_smi

    return amd_smi.read_amd_smi_json(p, hostname=c.host)


def _sniff_amd_smi(h: Head) -> bool:
    from hpcwatch.sources import amd_smi

    return amd_smi.is_amd_smi_json(h.text)


def _rocm_smi(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import rocm_smi

    return rocm_smi.read_rocm_smi_json(p, hostname=c.host)


def _sniff_rocm_smi(h: Head) -> bool:
    from hpcwatch.sources import rocm_smi

    return rocm_smi.is_rocm_smi_json(h.text)


def _amd_exporter(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import amd_exporter

    return amd_exporter.read_amd_exporter_text(p, host=c.host)


def _sniff_amd_exporter(h: Head) -> bool:
    from hpcwatch.sources import amd_exporter

    return amd_exporter.is_amd_exporter_text(h.text)


register(
    Format(
        name="amd-smi-json",
        sniff=_sniff_amd_smi,
        read=_amd_smi,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="amd-smi metric --json / amd-smi static --json (AMD GPUs, as DCGM fields)",
    )
)
register(
    Format(
        name="rocm-smi-json",
        sniff=_sniff_rocm_smi,
        read=_rocm_smi,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="rocm-smi --json (AMD GPUs, as DCGM fields)",
    )
)
register(
    Format(
        name="amd-device-metrics",
        sniff=_sniff_amd_exporter,
        read=_amd_exporter,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="AMD device-metrics-exporter scrape (Prometheus text; GPU readings as DCGM fields)",
    )
)

# -- lenient formats last ----------------------------------------------------------------------------------


def _prometheus(p: Path, c: ReadContext) -> Iterator[Sample]:
    from hpcwatch.sources import prometheus_text

    return _with_host(prometheus_text.read_prometheus_text(p), c.host)


def _prometheus_columns(p: Path, c: ReadContext) -> Iterator[pa.Table]:
    from hpcwatch.sources import prometheus_text

    chunks = prometheus_text.read_prometheus_columns(p)
    for chunk in [chunks] if hasattr(chunks, "num_rows") else chunks:
        yield _table_with_host(chunk, c.host)


def _sniff_prometheus(h: Head) -> bool:
    from hpcwatch.sources import prometheus_text

    return prometheus_text.is_prometheus_text(h.text)


def _with_host(samples: Iterable[Sample], host: str | None) -> Iterator[Sample]:
    """Samples of a scrape that names no node (node-exporter saved to a file) get the context's node, as a
    ``node`` label, or ``instance`` where the series' own ``node`` is a NUMA node or DRBD peer."""
    from hpcwatch.records import Sample
    from hpcwatch.schemas import node_label_is_host, sample_keys

    for s in samples:
        if host and sample_keys(s.labels, s.metric)[0] is None:
            key = "node" if node_label_is_host(s.metric) else "instance"
            s = Sample(metric=s.metric, labels={**s.labels, key: host}, t=s.t, value=s.value)
        yield s


def _table_with_host(table: pa.Table, host: str | None) -> pa.Table:
    """The same for a SAMPLE_SCHEMA table: rows without a host get it, in the column and in the labels."""
    if not host or table.num_rows == 0 or table.column("host").null_count == 0:
        return table
    import pyarrow as pa
    import pyarrow.compute as pc

    from hpcwatch.schemas import NODE_NOT_HOST_PREFIXES

    missing = pc.is_null(table.column("host"))
    local = pc.starts_with(table.column("metric"), NODE_NOT_HOST_PREFIXES[0])
    for prefix in NODE_NOT_HOST_PREFIXES[1:]:
        local = pc.or_(local, pc.starts_with(table.column("metric"), prefix))
    labels = table.column("labels")
    for key, rows in (("node", pc.and_(missing, pc.invert(local))), ("instance", pc.and_(missing, local))):
        labels = pc.if_else(rows, _tagged(labels, key, host), labels)
    hosts = pc.if_else(missing, pa.scalar(host), table.column("host"))
    return table.set_column(table.schema.get_field_index("host"), "host", hosts).set_column(
        table.schema.get_field_index("labels"), "labels", labels
    )


def _tagged(labels: pa.ChunkedArray, key: str, host: str) -> pa.ChunkedArray:
    """Each labels JSON object with ``key: host`` put first."""
    import pyarrow as pa
    import pyarrow.compute as pc

    head = "{" + _json_str(key) + ":" + _json_str(host)
    rest = pc.utf8_slice_codeunits(labels, 1)  # the object without its "{"
    return pc.if_else(
        pc.equal(labels, "{}"), pa.scalar(head + "}"), pc.binary_join_element_wise(pa.scalar(head + ","), rest, "")
    )


def _json_str(text: str) -> str:
    import orjson

    return orjson.dumps(text).decode()


def _pip(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import pip

    return pip.read_pip_list(p)


def _sniff_pip(h: Head) -> bool:
    from hpcwatch.sources import pip

    return pip.is_pip_list(h.text, h.name)


def _kernel_log(p: Path, c: ReadContext) -> Iterator[Event]:
    from hpcwatch.sources import kernel_log

    return kernel_log.read_kernel_log(p, node=c.host, on_bad_line=c.on_bad_line)


def _sniff_kernel_log(h: Head) -> bool:
    from hpcwatch.sources import kernel_log

    return kernel_log.is_kernel_log(h.text)


register(
    Format(
        name="kernel-log",
        sniff=_sniff_kernel_log,
        read=_kernel_log,
        kinds=E,
        uses_host=True,
        dated_by_file=True,
        line_oriented=True,
        summary="dmesg / journalctl -k (NVRM Xid, hung tasks, OOM kills, hardware errors)",
    )
)
register(
    Format(
        name="prometheus",
        sniff=_sniff_prometheus,
        read=_prometheus,
        columns=_prometheus_columns,
        kinds=S,
        uses_host=True,
        dated_by_file=True,
        summary="Prometheus text exposition (dcgm-exporter, node-exporter, any /metrics)",
    )
)
register(
    Format(
        name="pip-list",
        sniff=_sniff_pip,
        read=_pip,
        kinds=E,
        dated_by_file=True,
        summary="pip list --format=json, or pip freeze lines",
    )
)
