"""Who used what: every GPU sample to a workload (a Slurm job, a Kubernetes pod), and a per-job report.

Attribution, in order of trust; each report names the sources that gave its samples (``attributed_by``):

1. ``hpc_job``: the sample's ``hpc_job`` label (dcgm-exporter's job mapping; the store's ``job`` column).
   A job even without any Slurm record: user and account stay unknown until a Slurm source says them.
2. ``slurm``: the Slurm allocation, the job whose ``gpus_by_node`` holds that host's GPU and that ran at the
   sample's time. A sample at t stands for the interval (t - dt, t] before it, so the test is
   ``start < t <= end`` (``end`` None: still running).
3. ``slurm-on-kubernetes``: the same allocation, with the sample's ``pod`` label as the Slurm node. On
   Slurm-on-Kubernetes (SUNK) each slurmd runs in a pod that registers as a Slurm node under its pod name,
   and dcgm-exporter ``--kubernetes`` labels the GPU with that pod, not with the Slurm job.
4. ``kubernetes``: dcgm-exporter ``--kubernetes`` labels ``pod``, ``namespace``, ``container`` (older
   releases: ``pod_name``, ``pod_namespace``, ``container_name``; empty strings on free GPUs): workload
   ``namespace/pod``, the id ``sources/kubernetes.py`` gives the pod read from ``kubectl get pods -o json``
   (which adds its GPU request, node and owner).

A MIG instance is a GPU of its own: the key of a GPU is (host, gpu, instance), ``instance`` from the
``GPU_I_ID`` label, written ``gpu.instance`` (``2.0``) as dcgm-exporter's mapping directory names it.
MIG instances report no ``DCGM_FI_DEV_GPU_UTIL``; their utilisation is ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
x 100, the field NVIDIA recommends for MIG (https://github.com/NVIDIA/dcgm-exporter/issues/430).

One window per job. GPU-hours *allocated* come from the allocation (GPUs x elapsed, as Slurm bills and
jobstats counts); GPU-hours *observed* are what the samples cover (per GPU: utilisation samples x the
series' median scrape interval); energy, utilisation and bytes are sums over those samples only.
A running job's elapsed time is Slurm's at its latest snapshot (``slurm_job_elapsed_seconds`` from
squeue/slurmrestd/sacct, see sources/slurm.py), else up to the newest sample, never past its time limit.
``coverage`` = observed / allocated says how much of the allocation the other numbers speak for::

    allocation  |<-------------------- 12 GPUs x 7,800 s = 26.0 GPU-h -------------------->|
    samples                                                    |<-- 600 s: 2.0 GPU-h -->|
                                                    observed window, energy, util, bytes
    coverage = 2.0 / 26.0 = 7.7 %

The report follows Princeton's jobstats (GPU utilisation per GPU, memory high-water mark, energy, CPU
and memory from Slurm accounting, advice lines) and adds InfiniBand bytes, Lustre bytes, XID errors and
GPUs held but never used::

    GPU util  |####|####|####|        job 4101, node1/0  -> busy
              |    |    |    |        job 4104, node2/7  -> allocated but idle (max util < 1 %)
              t0   t1   t2   t3       each sample covers the interval ending at it

Counters (energy, IB bytes) are turned into deltas between consecutive samples of one series; a
delta belongs to the job of the later sample (a job's first delta starts at the last sample before it began:
a read from its first start reads that one too, ``LEAD_IN_METRICS``). The first sample of a series has no delta, and an
energy delta across more than ``MAX_COUNTER_GAP_INTERVALS`` scrape intervals is dropped (nobody
watched that stretch), so a job's energy is what was measured, not what it may have used unseen.

A table of samples is first reduced to a ``Partial`` (``partial_of``: ``analysis.jobpartial``), the report made
from it (``reports_of``): a long window is read a stretch at a time and the stretches' partials joined, with the
same report as one pass. The scrape interval is the median of a series' gaps counted in whole milliseconds.

Input: a pyarrow table with the store's sample columns (``hpcwatch.schemas.SAMPLE_SCHEMA``:
metric, t [UTC s], value, host, gpu, job, labels [JSON]) and ``records.Job``s. Pure: no store,
no printing.

jobstats: https://github.com/PrincetonUniversity/jobstats
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.analysis.coded import Coded, joint_codes
from hpcwatch.analysis.jobpartial import (
    GAP_METRICS,
    ZERO,
    Acc,
    CellKey,
    Cells,
    Exact,
    Partial,
    PortEnds,
    SeriesEnds,
    Shape,
    exact_plus,
    exact_sums,
    median_gap_s,
)
from hpcwatch.records import Job

__all__ = [
    "ADVICE",
    "Attribution",
    "GpuReport",
    "JobReport",
    "attribute",
    "attribute_with_sources",
    "job_reports",
    "partial_of",
    "reports_of",
    "report_time",
    "Partial",
    "Shape",
    "report_dict",
    "device_key",
    "DCGM_METRICS",
    "IB_METRICS",
    "LUSTRE_METRICS",
    "SLURM_METRICS",
    "REPORT_METRICS",
    "LEAD_IN_METRICS",
    "IDLE_UTIL_PCT",
]

#: An energy-counter delta spanning more scrape intervals than this is not credited to anyone: the time between
#: its two samples went unobserved (an outage, or rows of other jobs left out). Ours: one missed scrape is
#: normal jitter, two in a row is a gap.
MAX_COUNTER_GAP_INTERVALS = 2.5

UTIL, FB, POWER, ENERGY, XID, TENSOR, GR_ACTIVE = (
    vocab.DCGM_FI_DEV_GPU_UTIL,
    vocab.DCGM_FI_DEV_FB_USED,
    vocab.DCGM_FI_DEV_POWER_USAGE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    vocab.DCGM_FI_DEV_XID_ERRORS,
    vocab.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
)
#: Fields that only say a workload holds the device: a pod whose series are these alone (an A10G or MIG instance
#: that exports FB_FREE or DRAM_ACTIVE but no utilisation) is listed with its utilisation unknown, not dropped.
PRESENCE_METRICS = (vocab.DCGM_FI_DEV_FB_FREE, vocab.DCGM_FI_PROF_DRAM_ACTIVE)
#: dcgm-exporter fields the report reads (https://github.com/NVIDIA/dcgm-exporter/blob/main/etc/default-counters.csv).
DCGM_METRICS = (UTIL, FB, POWER, ENERGY, XID, TENSOR, GR_ACTIVE, *PRESENCE_METRICS)
IB_TX = vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL
IB_RX = vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL
#: node-exporter's InfiniBand data counters (octets).
IB_METRICS = (IB_TX, IB_RX)
LUSTRE_READ, LUSTRE_WRITE = vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL
#: Lustre job_stats as the readers name them (labels jobid, target).
LUSTRE_METRICS = (LUSTRE_READ, LUSTRE_WRITE)
#: What sacct says of a job's CPUs and memory (sources/slurm.py).
SLURM_METRICS = (
    vocab.SLURM_JOB_CPUS,
    vocab.SLURM_JOB_CPU_SECONDS,
    vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES,
    vocab.SLURM_JOB_MAX_RSS_BYTES,
    vocab.SLURM_JOB_TIME_LIMIT_SECONDS,
    vocab.SLURM_JOB_ELAPSED_SECONDS,
)
REPORT_METRICS = DCGM_METRICS + IB_METRICS + LUSTRE_METRICS + SLURM_METRICS
#: The series whose first sample in a table counts a change from the sample before it (an energy or InfiniBand
#: delta, a new XID value; a gap of the series' interval): a read that starts inside the store reads each one's
#: last sample before its start with it (``store.queries.lead_in_samples``), so that a job's report read from its
#: first start counts what a read of every sample counts.
LEAD_IN_METRICS = (UTIL, ENERGY, XID, *IB_METRICS)
#: A GPU whose utilisation never reached 1 % during the job was allocated but idle (jobstats flags 0 %).
IDLE_UTIL_PCT = 1.0
#: Label sets whose parse is remembered: a job's report reads the same ones stretch after stretch (a 1,536-GPU
#: job has ~2,000), and parsing them was a third of a stretch's time. Ours; ~300 bytes each.
_PARSED_LABEL_SETS = 65_536
MIB = 1024**2
MJ_PER_KWH = 3.6e9
#: dcgm-exporter's Kubernetes labels, newest first (pod_* before dcgm-exporter 2.1, issue #272).
POD_LABELS, NAMESPACE_LABELS, CONTAINER_LABELS = (
    ("pod", "pod_name"),
    ("namespace", "pod_namespace"),
    ("container", "container_name"),
)


class Attribution(str, Enum):  # noqa: UP042 -- StrEnum formats differently in f-strings; the stored values rely on it
    """Where a sample's workload came from, in order of trust (module docstring)."""

    HPC_JOB = "hpc_job"
    SLURM = "slurm"
    SLURM_ON_KUBERNETES = "slurm-on-kubernetes"
    KUBERNETES = "kubernetes"


_TRUST = {a.value: k for k, a in enumerate(Attribution)}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReport:
    host: str
    gpu: str
    """GPU index (``"0"``)."""
    instance: str | None
    """MIG GPU instance id (``GPU_I_ID``), None for a whole GPU."""
    profile: str | None
    """MIG profile (``GPU_I_PROFILE``, ``1g.10gb``)."""
    samples: int
    mean_util_pct: float | None
    max_util_pct: float | None
    mean_tensor_active: float | None
    max_fb_used_bytes: int | None
    mean_power_w: float | None
    energy_kwh: float
    xid_errors: int
    idle: bool
    observed_s: float
    """Time the samples cover: samples x the series' median scrape interval (0 for a single scrape)."""

    @property
    def device(self) -> str:
        """``gpu`` or ``gpu.instance``: the mapping directory's name for it."""
        return self.gpu if self.instance is None else f"{self.gpu}.{self.instance}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobReport:
    id: str
    user: str | None
    account: str | None
    partition: str | None
    name: str | None
    state: str | None
    nodes: tuple[str, ...]
    gpus: int
    """GPUs allocated, else (no allocation known: a label-only job) GPUs seen in samples."""
    start: float | None
    end: float | None
    elapsed_s: float
    gpu_hours: float
    """GPUs x elapsed (allocation), hours; for a workload without an allocation, the observed GPU-hours."""
    energy_kwh: float
    """Measured: sum of the GPUs' energy-counter deltas while the job held them."""
    mean_gpu_util: float | None
    mean_tensor_active: float | None
    max_fb_used_bytes: int | None
    mean_power_w: float | None
    ib_tx_bytes: int
    ib_rx_bytes: int
    lustre_read_bytes: int
    lustre_write_bytes: int
    xid_errors: int
    idle_gpus: int
    """GPUs the job held whose utilisation never reached IDLE_UTIL_PCT."""
    per_gpu: tuple[GpuReport, ...]
    allocation: str | None = None
    """Who allocated it: ``slurm``, ``kubernetes`` (a pod record), or None (known only from labels)."""
    attributed_by: tuple[str, ...] = ()
    """``Attribution`` values that gave this job samples, most trusted first."""
    gpus_observed: int = 0
    """GPUs (MIG instances counted apart) with samples attributed to the job."""
    gpu_hours_allocated: float | None = None
    gpu_hours_observed: float = 0.0
    observed_start: float | None = None
    """The observed window: from the first sample's interval start ..."""
    observed_end: float | None = None
    """... to the last sample (UTC s)."""
    coverage: float | None = None
    """gpu_hours_observed / gpu_hours_allocated (None without an allocation)."""
    cpus: int | None = None
    cpu_util_pct: float | None = None
    """sacct TotalCPU / (CPUs x elapsed)."""
    memory_requested_bytes: int | None = None
    max_rss_bytes_by_node: tuple[tuple[str, int], ...] = ()
    """(node, largest step MaxRSS there), from sacct's steps."""
    time_limit_s: float | None = None
    time_limit_used: float | None = None
    """elapsed / time limit."""
    advice: tuple[str, ...] = field(default_factory=tuple)
    """jobstats-style notes (our wording): what to ask for next time, in English (``ADVICE``)."""
    advice_items: tuple[tuple[str, Mapping[str, str]], ...] = field(default_factory=tuple)
    """The same notes as (``ADVICE`` key, its values as text), for a view that words them in its language."""

    @property
    def ib_bytes(self) -> int:
        return self.ib_tx_bytes + self.ib_rx_bytes

    @property
    def lustre_bytes(self) -> int:
        return self.lustre_read_bytes + self.lustre_write_bytes


# -- columnar helpers -----------------------------------------------------------------------------


def _rows_of(samples: pa.Table, metrics: Sequence[str]) -> pa.Table:
    """The rows of ``metrics`` in their order, filtered in Arrow (no Python object per row: 120k rows a
    report at 128 nodes). When each metric's rows are contiguous (the store's samples come ordered by
    metric) they are slices of the table, not a copy: at 1,024 nodes a job's samples are 300 MB, mostly
    label text, and four copies of them were a fifth of its report."""
    column = samples.column("metric")
    runs = _metric_runs(column)
    if runs is None:
        return samples.filter(pc.is_in(column, value_set=pa.array(list(metrics), pa.string())))
    wanted = set(metrics)
    parts = [samples.slice(start, end - start) for name, start, end in runs if name in wanted]
    return pa.concat_tables(parts) if parts else samples.slice(0, 0)


def _metric_runs(column: pa.ChunkedArray) -> list[tuple[str | None, int, int]] | None:
    """(metric, first row, end row) of each run of equal metrics, in row order; None when some metric
    comes in more than one run (its rows are not contiguous). One comparison of neighbours, no hashing."""
    n = len(column)
    if n == 0:
        return []
    changed = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, n - 1)), True)
    starts = np.flatnonzero(np.concatenate([[True], changed.to_numpy(zero_copy_only=False)]))
    names = column.take(pa.array(starts)).to_pylist()
    if len(set(names)) != len(names):
        return None
    ends = [*starts[1:].tolist(), n]
    return list(zip(names, starts.tolist(), ends))


def _host_of(host: object, labels: str | None) -> str | None:
    """host column, else node-exporter's target labels (node, or instance without the port)."""
    return str(host) if host else _labels_host(labels)


@functools.lru_cache(maxsize=_PARSED_LABEL_SETS)
def _labels_host(labels: str | None) -> str | None:
    try:
        parsed = orjson.loads(labels) if labels else {}
    except orjson.JSONDecodeError:
        return None
    if parsed.get("node"):
        return str(parsed["node"])
    instance = parsed.get("instance")
    return str(instance).rsplit(":", 1)[0] if instance else None


def device_key(gpu: object, instance: object) -> str | None:
    """``gpu``, or ``gpu.instance`` for a MIG instance (the mapping directory's ``2.0``)."""
    if gpu is None or gpu == "":
        return None
    return str(gpu) if instance is None or instance == "" else f"{gpu}.{instance}"


def _first(labels: dict[str, Any], names: tuple[str, ...]) -> str | None:
    return next((str(labels[k]) for k in names if labels.get(k)), None)


#: What the report reads of a DCGM row's labels, in ``_label_fields``' order.
_LABEL_FIELDS = ("instance", "profile", "pod", "namespace")


@functools.lru_cache(maxsize=_PARSED_LABEL_SETS)
def _fields(text: str | None) -> tuple[Any, ...]:
    """``_LABEL_FIELDS`` of one label set."""
    lab = orjson.loads(text) if text else {}
    pod, namespace = _first(lab, POD_LABELS), _first(lab, NAMESPACE_LABELS)
    return lab.get("GPU_I_ID") or None, lab.get("GPU_I_PROFILE") or None, pod, namespace


def _label_fields(labels: pa.ChunkedArray) -> dict[str, Coded]:
    """instance, profile, pod, namespace per row (``_LABEL_FIELDS``), each distinct label set parsed once."""
    parsed = Coded.of(labels).per_name(_fields)
    sets = Coded.of(labels)
    out = {}
    for k, name in enumerate(_LABEL_FIELDS):
        per_set = Coded.of_values(p[k] for p in parsed)  # the last: a row without labels
        out[name] = Coded(per_set.codes[sets.codes], per_set.names)
    return out


def attribute(host: np.ndarray, gpu: np.ndarray, t: np.ndarray, job: np.ndarray, jobs: Sequence[Job]) -> np.ndarray:
    """Job id per sample: the ``job`` (hpc_job) value when set, else the Slurm allocation (see module doc).

    ``host``, ``gpu``, ``job`` are object arrays (None where unknown), ``t`` UTC seconds.
    """
    return attribute_with_sources(host, gpu, t, job, jobs)[0]


def attribute_with_sources(
    host: np.ndarray,
    gpu: np.ndarray,
    t: np.ndarray,
    job: np.ndarray,
    jobs: Sequence[Job],
    *,
    pod: np.ndarray | None = None,
    namespace: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(workload id, ``Attribution`` value) per sample, by the rules of the module docstring, in order;
    both None where no rule applies. ``pod``/``namespace``: dcgm-exporter's Kubernetes labels, or None."""

    def coded(values: np.ndarray | None) -> Coded | None:
        return None if values is None else Coded.of_values(values.tolist())

    found, source = _attributed(
        Coded.of_values(host.tolist()),
        Coded.of_values(gpu.tolist()),
        np.asarray(t, dtype=float),
        Coded.of_values(job.tolist()),
        jobs,
        pod=coded(pod),
        namespace=coded(namespace),
    )
    return found.values(), source.values()


#: ``Attribution`` values in code order (the codes ``_attributed`` gives its sources).
_SOURCES = [a.value for a in Attribution]


def _attributed(
    host: Coded,
    gpu: Coded,
    t: np.ndarray,
    job: Coded,
    jobs: Sequence[Job],
    *,
    pod: Coded | None = None,
    namespace: Coded | None = None,
) -> tuple[Coded, Coded]:
    """``attribute_with_sources`` on coded columns: the workload of each row (codes into names that the
    labels' jobs start, the others are added to) and its source (codes into ``_SOURCES``)."""
    names = list(job.names)
    index = {name: k for k, name in enumerate(names)}
    out = job.codes.copy()
    if "" in index:  # an empty hpc_job label: a free GPU
        out[out == index[""]] = -1
    source = np.where(out >= 0, _SOURCES.index(Attribution.HPC_JOB.value), -1)
    _by_allocation(out, source, out < 0, host, gpu, t, jobs, Attribution.SLURM, names, index)
    if pod is not None:
        _by_allocation(out, source, out < 0, pod, gpu, t, jobs, Attribution.SLURM_ON_KUBERNETES, names, index)
        _by_pod(out, source, pod, namespace, names, index)
    return Coded(out, names), Coded(source, list(_SOURCES))


def _by_pod(
    out: np.ndarray, source: np.ndarray, pod: Coded, namespace: Coded | None, names: list[str], index: dict[str, int]
) -> None:
    """The rows still nobody's that carry a pod label: the workload ``namespace/pod`` (``default`` without a
    namespace; the pod alone when the rows have no namespace column)."""
    rest = np.flatnonzero((out < 0) & (pod.codes >= 0))  # a pod label is never empty (``_first``)
    if not rest.size:
        return
    spaces = namespace.take(rest) if namespace is not None else Coded(np.full(rest.size, -1), [])
    pairs, per_pair = joint_codes(pod.take(rest), spaces)
    workloads = [f"{space or 'default'}/{name}" if namespace is not None else str(name) for name, space in per_pair]
    codes = np.array([_code_of(w, names, index) for w in workloads], dtype=np.int64)
    out[rest] = codes[pairs]
    source[rest] = _SOURCES.index(Attribution.KUBERNETES.value)


def _code_of(name: str, names: list[str], index: dict[str, int]) -> int:
    """``name``'s code, added to ``names`` when new."""
    if name not in index:
        index[name] = len(names)
        names.append(name)
    return index[name]


def _by_allocation(
    out: np.ndarray,
    source: np.ndarray,
    missing: np.ndarray,
    node: Coded,
    gpu: Coded,
    t: np.ndarray,
    jobs: Sequence[Job],
    how: Attribution,
    names: list[str],
    index: dict[str, int],
) -> None:
    """Fill ``out``/``source`` where ``missing`` from the Slurm jobs holding (node, gpu) at t (a later job
    in ``jobs`` over an earlier one)."""
    rows = np.flatnonzero(missing & (node.codes >= 0) & (gpu.codes >= 0))
    if not rows.size:
        return
    width = len(gpu.names)
    pair = node.codes[rows] * width + gpu.codes[rows]
    order = np.argsort(pair, kind="stable")
    pair, rows = pair[order], rows[order]
    keys, first, count = np.unique(pair, return_index=True, return_counts=True)
    block = {k: (lo, lo + n) for k, lo, n in zip(keys.tolist(), first.tolist(), count.tolist())}
    node_code = {name: k for k, name in enumerate(node.names)}
    gpu_code = {name: k for k, name in enumerate(gpu.names)}
    how_code = _SOURCES.index(how.value)
    for j in jobs:
        if j.start is None:
            continue
        end = np.inf if j.end is None else j.end
        for name, gpus in j.gpus_by_node.items():
            n = node_code.get(name)
            if n is None:
                continue
            for g in gpus:
                c = gpu_code.get(str(g))
                found = None if c is None else block.get(n * width + c)
                if found is None:
                    continue
                held = rows[found[0] : found[1]]
                hit = held[(t[held] > j.start) & (t[held] <= end)]
                if hit.size:
                    out[hit] = _code_of(j.id, names, index)
                    source[hit] = how_code


# -- the report ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DcgmRows:
    """The DCGM rows in (metric, host, device, t) order, each with the workload it counts for (``job``, -1:
    nobody's) and how that was found (``source``)."""

    metric: Coded
    host: Coded
    device: Coded
    job: Coded
    source: Coded
    profile: Coded
    t: np.ndarray
    value: np.ndarray

    def take(self, rows: np.ndarray) -> _DcgmRows:
        coded = {
            name: getattr(self, name).take(rows) for name in ("metric", "host", "device", "job", "source", "profile")
        }
        return _DcgmRows(**coded, t=self.t[rows], value=self.value[rows])

    def rows_of(self, metric: str) -> np.ndarray:
        return np.flatnonzero(self.metric.codes == self.metric.code(metric))


def _dcgm_frame(samples: pa.Table, jobs: Sequence[Job], shape: Shape) -> tuple[_DcgmRows, Shape]:
    """The DCGM rows, each with its device (``gpu`` or ``gpu.instance``), workload and source; a MIG
    instance's engine activity stands in for the utilisation it does not report (module doc), where the
    window has none: ``shape`` and these rows' own devices, which are returned."""
    sub = _rows_of(samples, DCGM_METRICS)
    metric, host, gpu, hpc_job = (Coded.of(sub.column(name)) for name in ("metric", "host", "gpu", "job"))
    labels = _label_fields(sub.column("labels"))
    t = np.asarray(sub.column("t").to_numpy(zero_copy_only=False), dtype=float)
    value = np.asarray(sub.column("value").to_numpy(zero_copy_only=False), dtype=float)
    device = _devices(gpu, labels["instance"])
    shape = shape.union(_gpu_shape(metric, host, device))
    job, source = _attributed(host, gpu, t, hpc_job, jobs, pod=labels["pod"], namespace=labels["namespace"])
    metric, value = _engine_activity_as_util(metric, host, device, value, shape)
    rows = _DcgmRows(
        metric=metric, host=host, device=device, job=job, source=source, profile=labels["profile"], t=t, value=value
    )
    order = np.lexsort((t, device.ranks(), host.ranks(), metric.ranks()))
    if (np.diff(order) == 1).all():  # the store's order already (by metric, host, gpu, t): no copy of each column
        return rows, shape
    return rows.take(order), shape


def _gpu_shape(metric: Coded, host: Coded, device: Coded) -> Shape:
    pairs, per_pair = joint_codes(host, device)

    def devices(name: str) -> frozenset[tuple[Any, Any]]:
        rows = metric.codes == metric.code(name)
        return frozenset(per_pair[k] for k in np.unique(pairs[rows]).tolist())

    return Shape(util=devices(UTIL), engine=devices(GR_ACTIVE))


def _hca_shape(ports: _Ports | None) -> Shape:
    hcas = frozenset() if ports is None else frozenset((host, dev) for _, host, dev in ports[1])
    return Shape(util=frozenset(), engine=frozenset(), hcas=hcas)


def _devices(gpu: Coded, instance: Coded) -> Coded:
    """``device_key`` of each row: the GPU column itself unless a row has a MIG instance or no GPU."""
    if not (instance.codes >= 0).any() and all(gpu.names) and (gpu.codes >= 0).all():
        return gpu
    pairs, per_pair = joint_codes(gpu, instance)
    keys = Coded.of_values(device_key(g, i) for g, i in per_pair)
    return Coded(keys.codes[pairs], keys.names)


def _engine_activity_as_util(
    metric: Coded, host: Coded, device: Coded, value: np.ndarray, shape: Shape
) -> tuple[Coded, np.ndarray]:
    """Rows of DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio) become utilisation (%) on devices without GPU_UTIL
    (in the whole window: ``shape``)."""
    active = metric.codes == metric.code(GR_ACTIVE)
    if not active.any():
        return metric, value
    gpus, per_gpu = joint_codes(host, device)
    without_util = np.array([pair not in shape.util for pair in per_gpu], dtype=bool)
    swap = active & without_util[gpus]
    if not swap.any():
        return metric, value
    names = list(metric.names)
    codes = metric.codes.copy()
    codes[swap] = _code_of(UTIL, names, {name: k for k, name in enumerate(names)})
    return Coded(codes, names), np.where(swap, value * 100.0, value)


@dataclass(frozen=True, slots=True)
class _Holders:
    """The workload holding each GPU at each of its utilisation samples (None: free): the jobs whose GPUs
    share a rail's InfiniBand bytes at that time (``_accumulate_ib``)."""

    series: dict[tuple[Any, Any], int]
    """(host, device) of every GPU with utilisation samples -> its code in ``key``."""
    times: np.ndarray
    """The distinct utilisation sample times, sorted."""
    key: np.ndarray
    """series code x len(times) + time's index, per utilisation sample, sorted."""
    job: Coded
    """Per entry of ``key``, its workload."""
    gpus: list[tuple[str, str]]
    """Per code of ``series``, its (host, device) as the accumulators key them (text)."""

    @classmethod
    def empty(cls) -> _Holders:
        return cls({}, np.zeros(0), np.zeros(0, dtype=np.int64), Coded(np.zeros(0, dtype=np.int64), []), [])

    def jobs_at(self, series: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The workload's code at each (series, t), -1 where that GPU had no utilisation sample at exactly t or
        was free then; the last of two samples at one time, as a dictionary keyed by (GPU, t) keeps."""
        out = np.full(len(series), -1, dtype=np.int64)
        if not len(self.key) or not len(series):
            return out
        at = np.minimum(np.searchsorted(self.times, t), len(self.times) - 1)
        wanted = series * len(self.times) + at
        pos = np.searchsorted(self.key, wanted, side="right") - 1
        found = (series >= 0) & (self.times[at] == t) & (pos >= 0)
        found &= self.key[np.maximum(pos, 0)] == wanted
        out[found] = self.job.codes[pos[found]]
        return out

    def cell_key(self, job: int, gpu: int) -> CellKey:
        """The accumulator key of workload code ``job`` on GPU code ``gpu``."""
        return (str(self.job.names[job]), *self.gpus[gpu])


def _holders(rows: _DcgmRows, series: np.ndarray, series_names: list[tuple[Any, Any]]) -> _Holders:
    """``_Holders`` of the utilisation rows (free GPUs too: the rail map needs every GPU of a host)."""
    util = rows.rows_of(UTIL)
    if not util.size:
        return _Holders.empty()
    codes, kept = np.unique(series[util], return_inverse=True)
    times, at = np.unique(rows.t[util], return_inverse=True)
    key = kept.reshape(-1) * len(times) + at.reshape(-1)
    order = np.argsort(key, kind="stable")  # equal keys keep their row order: the last one wins a lookup
    gpus = [series_names[c] for c in codes.tolist()]
    return _Holders(
        series={gpu: k for k, gpu in enumerate(gpus)},
        times=times,
        key=key[order],
        job=rows.job.take(util[order]),
        gpus=[(str(host), str(device)) for host, device in gpus],
    )


def _accumulate_dcgm(rows: _DcgmRows, part: Partial) -> _Holders:
    """Fill ``part``'s per (job, host, device) accumulators, series gaps and ends, vectorised; return who held
    each GPU at each of its utilisation samples (the IB attribution looks jobs up there)."""
    if not len(rows.t):
        return _Holders.empty()
    series, series_names = joint_codes(rows.host, rows.device)
    texts = [(str(h), str(d)) for h, d in series_names]  # a null as "None", as the accumulators always keyed it
    job, job_names = rows.job.codes, rows.job.names
    metric = rows.metric.codes
    n_series = max(len(series_names), 1)
    # Rows are sorted by (metric, host, device, t): a row starts a series when its metric or series changes.
    first = np.ones(len(series), dtype=bool)
    first[1:] = (series[1:] != series[:-1]) | (metric[1:] != metric[:-1])
    held = job >= 0
    cell_of = np.where(held, job * n_series + series, -1)
    cells, inverse = np.unique(cell_of[held], return_inverse=True)
    cell = np.full(len(series), -1, dtype=np.int64)
    cell[held] = inverse.reshape(-1)
    n = len(cells)
    value, t = rows.value, rows.t
    keys = [(str(job_names[code // n_series]), *texts[code % n_series]) for code in cells.tolist()]

    def rows_held(name: str) -> np.ndarray:
        return np.flatnonzero((metric == rows.metric.code(name)) & held)

    def total(name: str) -> tuple[list[Exact], np.ndarray]:
        r = rows_held(name)
        return exact_sums(cell[r], value[r], n), np.bincount(cell[r], minlength=n)

    def extreme(name: str, ufunc: np.ufunc, column: np.ndarray, start: float) -> np.ndarray:
        out = np.full(n, start)
        r = rows_held(name)
        ufunc.at(out, cell[r], column[r])
        return out

    util_sum, util_n = total(UTIL)
    tensor_sum, tensor_n = total(TENSOR)
    power_sum, power_n = total(POWER)
    util_max, fb_max = extreme(UTIL, np.fmax, value, np.nan), extreme(FB, np.fmax, value, np.nan)
    first_t, last_t = extreme(UTIL, np.fmin, t, np.nan), extreme(UTIL, np.fmax, t, np.nan)
    gap = np.where(first, 0, np.rint(np.diff(t, prepend=t[0]) * 1000.0)).astype(np.int64)  # ms
    for name in GAP_METRICS:
        r = np.flatnonzero((metric == rows.metric.code(name)) & ~first)
        pairs, per_pair = _pairs(series[r], gap[r])
        for (s, g), count in zip(per_pair, np.bincount(pairs, minlength=len(per_pair)).tolist()):
            histogram = part.gaps.setdefault((name, *texts[s]), {})
            histogram[g] = histogram.get(g, 0) + count
    # Energy: deltas of the counter inside a series, each the later sample's job's, summed by the gap they span
    # (which count is known once the series' median gap is: ``_energy_mj``); a negative one is a reset (driver
    # reload), skipped.
    delta = np.diff(value, prepend=np.nan)
    energy = np.flatnonzero((metric == rows.metric.code(ENERGY)) & held & ~first & (delta >= 0))
    energy_by_gap: list[dict[int, Exact]] = [{} for _ in range(n)]
    pairs, per_pair = _pairs(cell[energy], gap[energy])
    for (c, g), summed in zip(per_pair, exact_sums(pairs, delta[energy], len(per_pair))):
        energy_by_gap[c][g] = summed
    # XID: a new non-zero value of the "last XID" gauge is one more error.
    previous = np.where(first, 0.0, np.concatenate([[0.0], value[:-1]]))
    r = rows_held(XID)
    xid = np.bincount(cell[r], weights=((value != 0) & (value != previous))[r], minlength=n)
    sources = _cell_names(cell[held], rows.source.take(held), n)
    profiles = _cell_names(cell[held], rows.profile.take(held), n)
    _keep_ends(part, rows, series, texts, first, cell, keys)

    part.cells = Cells.of(
        keys,
        {
            "util_sum": util_sum, "util_n": util_n, "tensor_sum": tensor_sum, "tensor_n": tensor_n,
            "power_sum": power_sum, "power_n": power_n, "fb_max": fb_max, "util_max": util_max, "xid": xid,
            "first_t": first_t, "last_t": last_t,
        },
        {
            "sources": [frozenset(v for v in src if v) for src in sources],
            "profile": [next((v for v in sorted(prof, key=str) if v), None) for prof in profiles],
            "energy_by_gap": energy_by_gap,
        },
    )  # fmt: skip
    return _holders(rows, series, series_names)


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """A code per row for its (a, b) integer pair, and each code's pair."""
    if not len(a):
        return np.zeros(0, dtype=np.int64), []
    distinct, codes = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
    return codes.reshape(-1), [(int(x), int(y)) for x, y in distinct.tolist()]


def _keep_ends(
    part: Partial,
    rows: _DcgmRows,
    series: np.ndarray,
    texts: list[tuple[str, str]],
    first: np.ndarray,
    cell: np.ndarray,
    keys: list[CellKey],
) -> None:
    """Each utilisation, energy and XID series' first and last sample (``Partial.add`` joins stretches there)."""
    last = np.ones(len(first), dtype=bool)
    last[:-1] = first[1:]
    starts, ends, series_keys = [], [], []
    for name in (UTIL, ENERGY, XID):
        mine = rows.metric.codes == rows.metric.code(name)
        starts.append(np.flatnonzero(mine & first))
        ends.append(np.flatnonzero(mine & last))
        series_keys += [(name, *texts[s]) for s in series[starts[-1]].tolist()]
    start, end = np.concatenate(starts), np.concatenate(ends)
    part.ends = SeriesEnds.of(
        series_keys,
        {"first_t": rows.t[start], "first_v": rows.value[start], "last_t": rows.t[end], "last_v": rows.value[end]},
        {"first_cell": [keys[c] if c >= 0 else None for c in cell[start].tolist()]},
    )


def _cell_names(cell: np.ndarray, values: Coded, n: int) -> list[set[Any]]:
    """The distinct ``values`` (None for a null) of each of ``n`` cells (few: a source name, a MIG profile)."""
    out: list[set[Any]] = [set() for _ in range(n)]
    table = values.table()
    width = len(table)
    # Each distinct (cell, value) once, as integers: a 1,536-GPU job has 100,000 rows and a few values.
    for pair in np.unique(cell * width + np.where(values.codes < 0, width - 1, values.codes)).tolist():
        out[pair // width].add(table[pair % width])
    return out


def _accumulate_ib(sub: pa.Table, ports: _Ports | None, holders: _Holders, shape: Shape, part: Partial) -> None:
    """IB deltas of port mlx5_h go to the jobs on the GPUs of rail h (g * H // G == h), split equally.

    Every share (``delta // rails``) is a whole number, so they are summed as integers per (job, host, GPU)
    by numpy (at 1,024 nodes a job's nodes hold 250,000 IB rows a minute): exact in any order, whatever the
    total (a 1,536-GPU job passes 2**53 bytes, a float's exact range, in minutes). Only a share that is not
    a finite integer of int64's range (a NaN or absurd counter) makes them float additions one by one, in
    time order (a float sum depends on its order). Each port's first and last sample are kept
    (``PortEnds``): the delta from a stretch before this one ends at the first."""
    if ports is None:
        return
    rows = _ib_rows(sub, ports, shape)
    t, series, value, rails = rows
    order = np.lexsort((value, t, series))  # per series, by time (then value, as sorting (t, v) pairs did)
    t, series, value = t[order], series[order], value[order]
    _keep_port_ends(part, t, series, value, rails, holders)
    delta = np.diff(value)
    pair = np.flatnonzero((series[1:] == series[:-1]) & ~(delta < 0))  # a reset (delta < 0) is skipped
    railed = np.array([len(gpus) for *_, gpus in rails], dtype=np.int64)[series[1:][pair]]
    pair, railed = pair[railed > 0], railed[railed > 0]
    share = delta[pair] // railed
    shares = _RailShares.of(t[1:][pair], series[1:][pair], rails, holders)
    if not (np.isfinite(share).all() and float(np.abs(share).sum()) < 2.0**62):
        _add_ib_in_order(shares, share, holders, part)
        return
    _add_ib_summed(shares, share.astype(np.int64), holders, part)


def _keep_port_ends(
    part: Partial,
    t: np.ndarray,
    series: np.ndarray,
    value: np.ndarray,
    rails: list[tuple[str, str, str, list[Any]]],
    holders: _Holders,
) -> None:
    """Each port's first and last sample, and the cells holding its rail's GPUs at the first."""
    starts = np.flatnonzero(np.concatenate([[True], series[1:] != series[:-1]]))
    ends = np.concatenate([starts[1:] - 1, [len(series) - 1]])
    shares = _RailShares.of(t[starts], series[starts], rails, holders)
    held, cell = shares.cells(holders)
    cells_of: list[list[CellKey]] = [[] for _ in starts]
    for at, code in zip(shares.pair[held].tolist(), cell.tolist()):
        job, gpu = divmod(code // 2, len(holders.series))
        cells_of[at].append(holders.cell_key(job, gpu))
    keys = [rails[s][:3] for s in series[starts].tolist()]  # (metric, host, HCA)
    part.ports = PortEnds.of(
        keys,
        {
            "first_t": t[starts], "first_v": value[starts], "last_t": t[ends], "last_v": value[ends],
            "transmitted": [name == IB_TX for name, _, _ in keys],
            "rail_gpus": [len(rails[s][3]) for s in series[starts].tolist()],
        },
        {"first_cells": [tuple(cells) for cells in cells_of]},
    )  # fmt: skip


def _ib_rows(
    sub: pa.Table, ports: _Ports, shape: Shape
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[str, str, str, list[Any]]]]:
    """The IB rows with a host as (t, series code, value) and per series (metric, host, device, its rail's
    GPUs: by the window's GPUs and HCAs of the host, ``shape``)."""
    keep, keys, series = ports
    gpus_sorted = {h: sorted(gpus, key=_num) for h, gpus in shape.gpus_by_host().items()}
    hcas_of_host = shape.hca_count()
    rails_of: dict[tuple[str, int, tuple[str, ...]], list[str]] = {}  # hosts of one node type share their rail maps
    rails = []
    for name, h, dev in keys:
        rail = (dev, hcas_of_host.get(h, 0), tuple(gpus_sorted.get(h, ())))
        if rail not in rails_of:
            rails_of[rail] = _rail_gpus(*rail[:2], list(rail[2]))
        rails.append((name, h, dev, rails_of[rail]))
    t = sub.column("t").to_numpy()[keep].astype(float)
    value = sub.column("value").to_numpy()[keep].astype(float)
    return t, series, value, rails


#: ``_ib_ports``: the IB rows that have a host (a mask), each port's (metric, host, HCA device), each kept row's port.
_Ports = tuple[np.ndarray, list[tuple[Any, Any, Any]], np.ndarray]


def _ib_ports(sub: pa.Table) -> _Ports | None:
    """The IB rows that have a host (a mask), each port's (metric, host, HCA device) and each kept row's port
    code; None when no row has a host."""
    if not sub.num_rows:
        return None
    labels, host = Coded.of(sub.column("labels")), Coded.of(sub.column("host"))
    # A row's host: its host column, else its labels' (node-exporter's target); one text table for both.
    hosts = [*host.names, *labels.per_name(lambda lab: _host_of(None, lab))]
    own = np.array([bool(h) for h in host.names] + [False], dtype=bool)[host.codes]
    row_host = np.where(own, host.codes, len(host.names) + np.where(labels.codes >= 0, labels.codes, len(labels.names)))
    keep = np.array([bool(h) for h in hosts], dtype=bool)[row_host]
    if not keep.any():
        return None
    devices = labels.per_name(_device_of)
    series, keys = joint_codes(
        Coded.of(sub.column("metric")).take(keep),
        Coded.of_values(hosts).take(row_host[keep]),
        Coded.of_values(devices).take(np.where(labels.codes >= 0, labels.codes, len(labels.names))[keep]),
    )
    return keep, keys, series


@functools.lru_cache(maxsize=_PARSED_LABEL_SETS)
def _device_of(labels: str | None) -> str:
    """An HCA's ``device`` label (node-exporter's infiniband collector), "" without one."""
    return str(orjson.loads(labels).get("device", "")) if labels else ""


@dataclass(frozen=True, slots=True)
class _RailShares:
    """Each IB delta once per GPU of its port's rail, with the workload holding that GPU at the delta's time."""

    pair: np.ndarray
    """The delta's index (among ``_accumulate_ib``'s pairs), in order: pair by pair, each rail's GPUs in turn."""
    gpu: np.ndarray
    """The GPU's code in ``_Holders.series`` (-1: a GPU without utilisation samples)."""
    job: np.ndarray
    """The workload's code in ``_Holders.job`` (-1: nobody's)."""
    transmitted: np.ndarray
    """True for a transmit counter's delta, False for a receive counter's."""

    @classmethod
    def of(
        cls, t: np.ndarray, series: np.ndarray, rails: list[tuple[str, str, str, list[Any]]], holders: _Holders
    ) -> _RailShares:
        gpus_of = [[holders.series.get((host, gpu), -1) for gpu in gpus] for _, host, _, gpus in rails]
        count = np.array([len(g) for g in gpus_of], dtype=np.int64)
        flat = np.array([g for gpus in gpus_of for g in gpus], dtype=np.int64)
        start = np.cumsum(count) - count
        per_pair = count[series]
        pair = np.repeat(np.arange(len(series)), per_pair)
        nth = np.arange(len(pair)) - np.repeat(np.cumsum(per_pair) - per_pair, per_pair)
        gpu = flat[start[series][pair] + nth] if len(pair) else np.zeros(0, dtype=np.int64)
        transmitted = np.array([name == IB_TX for name, *_ in rails], dtype=bool)[series[pair]]
        return cls(pair=pair, gpu=gpu, job=holders.jobs_at(gpu, t[pair]), transmitted=transmitted)

    def cells(self, holders: _Holders) -> tuple[np.ndarray, np.ndarray]:
        """The shares a job held (their indices), and each one's cell: its job, GPU and direction as one integer
        (``_credit`` reads it back)."""
        held = np.flatnonzero(self.job >= 0)
        return held, (self.job[held] * len(holders.series) + self.gpu[held]) * 2 + self.transmitted[held]


def _add_ib_summed(shares: _RailShares, share: np.ndarray, holders: _Holders, part: Partial) -> None:
    """Each share to each GPU of its rail held by a job at the share's time, summed per (job, host, GPU) as
    integers: one sum per job a GPU saw, not one addition per sample."""
    held, cell = shares.cells(holders)
    if not held.size:
        return
    order = np.argsort(cell, kind="stable")
    keys, first = np.unique(cell[order], return_index=True)
    sums = np.add.reduceat(share[shares.pair[held][order]], first)  # int64: exact
    _credit(keys, sums.tolist(), holders, part)


def _add_ib_in_order(shares: _RailShares, share: np.ndarray, holders: _Holders, part: Partial) -> None:
    """The shares added one at a time, series by series in time order (a float sum depends on its order)."""
    held, cell = shares.cells(holders)
    _credit(cell, share[shares.pair[held]].tolist(), holders, part)


def _credit(cells: np.ndarray, amounts: list[Any], holders: _Holders, part: Partial) -> None:
    """Add each amount, in order, to its cell's (job, host, GPU) accumulator, transmitted or received."""
    rest, transmitted = np.divmod(cells, 2)
    job, gpu = np.divmod(rest, len(holders.series))
    keys = [holders.cell_key(j, g) for j, g in zip(job.tolist(), gpu.tolist())]
    values = np.array([float(amount) for amount in amounts], dtype=np.float64)
    part.cells.credit_ib(keys, values, transmitted.astype(bool))


def _num(text: str) -> tuple[int, str]:
    m = re.match(r"\d+", text)
    return (int(m.group()), text) if m else (1 << 30, text)


def _rail_gpus(device: str, hcas: int, gpus: list[str]) -> list[str]:
    m = re.search(r"(\d+)$", device)
    if not m or not hcas or not gpus:
        return []
    h = int(m.group(1))
    return [g for g in gpus if _num(g)[0] * hcas // len(gpus) == h]


def _keep_lustre(samples: pa.Table, part: Partial) -> None:
    """Per (metric, Lustre jobid, target), the largest cumulative byte count seen (``_lustre_bytes`` sums them)."""
    sub = _rows_of(samples, LUSTRE_METRICS)
    best = part.lustre
    if sub.num_rows:
        for name, job, lab, v in zip(
            sub.column("metric").to_pylist(),
            sub.column("job").to_pylist(),
            sub.column("labels").to_pylist(),
            sub.column("value").to_pylist(),
        ):
            labels = orjson.loads(lab) if lab else {}
            jid = job or labels.get("jobid")
            if not jid:
                continue
            key = (name, str(jid), str(labels.get("target", "")))
            best[key] = max(best.get(key, 0.0), v)


def _lustre_bytes(best: Mapping[tuple[str, str, str], float]) -> dict[str, tuple[int, int]]:
    """Per Lustre jobid: sum over targets of the largest cumulative read / write sum seen."""
    out: dict[str, list[int]] = {}
    for (name, jid, _), v in best.items():
        slot = out.setdefault(jid, [0, 0])
        slot[0 if name == LUSTRE_READ else 1] += int(v)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


@dataclass(frozen=True, slots=True, kw_only=True)
class _SlurmUsage:
    """What sacct said of one job (sources/slurm.py writes these samples)."""

    cpus: int | None = None
    cpu_seconds: float | None = None
    memory_requested_bytes: int | None = None
    max_rss_by_node: tuple[tuple[str, int], ...] = ()
    time_limit_s: float | None = None
    elapsed_s: float | None = None
    """A running job's elapsed time at the latest Slurm snapshot (squeue, slurmrestd, sacct)."""


def _keep_slurm(samples: pa.Table, part: Partial) -> None:
    """Per (job, metric) the last value of each SLURM_METRICS sample; MaxRSS: the largest per node."""
    sub = _rows_of(samples, SLURM_METRICS)
    if not sub.num_rows:
        return
    last, rss = part.slurm_last, part.max_rss
    for name, job, t, v, lab in zip(
        sub.column("metric").to_pylist(),
        sub.column("job").to_pylist(),
        sub.column("t").to_pylist(),
        sub.column("value").to_pylist(),
        sub.column("labels").to_pylist(),
    ):
        if not job:
            continue
        if name == vocab.SLURM_JOB_MAX_RSS_BYTES:
            node = str((orjson.loads(lab) if lab else {}).get("node") or "")
            per = rss.setdefault(job, {})
            per[node] = max(per.get(node, 0), int(v))
        elif (job, name) not in last or t >= last[(job, name)][0]:
            last[(job, name)] = (t, v)


def _slurm_usage(part: Partial) -> dict[str, _SlurmUsage]:
    """Per job id, what Slurm said last (``_keep_slurm``)."""
    last, rss = part.slurm_last, part.max_rss
    out = {}
    for job in {j for j, _ in last} | set(rss):

        def get(name: str, job: str = job) -> float | None:
            return last[(job, name)][1] if (job, name) in last else None

        cpus, mem = get(vocab.SLURM_JOB_CPUS), get(vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES)
        out[job] = _SlurmUsage(
            cpus=None if cpus is None else int(cpus),
            cpu_seconds=get(vocab.SLURM_JOB_CPU_SECONDS),
            memory_requested_bytes=None if mem is None else int(mem),
            max_rss_by_node=tuple(sorted(rss.get(job, {}).items())),
            time_limit_s=get(vocab.SLURM_JOB_TIME_LIMIT_SECONDS),
            elapsed_s=get(vocab.SLURM_JOB_ELAPSED_SECONDS),
        )
    return out


def job_reports(
    samples: pa.Table, jobs: Sequence[Job], *, now: float | None = None, only: str | None = None
) -> list[JobReport]:
    """One report per workload: each job that ran (``start`` set), in job order, then each workload known
    only from its samples (an ``hpc_job`` label, a pod), by id. ``now`` ends still-running jobs (default:
    the latest sample time). ``only``: the report of that workload alone (the rows are still attributed
    among every job; the job page's store holds 4,000 other jobs at 1,024 nodes)."""
    return reports_of(partial_of(samples, jobs), jobs, now=now, only=only)


def partial_of(samples: pa.Table, jobs: Sequence[Job], *, shape: Shape | None = None) -> Partial:
    """What ``samples`` say of each workload among ``jobs`` (``analysis.jobpartial``). ``shape``: the devices of
    the whole window when ``samples`` are one stretch of it, as far as known; those of ``samples`` are added
    to it (the ``Partial``'s ``shapes`` says which it was read with)."""
    part = Partial()
    if not samples.num_rows:
        return part
    ib = _rows_of(samples, IB_METRICS)
    ports = _ib_ports(ib)
    known = _hca_shape(ports) if shape is None else shape.union(_hca_shape(ports))
    rows, shape = _dcgm_frame(samples, jobs, known)
    part.shapes = {shape}
    holders = _accumulate_dcgm(rows, part)
    _accumulate_ib(ib, ports, holders, shape, part)
    _keep_lustre(samples, part)
    _keep_slurm(samples, part)
    newest = pc.max(samples.column("t")).as_py()
    part.newest_t = None if newest is None else float(newest)
    return part


def reports_of(
    part: Partial, jobs: Sequence[Job], *, now: float | None = None, only: str | None = None
) -> list[JobReport]:
    """``job_reports`` from what the samples said (``partial_of``, joined stretches)."""
    if now is None:
        now = report_time(part, jobs)
    lustre = _lustre_bytes(part.lustre)
    usage = _slurm_usage(part)
    by_job: dict[str, list[_Cell]] = {}
    for (job, host, device), a in part.cells.items():
        if only is None or job == only:  # a job page's window holds its neighbours' cells too
            by_job.setdefault(job, []).append(_finished(part, host, device, a))
    known = {j.id for j in jobs}
    seen_only = [
        Job(
            id=job_id,
            account=_namespace_of(job_id, by_job[job_id]),
            nodes=tuple(sorted({c.host for c in by_job[job_id]})),
        )
        for job_id in sorted(set(by_job) - known)
    ]
    return [
        _report(j, by_job.get(j.id, []), lustre.get(j.id, (0, 0)), usage.get(j.id), now)
        for j in [*(j for j in jobs if j.start is not None), *seen_only]
        if only is None or j.id == only
    ]


def report_time(part: Partial, jobs: Sequence[Job]) -> float:
    """The time a report of ``part`` speaks at (a running job's wall time ends there): its newest sample, else
    the latest start or end of ``jobs``."""
    if part.newest_t is not None:
        return part.newest_t
    return max((j.end or j.start or 0.0 for j in jobs), default=0.0)


@dataclass(frozen=True, slots=True)
class _Cell:
    """One (workload, host, device)'s sums, with what needs the series' whole history: its observed time and
    the energy deltas it counts."""

    host: str
    device: str
    acc: Acc
    energy_mj: Exact
    observed_s: float


def _finished(part: Partial, host: str, device: str, a: Acc) -> _Cell:
    """Observed time: utilisation samples x the series' median gap; energy: the deltas across at most
    ``MAX_COUNTER_GAP_INTERVALS`` median gaps of the energy series (more: nobody watched that stretch)."""
    interval = median_gap_s(part.gaps.get((UTIL, host, device)))
    step_ms = median_gap_s(part.gaps.get((ENERGY, host, device))) * 1000.0
    limit = MAX_COUNTER_GAP_INTERVALS * step_ms if step_ms > 0 else np.inf
    energy = ZERO
    for gap, delta in sorted(a.energy_by_gap.items()):
        if gap <= limit:
            energy = exact_plus(energy, delta)
    return _Cell(host=host, device=device, acc=a, energy_mj=energy, observed_s=a.util_n * interval)


def _namespace_of(job_id: str, cells: list[_Cell]) -> str | None:
    """A pod seen only in dcgm-exporter's labels: its namespace stands where Slurm puts the account."""
    if any(Attribution.KUBERNETES.value in c.acc.sources for c in cells) and "/" in job_id:
        return job_id.split("/", 1)[0]
    return None


def _gpu_report(c: _Cell) -> GpuReport:
    a = c.acc
    gpu, _, instance = c.device.partition(".")
    return GpuReport(
        host=c.host,
        gpu=gpu,
        instance=instance or None,
        profile=a.profile,
        samples=a.util_n,
        mean_util_pct=_mean(a.util_sum[0], a.util_n),
        max_util_pct=a.util_max,
        mean_tensor_active=_mean(a.tensor_sum[0], a.tensor_n),
        max_fb_used_bytes=int(a.fb_max * MIB) if a.fb_max is not None else None,
        mean_power_w=_mean(a.power_sum[0], a.power_n),
        energy_kwh=c.energy_mj[0] / MJ_PER_KWH,
        xid_errors=a.xid,
        idle=a.util_max is not None and a.util_max < IDLE_UTIL_PCT,
        observed_s=c.observed_s,
    )


def _allocation(job: Job) -> str | None:
    """The record's origin: a Slurm job, a pod from ``kubectl get pods`` (id ``namespace/pod``), or none."""
    if job.start is None and not job.gpus:
        return None
    return "kubernetes" if "/" in job.id else "slurm"


def _report(job: Job, cells: list[_Cell], lustre: tuple[int, int], usage: _SlurmUsage | None, now: float) -> JobReport:
    cells = sorted(cells, key=lambda c: (c.host, _num(c.device), c.device))
    per_gpu = tuple(_gpu_report(c) for c in cells)
    total = Acc.total([c.acc for c in cells])
    energy_mj = ZERO
    for c in cells:
        energy_mj = exact_plus(energy_mj, c.energy_mj)
    observed_s = sum(c.observed_s for c in cells)
    first_seen, last_seen = _window(cells)
    allocation = _allocation(job)
    observed_h = observed_s / 3600.0
    if allocation is not None and job.start is not None:
        elapsed = _elapsed(job, usage, now)
        allocated_h: float | None = job.gpus * elapsed / 3600.0
    else:
        # both ends are None together: a cell's first_t and last_t come from the same utilisation samples
        elapsed = last_seen - first_seen if first_seen is not None and last_seen is not None else 0.0
        allocated_h = None
    fbs = [c.acc.fb_max for c in cells if c.acc.fb_max is not None]
    gpus = job.gpus if allocation is not None and job.gpus else len(per_gpu)
    report = JobReport(
        id=job.id,
        user=job.user,
        account=job.account,
        partition=job.partition,
        name=job.name,
        state=job.state,
        nodes=tuple(job.nodes),
        gpus=gpus,
        start=job.start,
        end=job.end,
        elapsed_s=elapsed,
        gpu_hours=allocated_h if allocated_h is not None else observed_h,
        energy_kwh=energy_mj[0] / MJ_PER_KWH,
        mean_gpu_util=_mean(total.util_sum[0], total.util_n),
        mean_tensor_active=_mean(total.tensor_sum[0], total.tensor_n),
        max_fb_used_bytes=int(max(fbs) * MIB) if fbs else None,
        mean_power_w=_mean(total.power_sum[0], total.power_n),
        ib_tx_bytes=int(total.ib_tx),
        ib_rx_bytes=int(total.ib_rx),
        lustre_read_bytes=lustre[0],
        lustre_write_bytes=lustre[1],
        xid_errors=total.xid,
        idle_gpus=sum(g.idle for g in per_gpu),
        per_gpu=per_gpu,
        allocation=allocation,
        attributed_by=tuple(sorted(total.sources, key=lambda v: _TRUST.get(v, 99))),
        gpus_observed=len(per_gpu),
        gpu_hours_allocated=allocated_h,
        gpu_hours_observed=observed_h,
        observed_start=first_seen,
        observed_end=last_seen,
        coverage=observed_h / allocated_h if allocated_h else None,
        **_usage_fields(usage, elapsed),
    )
    return _with_advice(report)


def _elapsed(job: Job, usage: _SlurmUsage | None, now: float) -> float:
    """End - start of a finished job. A running one ran until Slurm's latest snapshot of it (its elapsed
    sample), else until ``now``, and never past its time limit: Slurm kills it there (issue #22: a 1 h job
    read with samples 2.75 days later counted 66 h)."""
    assert job.start is not None
    if job.end is not None:
        return max(0.0, job.end - job.start)
    said = usage.elapsed_s if usage is not None else None
    elapsed = max(0.0, said if said is not None else now - job.start)
    limit = usage.time_limit_s if usage is not None else None
    return min(elapsed, limit) if limit else elapsed


def _window(cells: list[_Cell]) -> tuple[float | None, float | None]:
    """First sample's interval start .. last sample, over the job's GPUs."""
    starts = [
        c.acc.first_t - (c.observed_s / c.acc.util_n if c.acc.util_n else 0.0)
        for c in cells
        if c.acc.first_t is not None
    ]
    ends = [c.acc.last_t for c in cells if c.acc.last_t is not None]
    return (min(starts) if starts else None, max(ends) if ends else None)


def _usage_fields(usage: _SlurmUsage | None, elapsed_s: float) -> dict[str, Any]:
    if usage is None:
        return {}
    cpu_util = (
        100.0 * usage.cpu_seconds / (usage.cpus * elapsed_s)
        if usage.cpu_seconds is not None and usage.cpus and elapsed_s > 0
        else None
    )
    return {
        "cpus": usage.cpus,
        "cpu_util_pct": cpu_util,
        "memory_requested_bytes": usage.memory_requested_bytes,
        "max_rss_bytes_by_node": usage.max_rss_by_node,
        "time_limit_s": usage.time_limit_s,
        "time_limit_used": elapsed_s / usage.time_limit_s if usage.time_limit_s else None,
    }


# Advice thresholds. Ours (jobstats prints the same kinds of note, with its own site-set cut-offs): each is a
# level below which asking for less would not have slowed the job and would have freed the resource.
#: Mean GPU utilisation under this: the job could have run on fewer GPUs.
LOW_GPU_UTIL_PCT = 50.0
#: Mean CPU utilisation (TotalCPU / CPUs x elapsed) under this: fewer CPU cores would do.
LOW_CPU_UTIL_PCT = 50.0
#: Largest per-node MaxRSS under this share of the memory requested per node: memory over-requested.
LOW_MEMORY_USED = 0.25
#: Elapsed under this share of the time limit: a shorter limit would backfill sooner.
LOW_TIME_LIMIT_USED = 0.25
#: Samples covering less than this share of the allocation: the report speaks for the observed window only.
LOW_COVERAGE = 0.9
GB = 1e9


def _size(n_bytes: float) -> str:
    """GB, or MB under one GB (a 3 MB MaxRSS is not "0.0 GB")."""
    return f"{n_bytes / GB:.1f} GB" if n_bytes >= GB else f"{n_bytes / 1e6:.1f} MB"


#: The advice notes, by key: English templates over the values ``_with_advice`` gives each (the web
#: catalogues word the same keys in French: web/fr.yaml ``advice``).
ADVICE: Mapping[str, str] = {
    "idle_gpus": "{idle} of {observed} GPUs stayed below {threshold} % utilisation the whole time: ask for fewer "
    "GPUs or make the code use them.",
    "unmonitored_gpus": "{allocated} GPUs allocated, samples from {observed}: the others were not monitored "
    "(exporter down, or not dcgm-exporter's GPUs).",
    "low_gpu_util": "mean GPU utilisation {util} %: check the input pipeline, or run on fewer GPUs.",
    "low_cpu_util": "CPU utilisation {util} % of {cpus} cores: about {cores} cores would have done.",
    "memory": "memory: {requested} requested per node, at most {used} used: ask for less.",
    "time_limit": "ran {used} % of its time limit: a shorter limit starts sooner.",
    "coverage": "samples cover {coverage} % of the allocation: energy, utilisation and bytes are over the observed "
    "window only.",
}


def _with_advice(r: JobReport) -> JobReport:
    items = _advice_items(r)
    if not items:
        return r
    return replace(r, advice=tuple(ADVICE[key].format(**values) for key, values in items), advice_items=tuple(items))


def _advice_items(r: JobReport) -> list[tuple[str, dict[str, str]]]:
    items = []
    if r.idle_gpus:
        items.append(
            (
                "idle_gpus",
                {"idle": str(r.idle_gpus), "observed": str(r.gpus_observed), "threshold": f"{IDLE_UTIL_PCT:.0f}"},
            )
        )
    if r.allocation and r.gpus > r.gpus_observed > 0:
        items.append(("unmonitored_gpus", {"allocated": str(r.gpus), "observed": str(r.gpus_observed)}))
    if r.mean_gpu_util is not None and r.mean_gpu_util < LOW_GPU_UTIL_PCT and not r.idle_gpus:
        items.append(("low_gpu_util", {"util": f"{r.mean_gpu_util:.0f}"}))
    # sacct's TotalCPU and MaxRSS grow as steps end: for a running job they are not yet the job's, so the CPU
    # and memory notes wait for its end (jobstats reads them from sacct only for finished jobs too).
    if r.end is not None and r.cpus and r.cpu_util_pct is not None:
        cores = max(1, round(r.cpus * r.cpu_util_pct / 100))
        if r.cpu_util_pct < LOW_CPU_UTIL_PCT and cores < r.cpus:
            items.append(("low_cpu_util", {"util": f"{r.cpu_util_pct:.0f}", "cpus": str(r.cpus), "cores": str(cores)}))
    if r.end is not None and r.memory_requested_bytes and r.max_rss_bytes_by_node:
        used = max(v for _, v in r.max_rss_bytes_by_node)
        per_node = r.memory_requested_bytes / max(1, len(r.nodes) or len(r.max_rss_bytes_by_node))
        if used < LOW_MEMORY_USED * per_node:
            items.append(("memory", {"requested": _size(per_node), "used": _size(used)}))
    if r.time_limit_used is not None and r.end is not None and r.time_limit_used < LOW_TIME_LIMIT_USED:
        items.append(("time_limit", {"used": f"{100 * r.time_limit_used:.0f}"}))
    if r.coverage is not None and r.coverage < LOW_COVERAGE:
        items.append(("coverage", {"coverage": f"{100 * r.coverage:.0f}"}))
    return items


def report_dict(report: JobReport, *, per_gpu: bool = False) -> dict[str, Any]:
    """The JSON shape of ``hpcwatch jobs --json`` (and ``job ID --json`` with ``per_gpu``)."""
    doc: dict[str, Any] = {
        "id": report.id,
        "user": report.user,
        "account": report.account,
        "partition": report.partition,
        "name": report.name,
        "state": report.state,
        "nodes": list(report.nodes),
        "gpus": report.gpus,
        "start": report.start,
        "end": report.end,
        "elapsed_s": report.elapsed_s,
        "gpu_hours": report.gpu_hours,
        "energy_kwh": report.energy_kwh,
        "mean_gpu_util": report.mean_gpu_util,
        "mean_tensor_active": report.mean_tensor_active,
        "max_fb_used_bytes": report.max_fb_used_bytes,
        "mean_power_w": report.mean_power_w,
        "ib_bytes": report.ib_bytes,
        "ib_tx_bytes": report.ib_tx_bytes,
        "ib_rx_bytes": report.ib_rx_bytes,
        "lustre_bytes": report.lustre_bytes,
        "lustre_read_bytes": report.lustre_read_bytes,
        "lustre_write_bytes": report.lustre_write_bytes,
        "xid_errors": report.xid_errors,
        "idle_gpus": report.idle_gpus,
        "allocation": report.allocation,
        "attributed_by": list(report.attributed_by),
        "gpus_observed": report.gpus_observed,
        "gpu_hours_allocated": report.gpu_hours_allocated,
        "gpu_hours_observed": report.gpu_hours_observed,
        "observed_window": {"start": report.observed_start, "end": report.observed_end},
        "coverage": report.coverage,
        "cpus": report.cpus,
        "cpu_util_pct": report.cpu_util_pct,
        "memory_requested_bytes": report.memory_requested_bytes,
        "max_rss_bytes_by_node": dict(report.max_rss_bytes_by_node),
        "time_limit_s": report.time_limit_s,
        "time_limit_used": report.time_limit_used,
        "advice": list(report.advice),
    }
    if per_gpu:
        doc["per_gpu"] = [
            {
                "host": g.host,
                "gpu": g.gpu,
                "instance": g.instance,
                "profile": g.profile,
                "device": g.device,
                "samples": g.samples,
                "mean_util_pct": g.mean_util_pct,
                "max_util_pct": g.max_util_pct,
                "mean_tensor_active": g.mean_tensor_active,
                "max_fb_used_bytes": g.max_fb_used_bytes,
                "mean_power_w": g.mean_power_w,
                "energy_kwh": g.energy_kwh,
                "xid_errors": g.xid_errors,
                "idle": g.idle,
                "observed_s": g.observed_s,
            }
            for g in report.per_gpu
        ]
    return doc
