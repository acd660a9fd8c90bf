"""One job's life as time series: what the job page's charts draw (``GET /job/ID``, ``GET /api/job/ID``).

From the samples of the job's report (``reports.jobs.job_samples``: its nodes during its run, its label
anywhere, read a stretch at a time; or the app's Prometheus) and its executed steps, every series is
bucketed on one grid over the job's window, at most ``MAX_BUCKETS`` buckets whatever the job's length::

    t0 (first start)                                              t1 (end; running: newest sample)
    |  b0  |  b1  |  b2  |   …   | bn-1 |     bucket_s: the shortest power of two of seconds >= both
                                            window / (MAX_BUCKETS - 1) and the slowest scrape interval

A power of two (32 s for an hour, 8,192 s for ten days), so that the grid of the window a page drew divides
the grid of the window it has grown to: a server keeps the charts' cells of a running job from page to page
(``reports.jobstretches.KeptStretches``) and adds them up into the coarser buckets, reading only what is new.

==============  ====  ===============================================================================
key             unit  value of a bucket
==============  ====  ===============================================================================
``gpu_util``    %     DCGM_FI_DEV_GPU_UTIL: each of the job's GPUs' mean in the bucket, then the mean
                      over the GPUs that reported in it
``power``       W     DCGM_FI_DEV_POWER_USAGE: each GPU's mean in the bucket, summed over the GPUs that
                      reported in it
``step_time``   s     the job's executed steps (``reports.goodput.goodput_steps``, re-runs apart): the
                      mean time of the steps that ended in the bucket
``ib_tx``       B/s   node-exporter's InfiniBand data counters of the job's nodes: per port, the rate
``ib_rx``             between consecutive samples (a counter reset skipped), its mean in the bucket,
                      summed over ports. A node's ports, not the job's share: a node shared with
                      another job counts both
``lustre_read`` B/s   Lustre job_stats labelled with the job: the same rate, summed over targets
``lustre_write``
==============  ====  ===============================================================================

The clock is the samples' own time (UTC s, the exporter's scrape), and a step's end for step times.
A bucket in which nothing reported is None, never filled: when an XID stops a GPU, its series ends
there. A series the store holds nothing of is left out (never zeros). MIG instances and GPUs that
report only engine activity are not drawn (the report's table has them).

Memory: a 1,024-GPU job over days is a few tens of millions of rows; they are read a stretch at a time as
pyarrow / numpy columns, grouped with ``bincount`` into (series × bucket) cells, never Python objects per
row; a counter's rate between two stretches joins the last sample of one to the first of the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.analysis.attribution import JobReport
from hpcwatch.analysis.coded import as_text
from hpcwatch.analysis.goodput import StepTable
from hpcwatch.records import Job
from hpcwatch.reports.checkpointfiles import OnDisk
from hpcwatch.reports.jobstretches import (
    Checkpoint,
    KeptStretches,
    PageReads,
    WindowRead,
    checkpoint_cuts,
    read_end,
    stretches,
    window_written,
)

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["MAX_BUCKETS", "SERIES_METRICS", "Series", "JobSeries", "job_series", "series_dict"]

#: Buckets of a chart at most: 120 points are 3 px apart in a 360 px chart, finer than a reader can tell
#: apart, and the page stays the same size for a 10-minute job and a 10-day one. Ours.
MAX_BUCKETS: Final = 120
CLOCK: Final = "sample time, UTC s"

UTIL, POWER = vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_POWER_USAGE
IB_TX = vocab.NODE_INFINIBAND_PORT_DATA_TRANSMITTED_BYTES_TOTAL
IB_RX = vocab.NODE_INFINIBAND_PORT_DATA_RECEIVED_BYTES_TOTAL
LUSTRE_READ, LUSTRE_WRITE = vocab.LUSTRE_JOB_READ_BYTES_TOTAL, vocab.LUSTRE_JOB_WRITE_BYTES_TOTAL
#: The samples the series read (all within ``attribution.REPORT_METRICS``: the report's table has them).
SERIES_METRICS: Final = (UTIL, POWER, IB_TX, IB_RX, LUSTRE_READ, LUSTRE_WRITE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One chart: a value per bucket of its ``JobSeries``."""

    key: str
    """``gpu_util``, ``power``, ``step_time``, ``ib_tx``, ``ib_rx``, ``lustre_read``, ``lustre_write``."""
    unit: str
    """``%``, ``W``, ``s`` or ``B/s``."""
    aggregation: str
    """How a bucket's value is made (module table): ``mean_over_gpus``, ``sum_over_gpus``,
    ``mean_over_steps``, ``sum_over_ports``, ``sum_over_targets``."""
    source: str
    """The metric read (``steps`` for step times)."""
    values: tuple[float | None, ...]
    """One per bucket; None where nothing reported."""

    @property
    def points(self) -> int:
        return sum(v is not None for v in self.values)

    @property
    def low(self) -> float | None:
        return min((v for v in self.values if v is not None), default=None)

    @property
    def high(self) -> float | None:
        return max((v for v in self.values if v is not None), default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSeries:
    """The job's window, its bucket grid and the series drawn on it."""

    t0: float
    """Window start (UTC s): the job's first start, else its first sample or step."""
    t1: float
    """Window end (UTC s): the job's end, else its newest sample or step."""
    bucket_s: float
    buckets: int
    series: tuple[Series, ...]
    clock: str = CLOCK

    def bucket_start(self, i: int) -> float:
        return self.t0 + i * self.bucket_s


def job_series(
    store: Store,
    job_id: str,
    *,
    report: JobReport | None,
    samples: pa.Table | None,
    steps: StepTable,
    first_start: float | None,
    max_buckets: int = MAX_BUCKETS,
    kept: KeptStretches | None = None,
    window: WindowRead | None = None,
    reads: PageReads | None = None,
) -> JobSeries | None:
    """``job_id``'s series over its life. ``samples``: the report's (None: the store's over the job's nodes and
    window, read stretch by stretch: ``reports.jobstretches.stretches``; ``kept``: from the checkpoints a server
    keeps of them; ``window``: all of them, read already for the report; ``reads``: what the page's report read
    in one query, read again from memory when it holds what follows the charts' checkpoint); ``steps``: its
    executed steps; ``first_start``: ``reports.jobs.first_start``. None when there is no window (no start, no
    sample, no step)."""
    span = _window(report, steps, first_start)
    if span is None:
        return None
    t0, t1 = span
    step_end = steps.start_s + steps.dur_s
    inside = (step_end >= t0) & (step_end <= t1)
    step_t, step_v = step_end[inside], steps.dur_s[inside]
    charts = _Charts(report, job_id, t0, t1, _median_gap(np.sort(step_t)), max_buckets)
    if samples is not None:
        charts.add(samples)
    elif report is not None and report.nodes:
        charts = _from_store(store, charts, kept, window, reads)
    bucket_s, n = charts.grid()
    out = []
    for key, unit, how, metric in _PLAN:
        if key == "step_time":
            if len(step_t):
                values = _across(np.zeros(len(step_t), dtype=np.int64), _bucket(step_t, t0, bucket_s, n), step_v, n)
                out.append(Series(key=key, unit=unit, aggregation=how, source="steps", values=values))
            continue
        drawn = charts.values(metric, mean=how.startswith("mean"))
        if drawn is not None:
            out.append(Series(key=key, unit=unit, aggregation=how, source=metric, values=drawn))
    return JobSeries(t0=t0, t1=t1, bucket_s=bucket_s, buckets=n, series=tuple(out))


def _from_store(
    store: Store,
    charts: _Charts,
    kept: KeptStretches | None,
    window: WindowRead | None,
    reads: PageReads | None = None,
) -> _Charts:
    """``charts`` fed the job's window from the store (``window``: all of it, read already), a stretch at a time,
    from ``kept``'s newest checkpoint that is still true on (the same GPUs and nodes; no row landed before it
    since); what follows it from ``reads`` when the page's report read it already."""
    report = charts.report
    assert report is not None
    record = Job(id=charts.job_id, nodes=report.nodes, end=charts.t1)
    gpus = tuple(sorted(f"{g.host}/{g.gpu}" for g in report.per_gpu if g.instance is None))

    def fingerprint(upto: float) -> tuple[str, ...]:
        return gpus

    checkpoints = []
    if window is not None:
        version, resumed = window.version, None
        charts.add(window.table)
    else:
        version = store.version  # before any read: a row committed during the reads is checked next time
        written = window_written(store, record, charts.t0, SERIES_METRICS)
        resumed = (
            kept.resume(
                store, "charts", record, charts.t0, written=written, fingerprint=fingerprint, on_disk=CHARTS_ON_DISK
            )
            if kept
            else None
        )
        if resumed is not None and resumed.checkpoint.state.t1 > charts.t1:  # the window shrank (the job ended)
            resumed = None
        if resumed is not None:
            charts = resumed.checkpoint.state.resumed(charts.t1, charts.step_interval, report)
        start = resumed.checkpoint.upto if resumed is not None else charts.t0
        cuts = checkpoint_cuts(start, charts.t1, resumed=resumed is not None) if kept is not None else []
        shared = reads.rows_from(SERIES_METRICS, record, start, charts.t1) if reads is not None else None
        if shared is not None:
            version = min(version, shared.version)  # a row committed after the report's read: the next page's
            pieces = shared.cut(cuts)
        else:
            pieces = stretches(store, SERIES_METRICS, record, start, charts.t1, cuts=cuts)
        for b, table in pieces:
            charts.add(table)
            del table
            if b in cuts:
                checkpoints.append(Checkpoint(b, gpus, charts.copy()))
    if kept is not None:
        # Every row of the window to its end was read: the next page reads on from there (not a copy: the page
        # only reads ``charts`` from here, and a page that resumes from it adds to a copy, ``_Charts.resumed``).
        checkpoints.append(Checkpoint(read_end(charts.t1), gpus, charts))
        kept.keep(
            store,
            "charts",
            record,
            t0=charts.t0,
            version=version,
            extra=None,
            resumed=resumed,
            checkpoints=checkpoints,
            newest=charts.t1,
            on_disk=CHARTS_ON_DISK,
        )
    return charts


def _grid(t0: float, t1: float, intervals: list[float], max_buckets: int) -> tuple[float, int]:
    """(bucket_s, buckets): the shortest power-of-two seconds that draws the window in ``max_buckets`` buckets
    and is no finer than any of ``intervals``. A power of two, so that the grid of an older window divides
    this one's: what a server kept of the job's charts is added up into it (``_Charts.resumed``)."""
    need = max((t1 - t0) / max(max_buckets - 1, 1), *intervals, 1e-3)
    bucket_s = 2.0 ** math.ceil(math.log2(need))
    return bucket_s, min(max_buckets, int((t1 - t0) // bucket_s) + 1)


class _Charts:
    """The (series x bucket) sums and counts of each metric, fed a stretch of samples at a time (or all of
    them at once), on the ``_grid`` of the window and the scrape intervals of the first stretch with rows; a
    counter's rate across two stretches joins the last sample of one to the first of the next."""

    def __init__(
        self, report: JobReport | None, job_id: str, t0: float, t1: float, step_interval: float, max_buckets: int
    ) -> None:
        self.report, self.job_id, self.t0, self.t1 = report, job_id, t0, t1
        self.step_interval, self.max_buckets = step_interval, max_buckets
        self.intervals: list[float] | None = None
        """Each family's scrape interval (``_interval``), from the first stretch with its rows."""
        self.index: dict[str, dict[str, int]] = {m: {} for m in SERIES_METRICS}
        """Per metric, each series' key -> its row in ``count`` and ``total``."""
        self.count: dict[str, np.ndarray] = {}
        """Per metric, (series x bucket) sample counts on ``grid()``."""
        self.total: dict[str, np.ndarray] = {}
        self.last: dict[str, dict[int, tuple[float, float]]] = {m: {} for m in SERIES_METRICS}
        """Per counter metric, each series' last (t, value) so far."""

    def grid(self) -> tuple[float, int]:
        return _grid(self.t0, self.t1, [*(self.intervals or []), self.step_interval], self.max_buckets)

    def add(self, samples: pa.Table) -> None:
        rows = _families(samples, self.report, self.job_id, self.t0, self.t1)
        if not rows:
            return
        if self.intervals is None:
            self.intervals = [_interval(t, codes) for t, codes, _, _ in rows.values()]
        bucket_s, n = self.grid()
        for metric, (t, codes, keys, v) in rows.items():
            series = self._series(metric, codes, keys)
            if metric in _COUNTERS:
                t, series, v = self._rates(metric, t, series, v)
            if not len(t):  # a counter's single sample: no rate yet
                continue
            bucket = _bucket(t, self.t0, bucket_s, n)
            # Only the buckets the rows fall in are counted (a page seconds after the last adds to one or two of
            # 120, at 1,536 GPUs a few hundred KB where the whole grid was megabytes a metric).
            lo, hi = int(bucket.min()), int(bucket.max()) + 1
            rows_n, width = len(self.index[metric]), hi - lo
            cell = series * width + (bucket - lo)
            counts = np.bincount(cell, minlength=rows_n * width).reshape(rows_n, width)
            totals = np.bincount(cell, weights=v, minlength=rows_n * width).reshape(rows_n, width)
            self.count[metric] = _plus(self.count.get(metric), (rows_n, n), lo, counts)
            self.total[metric] = _plus(self.total.get(metric), (rows_n, n), lo, totals)

    def copy(self) -> _Charts:
        """These charts, to add to without changing them. The cells' arrays are shared: ``add`` and ``resumed``
        put new arrays in their place and never write into one (at 1,536 GPUs they are megabytes a metric)."""
        out = _Charts(self.report, self.job_id, self.t0, self.t1, self.step_interval, self.max_buckets)
        out.intervals = None if self.intervals is None else list(self.intervals)
        out.index = {m: dict(keys) for m, keys in self.index.items()}
        out.count = dict(self.count)
        out.total = dict(self.total)
        out.last = {m: dict(ends) for m, ends in self.last.items()}
        return out

    def to_plain(self) -> dict[str, Any]:
        """These charts in builtins and arrays (``reports.checkpointfiles``), without the report they were drawn
        for: the page that resumes from them gives its own (``from_plain``)."""
        return {name: getattr(self, name) for name in _PLAIN_FIELDS}

    @classmethod
    def from_plain(cls, plain: dict[str, Any], report: JobReport | None) -> _Charts:
        """The charts ``to_plain`` wrote, for ``report``. ``ValueError`` when ``plain`` is not what it writes."""
        if not isinstance(plain, dict) or set(plain) != set(_PLAIN_FIELDS):
            raise ValueError("not the charts' plain form")
        out = cls(report, plain["job_id"], plain["t0"], plain["t1"], plain["step_interval"], plain["max_buckets"])
        for name in ("intervals", "index", "count", "total", "last"):
            setattr(out, name, plain[name])
        if set(out.index) != set(SERIES_METRICS) or set(out.last) != set(SERIES_METRICS):
            raise ValueError("the charts' plain form is of other metrics")
        return out

    def resumed(self, t1: float, step_interval: float, report: JobReport | None) -> _Charts:
        """A copy for the window grown to ``t1`` and this page's ``report``: its cells added up into the new grid
        (a multiple of theirs)."""
        out = self.copy()
        out.report = report
        before, _ = self.grid()
        out.t1, out.step_interval = t1, step_interval
        bucket_s, n = out.grid()
        ratio = max(1, round(bucket_s / before))
        for cells in (out.count, out.total):
            for metric, old in cells.items():
                cells[metric] = _coarsened(old, ratio, n)
        return out

    def _series(self, metric: str, codes: np.ndarray, keys: list[str]) -> np.ndarray:
        """The rows' series as rows of this metric's cells (new series added)."""
        index = self.index[metric]
        rows = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
        series: np.ndarray = rows[codes]
        return series

    def _rates(
        self, metric: str, t: np.ndarray, series: np.ndarray, v: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_rates`` of these rows, with each series' last sample of the stretches before them in front."""
        last = self.last[metric]
        known = np.unique(series)
        before = [s for s in known.tolist() if s in last]
        t_all = np.concatenate([[last[s][0] for s in before], t])
        v_all = np.concatenate([[last[s][1] for s in before], v])
        s_all = np.concatenate([np.array(before, dtype=np.int64), series])
        order = np.lexsort((t_all, s_all))  # stable: a series' carried sample stays first among equal times
        s_sorted, t_sorted, v_sorted = s_all[order], t_all[order], v_all[order]
        ends = np.flatnonzero(np.concatenate([s_sorted[1:] != s_sorted[:-1], [True]]))
        for s, t_end, v_end in zip(s_sorted[ends].tolist(), t_sorted[ends].tolist(), v_sorted[ends].tolist()):
            last[s] = (t_end, v_end)
        return _rates(t_all, s_all, v_all)

    def values(self, metric: str, *, mean: bool) -> tuple[float | None, ...] | None:
        """The metric's value per bucket (module table); None when no row of it counted."""
        count = self.count.get(metric)
        if count is None or not count.any():
            return None
        return _across_cells(count, self.total[metric], mean=mean)


#: How the charts' checkpoints go to disk (``reports.checkpointfiles``): without their report.
CHARTS_ON_DISK: Final = OnDisk(_Charts.to_plain, lambda plain: _Charts.from_plain(plain, None))

#: What ``_Charts.to_plain`` keeps: all but the report.
_PLAIN_FIELDS: Final = (
    "job_id",
    "t0",
    "t1",
    "step_interval",
    "max_buckets",
    "intervals",
    "index",
    "count",
    "total",
    "last",
)

#: The counters drawn as rates (their delta between consecutive samples over the time between them).
_COUNTERS: Final = frozenset({IB_TX, IB_RX, LUSTRE_READ, LUSTRE_WRITE})


def _grown(cells: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray:
    """``cells`` (None: none yet) with zero rows below them up to ``shape`` (new series); ``cells`` themselves
    when they have that shape (read only: shared by the charts' copies)."""
    if cells is not None and cells.shape == shape:
        return cells
    grown = np.zeros(shape)
    if cells is not None:
        grown[: cells.shape[0], : cells.shape[1]] = cells
    return grown


def _plus(cells: np.ndarray | None, shape: tuple[int, int], lo: int, part: np.ndarray) -> np.ndarray:
    """A new array: ``cells`` grown to ``shape`` (``_grown``) with ``part`` added to its columns from ``lo`` on
    (``cells`` are never written into: the charts' copies share them)."""
    out = _grown(cells, shape)
    if out is cells:
        out = out.copy()
    out[:, lo : lo + part.shape[1]] += part
    return out


def _coarsened(cells: np.ndarray, ratio: int, n: int) -> np.ndarray:
    """(series x bucket) cells added up ``ratio`` buckets to one, ``n`` buckets wide (``cells`` themselves when
    they are already: read only)."""
    m, width = cells.shape
    if ratio == 1 and width == n:
        return cells
    padded = np.zeros((m, max(n * ratio, width)))
    padded[:, :width] = cells
    out: np.ndarray = padded[:, : n * ratio].reshape(m, n, ratio).sum(axis=2)
    return out


#: (key, unit, aggregation, metric), in the page's order.
_PLAN: Final = (
    ("gpu_util", "%", "mean_over_gpus", UTIL),
    ("power", "W", "sum_over_gpus", POWER),
    ("step_time", "s", "mean_over_steps", ""),
    ("ib_tx", "B/s", "sum_over_ports", IB_TX),
    ("ib_rx", "B/s", "sum_over_ports", IB_RX),
    ("lustre_read", "B/s", "sum_over_targets", LUSTRE_READ),
    ("lustre_write", "B/s", "sum_over_targets", LUSTRE_WRITE),
)


def _window(report: JobReport | None, steps: StepTable, first_start: float | None) -> tuple[float, float] | None:
    """From the job's first start (else its first sample or step) to its end (else its newest sample or step)."""
    starts = [] if report is None else [report.start, report.observed_start]
    ends = [] if report is None else [report.observed_end]
    if len(steps):
        starts.append(float(steps.start_s.min()))
        ends.append(float((steps.start_s + steps.dur_s).max()))
    t0 = first_start if first_start is not None else min((t for t in starts if t is not None), default=None)
    t1 = report.end if report is not None and report.end is not None else None
    if t1 is None:
        t1 = max((t for t in ends if t is not None), default=None)
    if t0 is None or t1 is None or t1 <= t0:
        return None
    return t0, t1


def _families(
    samples: pa.Table, report: JobReport | None, job_id: str, t0: float, t1: float
) -> dict[str, tuple[np.ndarray, np.ndarray, list[str], np.ndarray]]:
    """Per metric of ``SERIES_METRICS`` with rows: (t, series code, each code's key, value) of the job's rows in
    the window. A series is a GPU (host/gpu) for DCGM, a port (host + labels) for InfiniBand, a target (labels)
    for Lustre."""
    t = samples.column("t")
    in_window = pc.and_(pc.greater_equal(t, t0), pc.less_equal(t, t1))
    out = {}
    for metric in SERIES_METRICS:
        family = _FAMILY.get(metric, metric)
        mask = pc.and_(in_window, pc.equal(samples.column("metric"), metric))
        if not pc.any(mask).as_py():
            continue
        # Only the columns the family reads: filtering copies them, and labels are most of the bytes.
        rows, key = _jobs_rows(samples.select(_COLUMNS[family]).filter(mask), family, report, job_id)
        if not rows.num_rows:
            continue
        encoded = pc.dictionary_encode(pc.fill_null(key, "")).combine_chunks()
        out[metric] = (
            np.asarray(rows.column("t").to_numpy(), dtype=float),
            np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64),
            [str(k) for k in encoded.dictionary.to_pylist()],
            np.asarray(rows.column("value").to_numpy(), dtype=float),
        )
    return out


#: The metric whose rows and series a metric selects alike.
_FAMILY: Final = {POWER: UTIL, IB_RX: IB_TX, LUSTRE_WRITE: LUSTRE_READ}
_COLUMNS: Final = {
    UTIL: ["t", "value", "host", "gpu", "job"],
    IB_TX: ["t", "value", "host", "labels"],
    LUSTRE_READ: ["t", "value", "job", "labels"],
}


def _jobs_rows(rows: pa.Table, family: str, report: JobReport | None, job_id: str) -> tuple[pa.Table, pa.ChunkedArray]:
    """The job's rows of one metric and their series key: on its GPUs (the report's, whole GPUs; key
    host/gpu) and not labelled with another job (dcgm-exporter's ``hpc_job``: the GPU was someone else's
    then); on its nodes (InfiniBand; key host + labels, a port); labelled with it (Lustre's ``jobid``;
    key labels, a target)."""
    if family == UTIL:
        key = _gpu_key(rows)
        whole = {f"{g.host}/{g.gpu}" for g in report.per_gpu if g.instance is None} if report else set()
        other_job = pc.fill_null(pc.not_equal(rows.column("job"), job_id), False)
        mine = pc.and_not(pc.is_in(key, pa.array(sorted(whole), type=pa.string())), other_job)
    elif family == IB_TX:
        key = pc.binary_join_element_wise(rows.column("host"), pc.fill_null(as_text(rows.column("labels")), ""), "\x00")
        mine = pc.is_in(rows.column("host"), pa.array(list(report.nodes) if report else [], type=pa.string()))
    else:
        key = as_text(rows.column("labels"))
        mine = pc.equal(rows.column("job"), job_id)
    keep = pc.fill_null(mine, False)
    return rows.filter(keep), key.filter(keep)


def _gpu_key(rows: pa.Table) -> pa.ChunkedArray:
    return pc.binary_join_element_wise(rows.column("host"), rows.column("gpu"), "/")


def _interval(t: np.ndarray, codes: np.ndarray) -> float:
    """The scrape interval: the median gap between one series' samples (the first series'; all of a
    family are scraped alike). 0 with a single sample."""
    return _median_gap(np.sort(t[codes == codes[0]])) if len(t) else 0.0


def _median_gap(t: np.ndarray) -> float:
    gaps = np.diff(t)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else 0.0


def _bucket(t: np.ndarray, t0: float, bucket_s: float, n: int) -> np.ndarray:
    return np.clip(((t - t0) // bucket_s).astype(np.int64), 0, n - 1)


def _rates(t: np.ndarray, codes: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counters to rates: per series, (t of the later sample, series, delta / dt) of consecutive samples; a
    delta below zero (a reset: the counter restarted) is skipped, not read as traffic."""
    order = np.lexsort((t, codes))
    t, codes, v = t[order], codes[order], v[order]
    dt, dv = np.diff(t), np.diff(v)
    ok = (codes[1:] == codes[:-1]) & (dt > 0) & (dv >= 0)
    return t[1:][ok], codes[1:][ok], dv[ok] / dt[ok]


def _across(
    codes: np.ndarray, buckets: np.ndarray, values: np.ndarray, n: int, *, mean: bool = True
) -> tuple[float | None, ...]:
    """Each series' mean per bucket, then the mean (or the sum) over the series that reported in it; None
    for a bucket none reported in. (series × bucket) cells: 1,024 GPUs × 120 buckets, whatever the rows."""
    _, series = np.unique(codes, return_inverse=True)
    m = int(series.max()) + 1 if len(series) else 1
    cell = series.reshape(-1) * n + buckets
    count = np.bincount(cell, minlength=m * n).reshape(m, n)
    total = np.bincount(cell, weights=values, minlength=m * n).reshape(m, n)
    return _across_cells(count, total, mean=mean)


def _across_cells(count: np.ndarray, total: np.ndarray, *, mean: bool) -> tuple[float | None, ...]:
    """``_across`` of (series x bucket) counts and sums."""
    reported = count > 0
    per_series = np.where(reported, total / np.maximum(count, 1), 0.0)
    summed, reporting = per_series.sum(axis=0), reported.sum(axis=0)
    value = summed / np.maximum(reporting, 1) if mean else summed
    return tuple(float(x) if k else None for x, k in zip(value.tolist(), reporting.tolist()))


def series_dict(found: JobSeries | None) -> dict[str, object] | None:
    """The ``series`` of ``GET /api/job/ID``: the window, the grid (``t``: each bucket's start, UTC s) and
    per series its ``key``, ``unit``, ``aggregation``, ``source`` and ``values`` (null: nothing reported)."""
    if found is None:
        return None
    return {
        "t0": found.t0,
        "t1": found.t1,
        "bucket_s": found.bucket_s,
        "clock": found.clock,
        "t": [found.bucket_start(i) for i in range(found.buckets)],
        "series": [
            {"key": s.key, "unit": s.unit, "aggregation": s.aggregation, "source": s.source, "values": list(s.values)}
            for s in found.series
        ],
    }
