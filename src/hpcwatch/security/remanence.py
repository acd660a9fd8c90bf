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
    remanence.busy_no_job              GPU utilisation above ``busy_util_pct`` with no job on the GPU, none ending or
                                       starting within ``after_s``
    remanence.scrub_disabled           ``RMDisableScrubOnFree=1`` in /proc/driver/nvidia/params

A node's idle baseline is the median FB used while no job holds its GPUs, read away from the watch of every ended
job (``window_s`` after its end): what a job left there is what the rule looks for, not the baseline. A live scan
remembers each node's last one (``GpuSeries.idle_mib``): once its window has moved past the idle reads before a
job longer than the window, the memory eight ranks left alive on a whole node would otherwise be its own baseline
(found on a real H200's reads, ``tests/unit/test_security_real_sequences.py``). With neither, the baseline is the
median over every read no job holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.records import Event, Finding, Job, Sample
from hpcwatch.security.context import JobIndex, host_of, once_per_labels
from hpcwatch.security.series import PairIds, PointColumns, WindowSeries, numbering_of_held
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
    series: GpuSeries,
    jobs: Iterable[Job] = (),
    events: Iterable[Event] = (),
    config: RemanenceConfig = RemanenceConfig(),
) -> list[Finding]:
    """``detect_remanence`` over a ``GpuSeries`` already filled (a live scan keeps one between scans)."""
    index = JobIndex.of(jobs)
    events = list(events)
    findings = _fb_after_job(series, index, config)
    findings += _processes_after_job(events, index, config)
    findings += _busy_no_job(series, index, config)
    findings += [f for e in events if e.kind == EventKind.NVIDIA_PARAMS for f in _scrub(e)]
    return findings


#: A live scan's labels texts remembered (``GpuSeries.add_table``): a few per GPU and job; past this many (a
#: long run's ended jobs), forgotten and learnt again.
_KEPT_PAIRS = 200_000


class GpuSeries(WindowSeries):
    """The samples ``detect_remanence`` reads, as columns (``PointColumns``): FB used (``fb``) and utilisation
    (``util``), each point's GPU (an index into ``gpus``, its (host, gpu)), time, value and ``hpc_job`` label (an
    index into ``jobs``; 0: none). A live scan at 1,024 nodes holds 800,000 of these points: the rules look at
    all of them with a few numpy calls, and in Python only at the few points no job label claims."""

    def __init__(self) -> None:
        self.fb = PointColumns("gpu", "value", "job")
        self.util = PointColumns("gpu", "value", "job")
        self.gpus: list[tuple[str, str]] = []
        self.jobs: list[str] = [""]
        self._gpu_ids: dict[tuple[str, str], int] = {}
        self._job_ids: dict[str, int] = {"": 0}
        self._pair_ids = PairIds(2, lambda metric, labels: self._ids_of(labels), _KEPT_PAIRS)
        #: Each node's idle FB used (MiB) as the last detection read it away from any ended job's watch: what a
        #: live scan's window no longer holds (module doc).
        self.idle_mib: dict[str, float] = {}

    def add(self, samples: Iterable[Sample]) -> None:
        ids = once_per_labels(self._ids_of)
        rows: dict[str, list[tuple[float, int, float, int]]] = {FB_USED: [], GPU_UTIL: []}
        for s in samples:
            if (into := rows.get(s.metric)) is not None and (pair := ids(s.labels))[0] >= 0:
                into.append((s.t, pair[0], s.value, pair[1]))
        for metric, points in ((FB_USED, self.fb), (GPU_UTIL, self.util)):
            t, gpu, value, job = zip(*rows[metric]) if rows[metric] else ((), (), (), ())
            points.add(
                t=np.array(t, float),
                gpu=np.array(gpu, np.int32),
                value=np.array(value, float),
                job=np.array(job, np.int32),
            )

    def add_table(self, table: pa.Table) -> None:
        """The rows of a table with ``metric``, ``labels`` (JSON text), ``t`` and ``value`` columns."""
        for metric, points in ((FB_USED, self.fb), (GPU_UTIL, self.util)):
            rows = table.filter(pc.equal(table["metric"], metric))
            if rows.num_rows:
                gpu, job = self._pair_ids.of_table(rows).T
                kept = gpu >= 0
                points.add(
                    t=rows["t"].to_numpy()[kept],
                    gpu=gpu[kept].astype(np.int32),
                    value=rows["value"].to_numpy()[kept],
                    job=job[kept].astype(np.int32),
                )

    def forget_before(self, t: float) -> None:
        self.fb.forget_before(t)
        self.util.forget_before(t)
        held = np.concatenate([self.fb.columns()["job"], self.util.columns()["job"], [0]]).astype(np.int64)
        renumbered = numbering_of_held(held, len(self.jobs))  # the job labels of jobs long gone
        if renumbered is not None:
            kept, numbers = renumbered
            self.fb.renumber("job", numbers)
            self.util.renumber("job", numbers)
            self.jobs = [self.jobs[i] for i in kept.tolist()]
            self._job_ids = {job: i for i, job in enumerate(self.jobs)}
            self._pair_ids = PairIds(2, lambda metric, labels: self._ids_of(labels), _KEPT_PAIRS)

    def __len__(self) -> int:
        return len(self.fb) + len(self.util)

    @property
    def groups(self) -> dict[str, dict[tuple[str, str], list[tuple[float, float, str]]]]:
        """The points as ``SeriesGroups`` holds them: group -> (host, gpu) -> [(t, value, job label)] in the
        order added (what a test compares)."""
        out: dict[str, dict[tuple[str, str], list[tuple[float, float, str]]]] = {}
        for name, points in (("fb", self.fb), ("util", self.util)):
            group = out[name] = {}
            c = points.columns()
            for t, gpu, value, job in zip(c["t"].tolist(), c["gpu"].tolist(), c["value"].tolist(), c["job"].tolist()):
                group.setdefault(self.gpus[gpu], []).append((t, value, self.jobs[job]))
        return out

    def _ids_of(self, labels: Mapping[str, str]) -> tuple[int, int]:
        """(the GPU's index, or -1 for a sample of no GPU; the job label's index)."""
        host, gpu = host_of(labels), labels.get("gpu")
        if host is None or gpu is None:
            return -1, 0
        gpu_id = self._gpu_ids.get((host, gpu))
        if gpu_id is None:
            gpu_id = self._gpu_ids[(host, gpu)] = len(self.gpus)
            self.gpus.append((host, gpu))
        job = labels.get("hpc_job") or ""
        job_id = self._job_ids.get(job)
        if job_id is None:
            job_id = self._job_ids[job] = len(self.jobs)
            self.jobs.append(job)
        return gpu_id, job_id


class _ByGpu:
    """Rows of a ``PointColumns`` picked by a mask, grouped by GPU: ``rows(gpu)`` are that GPU's row numbers in
    the order added."""

    def __init__(self, gpu: np.ndarray, picked: np.ndarray) -> None:
        rows = np.flatnonzero(picked)
        rows = rows[np.argsort(gpu[rows], kind="stable")]
        gpus = gpu[rows]
        edges = np.flatnonzero(np.diff(gpus)) + 1
        self._rows = dict(zip(gpus[np.r_[0, edges]].tolist(), np.split(rows, edges))) if rows.size else {}

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def rows(self, gpu: int) -> np.ndarray:
        return self._rows[gpu]


def _unheld(index: JobIndex, host: str, gpu: str, times: np.ndarray, grace_s: float = 0.0) -> np.ndarray:
    """Whether no job held GPU ``gpu`` of ``host`` at each of ``times`` (``JobIndex.on_gpu``, at once; ``grace_s``
    widens each job's hold at both ends)."""
    holding = index.holding(host)
    holds_gpu = np.array([not (held := j.gpus_by_node.get(host)) or int(gpu) in held for j in holding.jobs], bool)
    if not holds_gpu.any():
        return np.ones(len(times), bool)
    return ~holding.covering(times, grace_s=grace_s)[holds_gpu].any(axis=0)


def _free_rows(
    series: GpuSeries, points: dict[str, np.ndarray], picked: np.ndarray, index: JobIndex, grace_s: float = 0.0
) -> _ByGpu:
    """The ``picked`` rows of ``points`` no job label claims and no job held the GPU of (``grace_s`` around each
    hold), by GPU."""
    unlabeled = _ByGpu(points["gpu"], picked & (points["job"] == 0))
    free = np.zeros(len(picked), bool)
    for gpu in unlabeled:
        rows = unlabeled.rows(gpu)
        free[rows[_unheld(index, *series.gpus[gpu], points["t"][rows], grace_s)]] = True
    return _ByGpu(points["gpu"], free)


def _baselines(
    series: GpuSeries, fb: dict[str, np.ndarray], index: JobIndex, config: RemanenceConfig
) -> dict[str, float]:
    """Per node: the median FB used while no job holds the GPU (the driver's own reservation), away from every
    ended job's watch, else the one remembered, else over every free read (module doc). Remembers the first."""
    free = _free_rows(series, fb, np.ones(len(fb["t"]), bool), index)
    rows_of: defaultdict[str, list[np.ndarray]] = defaultdict(list)
    for gpu in free:
        rows_of[series.gpus[gpu][0]].append(free.rows(gpu))
    base = {}
    for host, parts in rows_of.items():
        rows = np.concatenate(parts)
        values, t = fb["value"][rows], fb["t"][rows]
        ends = index.holding(host).ends
        ends = ends[np.isfinite(ends)]  # the node's ended jobs (a running one's end is +inf)
        away = values[~((ends[:, None] <= t) & (t <= ends[:, None] + config.window_s)).any(axis=0)]
        if away.size:
            base[host] = series.idle_mib[host] = float(np.median(away))
        else:
            base[host] = series.idle_mib.get(host, float(np.median(values)))
    return base


def _fb_after_job(series: GpuSeries, index: JobIndex, config: RemanenceConfig) -> list[Finding]:
    fb = series.fb.columns()
    if not len(fb["t"]):
        return []
    base = _baselines(series, fb, index, config)
    gpu, t, value = fb["gpu"], fb["t"], fb["value"]
    floor = np.full(len(series.gpus), np.inf)
    np.minimum.at(floor, gpu, value)
    first, last = np.full(len(series.gpus), np.inf), np.full(len(series.gpus), -np.inf)
    np.minimum.at(first, gpu, t)
    np.maximum.at(last, gpu, t)
    baseline = np.array(
        [min(base.get(host, f), f + config.margin_mib) for (host, _), f in zip(series.gpus, floor.tolist())]
    )
    # Only a point over its GPU's baseline, on a GPU no job held, can be memory left behind: a few, looked at in
    # Python; the others are judged by the masks.
    over = _free_rows(series, fb, value > baseline[gpu] + config.margin_mib, index)
    # The ended jobs of each node, once (in the order ``ended`` gives): at 1,024 nodes, thousands of ended
    # jobs times 8,192 GPUs was most of a scan.
    ended_on: dict[str, list[tuple[Job, float]]] = {}
    for job in index.ended():
        end = index.end_of(job)
        for node in dict.fromkeys(job.nodes):
            ended_on.setdefault(node, []).append((job, end))
    findings = []
    for g in sorted(over, key=series.gpus.__getitem__):
        (host, gpu_label), rows = series.gpus[g], over.rows(g)
        for job, end in ended_on.get(host, ()):
            if end + config.window_s < first[g] or end + config.after_s > last[g]:
                continue  # no point of the series in the job's watch: a node's ended jobs grow with the store's age
            held = job.gpus_by_node.get(host)
            if held and int(gpu_label) not in held:
                continue
            left = rows[(end + config.after_s <= t[rows]) & (t[rows] <= end + config.window_s)]
            if left.size:
                at, base_mib = left[0], float(baseline[g])
                findings.append(
                    _left_finding(host, gpu_label, job, end, float(t[at]), float(value[at]), base_mib, left.size)
                )
    return findings


def _left_finding(
    host: str, gpu: str, job: Job, end: float, t: float, v: float, baseline: float, count: int
) -> Finding:
    return Finding(
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
            "samples_over": count,
        },
        t=t,
        rule="remanence.fb_after_job",
    )


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


def _busy_no_job(series: GpuSeries, index: JobIndex, config: RemanenceConfig) -> list[Finding]:
    util = series.util.columns()
    # Slurm gives a job's start and end in whole seconds, and the driver tears a process down after its end (a
    # real H200 read 59 % for 0.2 s after): no job within ``after_s`` of a read is not yet work nobody scheduled.
    busy = _free_rows(series, util, util["value"] > config.busy_util_pct, index, grace_s=config.after_s)
    findings = []
    for g in sorted(busy, key=series.gpus.__getitem__):
        (host, gpu), rows = series.gpus[g], busy.rows(g)
        peak = float(util["value"][rows].max())
        first_t = float(util["t"][rows[0]])
        findings.append(
            Finding(
                vector="gpu_memory_remanence",
                severity="medium",
                target=f"{host}/{gpu}",
                title=f"{host}/{gpu} is {peak:.0f} % busy with no job on it",
                evidence={
                    "host": host,
                    "gpu": gpu,
                    "peak_util_pct": peak,
                    "first_t": first_t,
                    "samples": int(rows.size),
                },
                t=first_t,
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
