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
delta belongs to the job of the later sample. The first sample of a series has no delta, and an
energy delta across more than ``MAX_COUNTER_GAP_INTERVALS`` scrape intervals is dropped (nobody
watched that stretch), so a job's energy is what was measured, not what it may have used unseen.

Input: a pyarrow table with the store's sample columns (``hpcwatch.schemas.SAMPLE_SCHEMA``:
metric, t [UTC s], value, host, gpu, job, labels [JSON]) and ``records.Job``s. Pure: no store,
no printing.

jobstats: https://github.com/PrincetonUniversity/jobstats
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.records import Job

__all__ = [
    "ADVICE",
    "Attribution",
    "GpuReport",
    "JobReport",
    "attribute",
    "attribute_with_sources",
    "job_reports",
    "report_dict",
    "device_key",
    "DCGM_METRICS",
    "IB_METRICS",
    "LUSTRE_METRICS",
    "SLURM_METRICS",
    "REPORT_METRICS",
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
#: A GPU whose utilisation never reached 1 % during the job was allocated but idle (jobstats flags 0 %).
IDLE_UTIL_PCT = 1.0
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


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A text column as Python objects (None where null), converted by Arrow without a list between."""
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=object)


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


def _per_distinct(column: pa.ChunkedArray, *fns: Callable[[str | None], object]) -> list[np.ndarray]:
    """Each of ``fns`` over every row's value, a column (an object array) each: computed once per distinct
    value (label sets repeat once per sample; a null row: ``fn(None)``) and spread over the rows by index."""
    encoded = pa.chunked_array(column).combine_chunks().dictionary_encode()
    values = [*encoded.dictionary.to_pylist(), None]
    index = encoded.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False)
    columns = []
    for fn in fns:
        results = np.empty(len(values), dtype=object)
        results[:] = [fn(value) for value in values]
        columns.append(results[index])
    return columns


def _host_of(host: object, labels: str | None) -> str | None:
    """host column, else node-exporter's target labels (node, or instance without the port)."""
    if host:
        return str(host)
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


def _label_columns(labels: pa.ChunkedArray) -> dict[str, np.ndarray]:
    """instance, profile, pod, namespace per row, each distinct label set parsed once."""
    names = ("instance", "profile", "pod", "namespace")
    if not len(labels):
        return {n: np.array([], dtype=object) for n in names}
    dictionary, index = _encoded(labels)
    parsed = []
    for text in dictionary:
        lab = orjson.loads(text) if text else {}
        parsed.append(
            (
                lab.get("GPU_I_ID") or None,
                lab.get("GPU_I_PROFILE") or None,
                _first(lab, POD_LABELS),
                _first(lab, NAMESPACE_LABELS),
            )
        )
    table = np.array(parsed, dtype=object).reshape(-1, 4)
    return {n: table[index, k] for k, n in enumerate(names)}


def _encoded(column: pa.ChunkedArray) -> tuple[list[Any], np.ndarray]:
    """(distinct values, each row's index among them; a null row: 0) of a column, chunk by chunk: the
    chunks of one encoding share its dictionary, and joining them first would copy every label text."""
    chunks = pa.chunked_array(column).dictionary_encode().chunks
    index = [c.indices.fill_null(0).to_numpy(zero_copy_only=False) for c in chunks]
    return chunks[-1].dictionary.to_pylist(), np.concatenate(index).astype(np.int64, copy=False)


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
    out = np.array(job, dtype=object, copy=True)
    missing = np.array([v is None or v == "" for v in out.tolist()], dtype=bool)
    out[missing] = None
    source = np.full(len(out), Attribution.HPC_JOB.value, dtype=object)
    source[missing] = None
    _by_allocation(out, source, missing, host, gpu, t, jobs, Attribution.SLURM)
    if pod is not None:
        missing = np.array([v is None for v in out.tolist()], dtype=bool)
        _by_allocation(out, source, missing, pod, gpu, t, jobs, Attribution.SLURM_ON_KUBERNETES)
        for i in np.flatnonzero(np.array([v is None for v in out.tolist()], dtype=bool)).tolist():
            if pod[i]:
                out[i] = f"{namespace[i] or 'default'}/{pod[i]}" if namespace is not None else str(pod[i])
                source[i] = Attribution.KUBERNETES.value
    return out, source


def _by_allocation(
    out: np.ndarray,
    source: np.ndarray,
    missing: np.ndarray,
    node: np.ndarray,
    gpu: np.ndarray,
    t: np.ndarray,
    jobs: Sequence[Job],
    how: Attribution,
) -> None:
    """Fill ``out``/``source`` where ``missing`` from the Slurm jobs holding (node, gpu) at t."""
    if not missing.any():
        return
    index: dict[tuple[str, str], list[int]] = {}
    for i in np.flatnonzero(missing).tolist():
        index.setdefault((node[i], gpu[i]), []).append(i)
    for j in jobs:
        if j.start is None:
            continue
        end = np.inf if j.end is None else j.end
        for name, gpus in j.gpus_by_node.items():
            for g in gpus:
                rows = index.get((name, str(g)))
                if not rows:
                    continue
                rows_a = np.array(rows)
                hit = rows_a[(t[rows_a] > j.start) & (t[rows_a] <= end)]
                out[hit] = j.id
                source[hit] = how.value


# -- the report ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Acc:
    energy_mj: float = 0.0
    util_sum: float = 0.0
    util_n: int = 0
    tensor_sum: float = 0.0
    tensor_n: int = 0
    power_sum: float = 0.0
    power_n: int = 0
    fb_max: float | None = None
    util_max: float | None = None
    xid: int = 0
    ib_tx: float = 0.0
    ib_rx: float = 0.0
    first_t: float | None = None
    last_t: float | None = None
    observed_s: float = 0.0
    sources: set[str] = field(default_factory=set)
    profile: str | None = None


def _dcgm_frame(samples: pa.Table, jobs: Sequence[Job]) -> dict[str, np.ndarray]:
    """The DCGM rows as columns, each with its device (``gpu`` or ``gpu.instance``), workload and source;
    a MIG instance's engine activity stands in for the utilisation it does not report (module doc)."""
    sub = _rows_of(samples, DCGM_METRICS)
    f = {name: _column(sub, name) for name in ("metric", "host", "gpu", "job")}
    f.update(_label_columns(sub.column("labels")))
    f["t"] = np.asarray(sub.column("t").to_numpy(zero_copy_only=False), dtype=float)
    f["value"] = np.asarray(sub.column("value").to_numpy(zero_copy_only=False), dtype=float)
    f["device"] = _devices(f["gpu"], f["instance"])
    f["job"], f["source"] = attribute_with_sources(
        f["host"], f["gpu"], f["t"], f["job"], jobs, pod=f["pod"], namespace=f["namespace"]
    )
    _engine_activity_as_util(f)
    order = np.lexsort((f["t"], _str_rank(f["device"]), _str_rank(f["host"]), _str_rank(f["metric"])))
    if (np.diff(order) == 1).all():  # the store's order already (by metric, host, gpu, t): no copy of each column
        return f
    return {k: v[order] for k, v in f.items()}


def _devices(gpu: np.ndarray, instance: np.ndarray) -> np.ndarray:
    """``device_key`` of each row: without a MIG instance, the GPU column itself (a 1,536-GPU job's report
    holds 1.6 million rows: one call each was a twentieth of it)."""
    if any(instance.tolist()) or not all(gpu.tolist()):  # an instance, or a row without a GPU: row by row
        return np.array([device_key(g, i) for g, i in zip(gpu.tolist(), instance.tolist())], dtype=object)
    return gpu


def _str_rank(values: np.ndarray) -> np.ndarray:
    """Integer keys that sort as ``values.astype(str)`` does, ties included (None is "None"): numpy's own
    order of the distinct values, spread over the rows. Converting 870,000 objects to fixed-width text
    for ``lexsort`` was a tenth of a 1,536-GPU job's report."""
    try:
        encoded = pa.array(values.tolist(), type=pa.string()).dictionary_encode()
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all text: let numpy convert them
        return values.astype(str)
    names = [*encoded.dictionary.to_pylist(), "None"]
    _, rank = np.unique(np.array(names, dtype=str), return_inverse=True)
    codes = encoded.indices.fill_null(len(names) - 1).to_numpy(zero_copy_only=False)
    ranked: np.ndarray = rank.reshape(-1)[codes]
    return ranked


def _engine_activity_as_util(f: dict[str, np.ndarray]) -> None:
    """Rows of DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio) become utilisation (%) on devices without GPU_UTIL."""
    active = np.flatnonzero(f["metric"] == GR_ACTIVE)
    if not len(active):
        return
    util = f["metric"] == UTIL
    with_util = set(zip(f["host"][util].tolist(), f["device"][util].tolist()))
    swap = np.zeros(len(f["metric"]), dtype=bool)
    swap[
        [
            k
            for k, h, d in zip(active.tolist(), f["host"][active].tolist(), f["device"][active].tolist())
            if (h, d) not in with_util
        ]
    ] = True
    if swap.any():
        f["metric"] = f["metric"].copy()
        f["metric"][swap] = UTIL
        f["value"] = np.where(swap, f["value"] * 100.0, f["value"])


def _codes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Integer code per row (-1 for None) and the distinct values, by pyarrow's dictionary encoding."""
    encoded = pa.array(values.tolist(), type=pa.string()).dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def _series_interval_s(series: np.ndarray, t: np.ndarray, rows: np.ndarray, n_series: int) -> np.ndarray:
    """Median gap between consecutive samples of each series (0 where a series has one sample); ``rows``
    are one metric's rows, sorted by series then t."""
    out = np.zeros(max(n_series, 1))
    if len(rows) < 2:
        return out
    s, tt = series[rows], t[rows]
    same = s[1:] == s[:-1]
    gaps, owner = np.diff(tt)[same], s[1:][same]
    if not len(gaps):
        return out
    # Every series' median at once: gaps sorted within each series, then the middle one (or two).
    order = np.lexsort((gaps, owner))
    gaps, owner = gaps[order], owner[order]
    codes, first, count = np.unique(owner, return_index=True, return_counts=True)
    out[codes] = (gaps[first + (count - 1) // 2] + gaps[first + count // 2]) / 2
    return out


def _accumulate_dcgm(
    f: dict[str, np.ndarray], acc: dict[tuple[str, str, str], _Acc]
) -> dict[tuple[str, str, float], str | None]:
    """Fill per (job, host, device) accumulators, vectorised; return the job (or None) holding (host, device)
    at each utilisation sample time (the IB attribution looks jobs up there)."""
    if not len(f["t"]):
        return {}
    series, series_names = _joint_codes(f["host"], f["device"])
    job, job_names = _codes(f["job"])
    metric = f["metric"]
    n_series = max(len(series_names), 1)
    # Rows are sorted by (metric, host, device, t): a row starts a series when its metric or series changes.
    first = np.ones(len(series), dtype=bool)
    first[1:] = (series[1:] != series[:-1]) | (metric[1:] != metric[:-1])
    held = job >= 0
    cell_of = np.where(held, job * n_series + series, -1)
    cells, inverse = np.unique(cell_of[held], return_inverse=True)
    cell = np.full(len(series), -1, dtype=np.int64)
    cell[held] = inverse
    n = len(cells)
    value, t = f["value"], f["t"]

    def rows(name: str) -> np.ndarray:
        return np.flatnonzero((metric == name) & held)

    def total(name: str, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        r = rows(name)
        return (
            np.bincount(cell[r], weights=value[r] if weights is None else weights[r], minlength=n),
            np.bincount(cell[r], minlength=n),
        )

    def extreme(name: str, ufunc: np.ufunc, column: np.ndarray, start: float) -> np.ndarray:
        out = np.full(n, start)
        r = rows(name)
        ufunc.at(out, cell[r], column[r])
        return out

    util_sum, util_n = total(UTIL)
    tensor_sum, tensor_n = total(TENSOR)
    power_sum, power_n = total(POWER)
    util_max, fb_max = extreme(UTIL, np.fmax, value, np.nan), extreme(FB, np.fmax, value, np.nan)
    first_t, last_t = extreme(UTIL, np.fmin, t, np.nan), extreme(UTIL, np.fmax, t, np.nan)
    interval = _series_interval_s(series, t, np.flatnonzero(metric == UTIL), n_series)
    # Energy: deltas of the counter inside a series, each the later sample's job's; a negative one is a reset
    # (driver reload), one across a gap of more than MAX_COUNTER_GAP_INTERVALS scrape intervals spans time
    # nobody watched (a scrape outage, rows of other jobs left out): both skipped.
    delta = np.diff(value, prepend=np.nan)
    step = _series_interval_s(series, t, np.flatnonzero(metric == ENERGY), n_series)[series]
    watched = np.diff(t, prepend=np.nan) <= MAX_COUNTER_GAP_INTERVALS * np.where(step > 0, step, np.inf)
    energy_ok = ~first & watched & (delta >= 0)
    energy, _ = total(ENERGY, np.where(energy_ok, delta, 0.0))
    # XID: a new non-zero value of the "last XID" gauge is one more error.
    previous = np.where(first, 0.0, np.concatenate([[0.0], value[:-1]]))
    xid, _ = total(XID, ((value != 0) & (value != previous)).astype(float))
    sources = _cell_sets(cell[held], f["source"][held], n)
    profiles = _cell_sets(cell[held], f["profile"][held], n)

    def maybe(x: float) -> float | None:
        return None if np.isnan(x) else float(x)

    for k, code in enumerate(cells.tolist()):
        job_id = job_names[code // n_series]
        host, device = series_names[code % n_series]
        acc[(job_id, host, device)] = _Acc(
            energy_mj=float(energy[k]),
            util_sum=float(util_sum[k]),
            util_n=int(util_n[k]),
            tensor_sum=float(tensor_sum[k]),
            tensor_n=int(tensor_n[k]),
            power_sum=float(power_sum[k]),
            power_n=int(power_n[k]),
            fb_max=maybe(fb_max[k]),
            util_max=maybe(util_max[k]),
            xid=int(xid[k]),
            first_t=maybe(first_t[k]),
            last_t=maybe(last_t[k]),
            observed_s=float(util_n[k]) * float(interval[code % n_series]),
            sources={v for v in sources[k] if v},
            profile=next((v for v in sorted(profiles[k], key=str) if v), None),
        )
    u = np.flatnonzero(metric == UTIL)
    # Free GPUs too (job None): the rail map needs every GPU of a host.
    return dict(zip(zip(f["host"][u].tolist(), f["device"][u].tolist(), f["t"][u].tolist()), f["job"][u].tolist()))


def _joint_codes(*columns: np.ndarray) -> tuple[np.ndarray, list[tuple[str, ...]]]:
    """Integer code per row of the tuple of its values in several text columns, in order of first appearance,
    and each code's tuple as text (a null as "None", as an f-string writes it). From each column's codes, not
    from a joined text per row (a 1,536-GPU job's report holds 200,000 DCGM rows a minute)."""
    joint = np.zeros(len(columns[0]), dtype=np.int64)
    texts = []
    for column in columns:
        codes, distinct = _codes(column)
        texts.append(["None", *distinct])
        joint = joint * len(texts[-1]) + (codes + 1)  # a null's code -1 becomes 0
    encoded = pa.array(joint).dictionary_encode()
    tuples = []
    for code in encoded.dictionary.to_pylist():
        parts = []
        for names in reversed(texts):
            code, at = divmod(code, len(names))
            parts.append(names[at])
        tuples.append(tuple(reversed(parts)))
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), tuples


def _cell_sets(cell: np.ndarray, values: np.ndarray, n: int) -> list[set[Any]]:
    """The distinct ``values`` of each cell (few: a source name, a MIG profile)."""
    out: list[set[Any]] = [set() for _ in range(n)]
    try:
        codes, names = _codes(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all text: pair them one by one
        for c, v in set(zip(cell.tolist(), values.tolist())):
            out[c].add(v)
        return out
    # Each distinct (cell, value) once, as integers: a 1,536-GPU job has 100,000 rows and a few values.
    named: list[str | None] = [*names, None]
    width = len(named)
    for pair in np.unique(cell * width + np.where(codes < 0, width - 1, codes)).tolist():
        out[pair // width].add(named[pair % width])
    return out


def _accumulate_ib(
    samples: pa.Table, holder: dict[tuple[str, str, float], str | None], acc: dict[tuple[str, str, str], _Acc]
) -> None:
    """IB deltas of port mlx5_h go to the jobs on the GPUs of rail h (g * H // G == h), split equally.

    Every share (``delta // rails``) is a whole number, so they are summed as integers per (job, host, GPU)
    by numpy (at 1,024 nodes a job's nodes hold 250,000 IB rows a minute): exact in any order, whatever the
    total (a 1,536-GPU job passes 2**53 bytes, a float's exact range, in minutes). Only a share that is not
    a finite integer of int64's range (a NaN or absurd counter) makes them float additions one by one, in
    time order (a float sum depends on its order)."""
    sub = _rows_of(samples, IB_METRICS)
    if not sub.num_rows:
        return
    rows = _ib_rows(sub, holder)
    if rows is None:
        return
    t, series, value, rails = rows
    order = np.lexsort((value, t, series))  # per series, by time (then value, as sorting (t, v) pairs did)
    t, series, value = t[order], series[order], value[order]
    delta = np.diff(value)
    pair = np.flatnonzero((series[1:] == series[:-1]) & ~(delta < 0))  # a reset (delta < 0) is skipped
    railed = np.array([len(gpus) for *_, gpus in rails], dtype=np.int64)[series[1:][pair]]
    pair, railed = pair[railed > 0], railed[railed > 0]
    share = delta[pair] // railed
    if not (np.isfinite(share).all() and float(np.abs(share).sum()) < 2.0**62):
        _add_ib_in_order(t, series, pair, share, rails, holder, acc)
        return
    _add_ib_summed(t[1:][pair], series[1:][pair], share.astype(np.int64), rails, holder, acc)


def _ib_rows(
    sub: pa.Table, holder: dict[tuple[str, str, float], str | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[str, str, str, list[str]]]] | None:
    """The IB rows with a host as (t, series code, value) and per series (metric, host, device, its rail's
    GPUs)."""
    label_host, device = _per_distinct(sub.column("labels"), lambda lab: _host_of(None, lab), _device_of)
    column_host = _column(sub, "host")
    own = np.array([bool(h) for h in column_host.tolist()], dtype=bool)  # the host column, else the labels'
    hosts = np.where(own, column_host, label_host)
    keep = own | np.array([bool(h) for h in label_host.tolist()], dtype=bool)
    if not keep.any():
        return None
    names = _column(sub, "metric")
    series, keys = _joint_codes(names[keep], hosts[keep], device[keep])
    gpus_of_host: dict[str, set[str]] = {}
    for gpu_host, gpu, _t in holder:
        gpus_of_host.setdefault(gpu_host, set()).add(gpu)
    hcas_of_host: dict[str, set[str]] = {}
    for _, host, dev in keys:
        hcas_of_host.setdefault(host, set()).add(dev)
    gpus_sorted = {host: tuple(sorted(gpus, key=_num)) for host, gpus in gpus_of_host.items()}
    rails_of: dict[tuple[str, int, tuple[str, ...]], list[str]] = {}  # hosts of one node type share their rail maps
    rails = []
    for name, host, dev in keys:
        shape = (dev, len(hcas_of_host.get(host, ())), gpus_sorted.get(host, ()))
        if shape not in rails_of:
            rails_of[shape] = _rail_gpus(*shape[:2], list(shape[2]))
        rails.append((name, host, dev, rails_of[shape]))
    t = sub.column("t").to_numpy()[keep].astype(float)
    value = sub.column("value").to_numpy()[keep].astype(float)
    return t, series, value, rails


def _device_of(labels: str | None) -> str:
    """An HCA's ``device`` label (node-exporter's infiniband collector), "" without one."""
    return str(orjson.loads(labels).get("device", "")) if labels else ""


def _add_ib_summed(
    t: np.ndarray,
    series: np.ndarray,
    share: np.ndarray,
    rails: list[tuple[str, str, str, list[str]]],
    holder: dict[tuple[str, str, float], str | None],
    acc: dict[tuple[str, str, str], _Acc],
) -> None:
    """Each pair's share (pairs grouped by series) to each GPU of its rail held by a job at the pair's time,
    summed per (job, host, GPU): one sum per job a GPU saw, not one addition per sample."""
    times = t.tolist()
    cuts = [0, *(np.flatnonzero(np.diff(series)) + 1).tolist(), len(series)]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        name, host, _dev, gpus = rails[series[lo]]
        for gpu in gpus:
            jobs = [holder.get((host, gpu, x)) for x in times[lo:hi]]
            for job in dict.fromkeys(jobs):
                if job is None:
                    continue
                whole = jobs.count(job) == len(jobs)  # the GPU was the job's at every sample: the usual case
                mine = share[lo:hi] if whole else share[lo:hi][np.array([j == job for j in jobs], dtype=bool)]
                a = acc.setdefault((job, host, gpu), _Acc())
                if name == IB_TX:
                    a.ib_tx += float(mine.sum())
                else:
                    a.ib_rx += float(mine.sum())


def _add_ib_in_order(
    t: np.ndarray,
    series: np.ndarray,
    pair: np.ndarray,
    share: np.ndarray,
    rails: list[tuple[str, str, str, list[str]]],
    holder: dict[tuple[str, str, float], str | None],
    acc: dict[tuple[str, str, str], _Acc],
) -> None:
    """The shares added one at a time, series by series in time order (a float sum depends on its order)."""
    for p, amount in zip(pair.tolist(), share.tolist()):
        name, host, _dev, gpus = rails[series[p + 1]]
        for gpu in gpus:
            job = holder.get((host, gpu, t[p + 1]))
            if job is None:
                continue
            a = acc.setdefault((job, host, gpu), _Acc())
            if name == IB_TX:
                a.ib_tx += amount
            else:
                a.ib_rx += amount


def _num(text: str) -> tuple[int, str]:
    m = re.match(r"\d+", text)
    return (int(m.group()), text) if m else (1 << 30, text)


def _rail_gpus(device: str, hcas: int, gpus: list[str]) -> list[str]:
    m = re.search(r"(\d+)$", device)
    if not m or not hcas or not gpus:
        return []
    h = int(m.group(1))
    return [g for g in gpus if _num(g)[0] * hcas // len(gpus) == h]


def _lustre_bytes(samples: pa.Table) -> dict[str, tuple[int, int]]:
    """Per Lustre jobid: sum over targets of the largest cumulative read / write sum seen."""
    sub = _rows_of(samples, LUSTRE_METRICS)
    best: dict[tuple[str, str, str], float] = {}
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


def _slurm_usage(samples: pa.Table) -> dict[str, _SlurmUsage]:
    """Per job id, the last value of each SLURM_METRICS sample (MaxRSS: the largest per node)."""
    sub = _rows_of(samples, SLURM_METRICS)
    if not sub.num_rows:
        return {}
    last: dict[tuple[str, str], tuple[float, float]] = {}
    rss: dict[str, dict[str, int]] = {}
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
    if now is None:
        ts = samples.column("t").to_pylist() if samples.num_rows else []
        now = max(ts) if ts else max((j.end or j.start or 0.0 for j in jobs), default=0.0)
    acc: dict[tuple[str, str, str], _Acc] = {}
    holder = _accumulate_dcgm(_dcgm_frame(samples, jobs), acc) if samples.num_rows else {}
    if samples.num_rows:
        _accumulate_ib(samples, holder, acc)
    lustre = _lustre_bytes(samples) if samples.num_rows else {}
    usage = _slurm_usage(samples) if samples.num_rows else {}
    by_job: dict[str, list[tuple[str, str, _Acc]]] = {}
    for (job, host, device), a in acc.items():
        by_job.setdefault(job, []).append((host, device, a))
    known = {j.id for j in jobs}
    seen_only = [
        Job(
            id=job_id,
            account=_namespace_of(job_id, by_job[job_id]),
            nodes=tuple(sorted({h for h, _, _ in by_job[job_id]})),
        )
        for job_id in sorted(set(by_job) - known)
    ]
    return [
        _report(j, by_job.get(j.id, []), lustre.get(j.id, (0, 0)), usage.get(j.id), now)
        for j in [*(j for j in jobs if j.start is not None), *seen_only]
        if only is None or j.id == only
    ]


def _namespace_of(job_id: str, cells: list[tuple[str, str, _Acc]]) -> str | None:
    """A pod seen only in dcgm-exporter's labels: its namespace stands where Slurm puts the account."""
    if any(Attribution.KUBERNETES.value in a.sources for _, _, a in cells) and "/" in job_id:
        return job_id.split("/", 1)[0]
    return None


def _gpu_report(host: str, device: str, a: _Acc) -> GpuReport:
    gpu, _, instance = device.partition(".")
    return GpuReport(
        host=host,
        gpu=gpu,
        instance=instance or None,
        profile=a.profile,
        samples=a.util_n,
        mean_util_pct=_mean(a.util_sum, a.util_n),
        max_util_pct=a.util_max,
        mean_tensor_active=_mean(a.tensor_sum, a.tensor_n),
        max_fb_used_bytes=int(a.fb_max * MIB) if a.fb_max is not None else None,
        mean_power_w=_mean(a.power_sum, a.power_n),
        energy_kwh=a.energy_mj / MJ_PER_KWH,
        xid_errors=a.xid,
        idle=a.util_max is not None and a.util_max < IDLE_UTIL_PCT,
        observed_s=a.observed_s,
    )


def _allocation(job: Job) -> str | None:
    """The record's origin: a Slurm job, a pod from ``kubectl get pods`` (id ``namespace/pod``), or none."""
    if job.start is None and not job.gpus:
        return None
    return "kubernetes" if "/" in job.id else "slurm"


def _report(
    job: Job, cells: list[tuple[str, str, _Acc]], lustre: tuple[int, int], usage: _SlurmUsage | None, now: float
) -> JobReport:
    cells = sorted(cells, key=lambda c: (c[0], _num(c[1]), c[1]))
    per_gpu = tuple(_gpu_report(host, device, a) for host, device, a in cells)
    total = _Acc()
    for _, _, a in cells:
        for name in (
            "energy_mj",
            "util_sum",
            "util_n",
            "tensor_sum",
            "tensor_n",
            "power_sum",
            "power_n",
            "xid",
            "ib_tx",
            "ib_rx",
            "observed_s",
        ):
            setattr(total, name, getattr(total, name) + getattr(a, name))
        total.sources |= a.sources
    first_seen, last_seen = _window(cells)
    allocation = _allocation(job)
    observed_h = total.observed_s / 3600.0
    if allocation is not None and job.start is not None:
        elapsed = _elapsed(job, usage, now)
        allocated_h: float | None = job.gpus * elapsed / 3600.0
    else:
        # both ends are None together: a cell's first_t and last_t come from the same utilisation samples
        elapsed = last_seen - first_seen if first_seen is not None and last_seen is not None else 0.0
        allocated_h = None
    fbs = [a.fb_max for _, _, a in cells if a.fb_max is not None]
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
        energy_kwh=total.energy_mj / MJ_PER_KWH,
        mean_gpu_util=_mean(total.util_sum, total.util_n),
        mean_tensor_active=_mean(total.tensor_sum, total.tensor_n),
        max_fb_used_bytes=int(max(fbs) * MIB) if fbs else None,
        mean_power_w=_mean(total.power_sum, total.power_n),
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


def _window(cells: list[tuple[str, str, _Acc]]) -> tuple[float | None, float | None]:
    """First sample's interval start .. last sample, over the job's GPUs."""
    starts = [a.first_t - (a.observed_s / a.util_n if a.util_n else 0.0) for _, _, a in cells if a.first_t is not None]
    ends = [a.last_t for _, _, a in cells if a.last_t is not None]
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
