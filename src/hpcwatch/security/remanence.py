"""GPU memory left between jobs: what one job leaves in a GPU the next job gets.

HBM is not cleared by the hardware when a process frees it. Measured on a real
H200 (driver 580.159.04, ``tests/data/security/results_sweep_remanence.json``,
from ``recipes/h200_capture2.py``): a 1 GiB pattern written by one process was
**not** readable by the next process through a raw CUDA allocation
(0 of 268M words survived: the driver scrubs memory between processes), while
**inside one process** PyTorch's caching allocator handed the old pattern back in
100 % of the words. So the cross-job risk is not the freed memory itself but (a) a process of
the previous job that is still alive and holds its memory (a zombie after
``scancel``, an ``nohup`` left behind), (b) a driver told not to scrub
(``NVreg_RegistryDwords=RMDisableScrubOnFree=1``), (c) work on a GPU no job owns.

    rule                               fires on
    remanence.fb_after_job             FB used above the node's idle baseline ``after_s`` after the job that held
                                       the GPU ended, with no job holding it now (dcgm-exporter / nvidia-smi)
    remanence.process_after_job        a compute process (``gpu_process`` event from nvidia-smi) on a GPU no job holds,
                                       after a job on it ended
    remanence.busy_no_job              GPU utilisation above ``busy_util_pct`` with no job on the GPU
    remanence.scrub_disabled           ``RMDisableScrubOnFree=1`` in /proc/driver/nvidia/params
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Job, Sample
from hpcwatch.security.context import JobIndex, host_of, once_per_labels
from hpcwatch.security.series import Run, SeriesGroups
from hpcwatch.vocab import EventKind

__all__ = [
    "RemanenceConfig",
    "detect_remanence",
    "detect_remanence_series",
    "GpuSeries",
    "reads_metric",
    "FB_USED",
    "GPU_UTIL",
    "RULES",
]

#: Rule ids this detector emits (the web catalogues have a title per rule: web/en.yaml ``finding``).
RULES: tuple[str, ...] = (
    "remanence.fb_after_job",
    "remanence.process_after_job",
    "remanence.busy_no_job",
    "remanence.scrub_disabled",
)

#: dcgm-exporter field names (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv); MiB, %.
FB_USED = vocab.DCGM_FI_DEV_FB_USED
GPU_UTIL = vocab.DCGM_FI_DEV_GPU_UTIL


@dataclass(frozen=True, slots=True, kw_only=True)
class RemanenceConfig:
    after_s: float = 10.0
    """Seconds after a job's end before what it left counts (the epilog and the driver need a moment)."""
    window_s: float = 600.0
    """How long after a job's end to keep looking."""
    margin_mib: float = 256.0
    """FB used this far above the node's idle baseline is memory someone holds."""
    busy_util_pct: float = 5.0
    """Utilisation above this on a GPU without a job is work nobody scheduled."""

    def __post_init__(self) -> None:
        if self.after_s < 0 or self.window_s <= 0:
            raise ValueError("after_s must be >= 0 and window_s > 0")


def reads_metric(metric: str) -> bool:
    """Whether ``detect_remanence`` reads samples of ``metric`` (the scan gives it only those, in their order)."""
    return metric in (FB_USED, GPU_UTIL)


def detect_remanence(
    samples: Iterable[Sample],
    jobs: Iterable[Job] = (),
    events: Iterable[Event] = (),
    config: RemanenceConfig = RemanenceConfig(),
) -> list[Finding]:
    return detect_remanence_series(GpuSeries.of(samples), jobs, events, config)


def detect_remanence_series(
    series: SeriesGroups,
    jobs: Iterable[Job] = (),
    events: Iterable[Event] = (),
    config: RemanenceConfig = RemanenceConfig(),
) -> list[Finding]:
    """``detect_remanence`` over a ``GpuSeries`` already filled (a live scan keeps one between scans)."""
    index = JobIndex.of(jobs)
    events = list(events)
    findings = _fb_after_job(series.groups["fb"], index, config)
    findings += _processes_after_job(events, index, config)
    findings += _busy_no_job(series.groups["util"], index, config)
    findings += [f for e in events if e.kind == EventKind.NVIDIA_PARAMS for f in _scrub(e)]
    return findings


class GpuSeries(SeriesGroups):
    """The samples ``detect_remanence`` reads, by GPU (host, gpu): FB used (``fb``) and utilisation
    (``util``), each point (t, value, the ``hpc_job`` label or "")."""

    def __init__(self) -> None:
        super().__init__("fb", "util")

    def add_runs(self, runs: Iterable[Run]) -> None:
        keys = once_per_labels(lambda labels: (host_of(labels), labels.get("gpu"), labels.get("hpc_job") or ""))
        for run in runs:
            if run.metric != FB_USED and run.metric != GPU_UTIL:
                continue
            host, gpu, job = keys(run.labels)
            if host is None or gpu is None:
                continue
            self.extend("fb" if run.metric == FB_USED else "util", (host, gpu), zip(run.t, run.values, repeat(job)))


def _baselines(fb: dict, index: JobIndex) -> dict[str, float]:
    """Per node: the median FB used while no job holds the GPU (the driver's own reservation)."""
    idle: defaultdict[str, list[float]] = defaultdict(list)
    for (host, gpu), points in fb.items():
        idle[host] += [v for t, v, label in points if not label and not index.on_gpu(host, gpu, t)]
    return {h: float(np.median(v)) for h, v in idle.items() if v}


def _free(host: str, gpu: str, t: float, label: str, index: JobIndex) -> bool:
    return not label and not index.on_gpu(host, gpu, t)


def _fb_after_job(fb: dict, index: JobIndex, config: RemanenceConfig) -> list[Finding]:
    base = _baselines(fb, index)
    findings = []
    # The ended jobs of each node, once (in the order ``ended`` gives): at 1,024 nodes, thousands of ended
    # jobs times 8,192 GPUs was most of a scan.
    ended_on: dict[str, list[tuple[Job, float]]] = {}
    for job in index.ended():
        end = index.end_of(job)
        for node in dict.fromkeys(job.nodes):
            ended_on.setdefault(node, []).append((job, end))
    for (host, gpu), points in sorted(fb.items()):
        floor = min(v for _, v, _ in points)
        baseline = min(base.get(host, floor), floor + config.margin_mib)
        first, last = min(t for t, _, _ in points), max(t for t, _, _ in points)
        for job, end in ended_on.get(host, ()):
            if end + config.window_s < first or end + config.after_s > last:
                continue  # no point of the series in the job's watch: a node's ended jobs grow with the store's age
            held = job.gpus_by_node.get(host)
            if held and int(gpu) not in held:
                continue
            left = [
                (t, v)
                for t, v, label in points
                if end + config.after_s <= t <= end + config.window_s
                and _free(host, gpu, t, label, index)
                and v > baseline + config.margin_mib
            ]
            if left:
                t, v = left[0]
                findings.append(
                    Finding(
                        vector="gpu_memory_remanence",
                        severity="high",
                        target=f"{host}/{gpu}",
                        title=f"{host}/{gpu} still holds {v - baseline:.0f} MiB {t - end:.0f} s after job {job.id} ended",
                        evidence={
                            "host": host,
                            "gpu": gpu,
                            "job": job.id,
                            "user": job.user,
                            "job_end": job.end,
                            "fb_used_mib": v,
                            "baseline_mib": baseline,
                            "samples_over": len(left),
                        },
                        t=t,
                        rule="remanence.fb_after_job",
                    )
                )
    return findings


def _processes_after_job(events: list[Event], index: JobIndex, config: RemanenceConfig) -> list[Finding]:
    findings, seen = [], set()
    for e in events:
        if e.kind != EventKind.GPU_PROCESS:
            continue
        a = e.attrs
        host, gpu = host_of(a), a.get("gpu", a.get("gpu_index", a.get("minor_number")))
        if host is None or gpu is None or index.on_gpu(host, gpu, e.t):
            continue
        before = [
            j
            for j in index.ended()
            if host in j.nodes
            and index.end_of(j) + config.after_s <= e.t <= index.end_of(j) + config.window_s
            and (not j.gpus_by_node.get(host) or int(gpu) in j.gpus_by_node[host])
        ]
        pid = a.get("pid")
        if not before or (host, gpu, pid) in seen:
            continue
        seen.add((host, gpu, pid))
        job = max(before, key=index.end_of)
        name = a.get("process_name") or a.get("name") or "?"
        findings.append(
            Finding(
                vector="gpu_memory_remanence",
                severity="high",
                target=f"{host}/{gpu}",
                title=f"process {name} (pid {pid}) still on {host}/{gpu} {e.t - index.end_of(job):.0f} s after job {job.id} ended",
                evidence={
                    "host": host,
                    "gpu": gpu,
                    "pid": pid,
                    "process": name,
                    "job": job.id,
                    "user": job.user,
                    "job_end": job.end,
                    "used_memory": a.get("used_memory_bytes", a.get("used_memory")),
                },
                t=e.t,
                rule="remanence.process_after_job",
            )
        )
    return findings


def _busy_no_job(util: dict, index: JobIndex, config: RemanenceConfig) -> list[Finding]:
    findings = []
    for (host, gpu), points in sorted(util.items()):
        busy = [(t, v) for t, v, label in points if v > config.busy_util_pct and _free(host, gpu, t, label, index)]
        if busy:
            findings.append(
                Finding(
                    vector="gpu_memory_remanence",
                    severity="medium",
                    target=f"{host}/{gpu}",
                    title=f"{host}/{gpu} is {max(v for _, v in busy):.0f} % busy with no job on it",
                    evidence={
                        "host": host,
                        "gpu": gpu,
                        "peak_util_pct": max(v for _, v in busy),
                        "first_t": busy[0][0],
                        "samples": len(busy),
                    },
                    t=busy[0][0],
                    rule="remanence.busy_no_job",
                )
            )
    return findings


def _scrub(event: Event) -> list[Finding]:
    value = str(event.attrs.get("params", {}).get("RMDisableScrubOnFree", "0")).strip().lower()
    if value in ("0", "", "0x0", "0x00000000"):
        return []
    host = event.attrs.get("host") or event.source
    return [
        Finding(
            vector="gpu_memory_remanence",
            severity="critical",
            target=host,
            title=f"{host}: the NVIDIA driver does not scrub GPU memory on free (RMDisableScrubOnFree={value})",
            evidence={"host": host, "file": event.source, "RMDisableScrubOnFree": value},
            t=event.t,
            rule="remanence.scrub_disabled",
        )
    ]
