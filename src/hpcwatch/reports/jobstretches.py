"""A job's report read stretch by stretch of its life, and what is settled kept from one page to the next.

``hpcwatch job ID`` and the job page read a Slurm job's window (its nodes from its first start, and its label
anywhere: ``reports.jobs.job_samples``) a stretch at a time, each stretch reduced to an
``analysis.jobpartial.Partial`` and joined to those before it. Memory is one stretch's rows whatever the job's
age (a stretch is sized to hold about ``STRETCH_ROWS``): at 1,024 nodes a 1,536-GPU job adds 2,000 rows a
second, and a day of them read at once was more than a server holds (issue #27). ``hpcwatch jobs`` and the
exporter read the whole store the same way (``reports.storestretches``).

A server keeps (``KeptStretches``), per job, checkpoints: the stretches from the job's start up to some time,
joined (the report's ``Partial``, the charts' cells; ``kept_fold`` keeps the job's steps grouped from its spans
and its XID onsets the same way). The job's next page starts from the newest checkpoint still true and reads
only what follows it. A page leaves a checkpoint at the end of its read (every row before it was read), one
``SETTLE_S`` before the newest sample, and keeps older ones, the oldest of each age band (``CHECKPOINT_LAGS``),
so that rows that land late cost a read of what follows them, not of the job's life::

    t0 (first start)                                                      newest sample
    |  stretch  |  stretch  |  …  |  stretch  | stretch | stretch | stretch |
                          ^ 640 s      ^ 160 s       ^ 40 s        ^ 10 s   ^ the last page's end: checkpoints
                                                                           <-> the next page reads this

When rows land in time order (the twin; a collector that writes each scrape as it comes), a page seconds after
the last reads those seconds: at 1,024 nodes, 2 s of a 1,536-GPU job are 5,000 rows where its settle time was
37,000. A row that lands before the last page's end (a node scraped late) makes the next page read from the
settled checkpoint, as if there were no end checkpoint; the end checkpoints age into the bands as pages come.

A page's report and charts keep their checkpoints on the same pages, so both read on from about the same time:
the report's one read of what follows its checkpoint is held for the page (``PageReads``), and the charts, whose
metrics are among the report's, draw from those rows; they then keep the version from before that read, as if
they had read it themselves.

A checkpoint is not used when what it was computed from changed:

- a commit since the page added samples before its time (a late scrape, a file ingested again):
  ``store.queries.job_window_written`` gives the oldest such sample, from the parts committed since;
- a job on the job's nodes changed in a way that moves rows before it to another job (its start, an end
  before it, its GPUs), or the job's own first start or nodes changed (a requeue);
- the window gained a device (the engine-activity rule and the InfiniBand rails read the whole window's
  devices: ``analysis.jobpartial.Shape``): then every stretch is read again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.analysis.attribution import LEAD_IN_METRICS, REPORT_METRICS, partial_of
from hpcwatch.analysis.jobpartial import Partial, Shape
from hpcwatch.errors import one_line
from hpcwatch.records import Job
from hpcwatch.reports.checkpointfiles import SAVE_EVERY_S, CheckpointFiles, OnDisk, Saved
from hpcwatch.reports.text import visible
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = [
    "STRETCH_ROWS",
    "STRETCH_S",
    "SETTLE_S",
    "CHECKPOINT_LAGS",
    "REPORT_ON_DISK",
    "DEFAULT_KEPT_JOBS",
    "KeptStretches",
    "window_partial",
    "window_written",
    "kept_fold",
    "timed_stretches",
    "shapes_union",
    "by_age",
    "due_to_save",
    "stretches",
    "checkpoint_cuts",
    "read_end",
    "with_lead_in",
    "Checkpoint",
    "Resumed",
    "WindowRead",
    "PageReads",
    "SharedRows",
    "read_window",
    "read_short_window",
]

_S = TypeVar("_S")

log = logging.getLogger(__name__)

#: Rows one read holds, about: the stretches are sized to it by the rate the job's window had so far. Ours: ~40 MB
#: read and ~0.1 s of reduction; at 1,024 nodes a 1,536-GPU job's minute (the twin's 1 s scrape), a 16-GPU
#: job's 20 minutes.
STRETCH_ROWS: Final = 150_000
#: The first stretch's length, and the shortest one that is not cut at a checkpoint.
STRETCH_S: Final = 60.0
#: A page leaves its newest checkpoint this long before the window's newest sample: a node scraped late still
#: lands its rows after it. Ours: ten 1 s scrapes; a cluster that ingests later falls back one age band.
SETTLE_S: Final = 10.0
#: The age bands of the checkpoints a job keeps (the oldest checkpoint in each, and the newest settled one). Ours:
#: a factor of 4, so rows that land ``x`` late cost a read of at most ~4x of the window, with 10 checkpoints at most.
CHECKPOINT_LAGS: Final = (SETTLE_S, 40.0, 160.0, 640.0, 2_560.0, 10_240.0, 40_960.0)
#: The age bands a ``kept_fold`` keeps (five checkpoints at most: the newest, the newest settled, the oldest younger
#: than ``SETTLE_S`` and one a band): its state grows with the job's steps (a day of a step a second: ~9 MB a
#: checkpoint), and a row that lands later than its bands only costs one regrouping of the window in the store. Ours.
FOLD_LAGS: Final = CHECKPOINT_LAGS[:2]
#: Jobs whose checkpoints a ``KeptStretches`` holds (each checkpoint a few MB at 1,536 GPUs).
DEFAULT_KEPT_JOBS: Final = 4


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a job's stretches before ``upto`` added up to (``state``: a ``Partial``, the charts' cells)."""

    upto: float
    fingerprint: Any
    """What else the state was computed from (the report: ``_allocations``); compared, never read."""
    state: Any


@dataclass(frozen=True, slots=True)
class Resumed:
    """Where a read resumes (``KeptStretches.resume``)."""

    checkpoint: Checkpoint
    extra: Any
    """What was kept beside the checkpoints."""
    older: tuple[Checkpoint, ...]
    """The checkpoints up to ``checkpoint``, which it keeps: a page keeps them with its own."""


@dataclass(frozen=True, slots=True)
class _Kept:
    """A job's checkpoints of one kind, oldest first, and what they were computed from."""

    t0: float
    hosts: tuple[str, ...]
    version: int
    """The store's version before the page read: a commit after it may have added rows before a checkpoint."""
    extra: Any
    """What a kind keeps beside (the report: the window's ``Shape``)."""
    checkpoints: tuple[Checkpoint, ...]


class KeptStretches:
    """The checkpoints of the last ``size`` jobs whose report and charts were read (module doc), and of the jobs
    pinned (``pin``) whatever was read after them. Safe to share between threads; two reads of one job at once
    both read, and the later one is kept."""

    def __init__(self, size: int = DEFAULT_KEPT_JOBS, *, on_disk: bool = False, writes: bool = True) -> None:
        self.size = size
        self.on_disk, self.writes = on_disk, writes
        """``on_disk``: a job with nothing in memory resumes from the checkpoint of each kind read with an
        ``OnDisk`` in the store's folder (``reports.checkpointfiles``); ``writes``: and each such kind's newest
        settled checkpoint is written there (a server's job pages; not ``hpcwatch job``, which only reads)."""
        self._entries: OrderedDict[tuple[str, str, str], _Kept] = OrderedDict()
        self._pinned: frozenset[tuple[str, str]] = frozenset()
        self._lock = threading.Lock()
        self._files: dict[str, CheckpointFiles | None] = {}
        self._saved_upto: dict[tuple[str, str, str], float] = {}
        """Per entry, the time of the checkpoint its file holds (written or read by this process)."""
        self._looked_on_disk: set[tuple[str, str, str]] = set()
        """The entries whose file this process read (or found none of) since it last wrote one: a file that
        failed a check is not read again for each page; one this process wrote is, once its entry was evicted."""

    def pin(self, store: Store, jobs: Iterable[str]) -> None:
        """Keep ``jobs``' checkpoints in ``store`` however many other jobs are read after them (``size`` counts
        the others); the jobs pinned before become the others' (the least recently read go first)."""
        with self._lock:
            self._pinned = frozenset((str(store.config.path), job) for job in jobs)
            self._evict()

    def pinned(self, store: Store) -> frozenset[str]:
        """The jobs of ``store`` that ``pin`` keeps."""
        path = str(store.config.path)
        with self._lock:
            return frozenset(job for where, job in self._pinned if where == path)

    def resume(
        self,
        store: Store,
        kind: str,
        record: Job,
        t0: float,
        *,
        written: Callable[[int, float], float | None],
        fingerprint: Callable[[float], Any],
        on_disk: OnDisk | None = None,
    ) -> Resumed | None:
        """The newest checkpoint of ``kind`` for ``record``'s window from ``t0`` that is still true (module doc);
        None: read from the start. ``on_disk``: with none in memory, the one in the store's folder (once a
        process: ``reports.checkpointfiles``). ``written(version, before)``: the oldest time before ``before`` of a row of the
        window committed after ``version`` (``window_written`` for samples); ``before`` is the newest checkpoint's
        time: a row at or after it leaves every checkpoint true, and the parts committed since hold little else
        (their rows land in time order), so the store reads only the row groups of rows before it."""
        found = self._found(store, kind, record, on_disk)
        if found is None or found.t0 != t0 or found.hosts != tuple(record.nodes) or not found.checkpoints:
            return None
        late = written(found.version, found.checkpoints[-1].upto)
        for k in reversed(range(len(found.checkpoints))):
            c = found.checkpoints[k]
            if (late is None or c.upto <= late) and c.fingerprint == fingerprint(c.upto):
                return Resumed(c, found.extra, found.checkpoints[: k + 1])
        return None

    def recall(self, store: Store, kind: str, record: Job, t0: float) -> tuple[int, Any] | None:
        """(the store's version it was computed at, the state) that ``remember`` kept of ``kind`` for
        ``record``'s window from ``t0``; None when none was (or for another first start or other nodes). What
        landed since that version is the caller's to read."""
        with self._lock:
            found = self._entries.get((str(store.config.path), kind, record.id))
        if found is None or found.t0 != t0 or found.hosts != tuple(record.nodes):
            return None
        return found.version, found.extra

    def remember(self, store: Store, kind: str, record: Job, *, t0: float, version: int, state: Any) -> None:
        """Keep ``state``, computed from ``record``'s window from ``t0`` as the store was at ``version``, for
        ``recall``."""
        self._put(store, kind, record, _Kept(t0, tuple(record.nodes), version, state, ()))

    def holds(self, store: Store, kind: str, record: Job, t0: float, on_disk: OnDisk | None = None) -> bool:
        """Whether a checkpoint of ``kind`` is kept for ``record``'s window from ``t0`` (true or not: the
        window was longer than a checkpoint, so a page need not ask whether it fits one read); ``on_disk`` as
        ``resume``'s."""
        found = self._found(store, kind, record, on_disk)
        return found is not None and found.t0 == t0 and found.hosts == tuple(record.nodes) and bool(found.checkpoints)

    def keep(
        self,
        store: Store,
        kind: str,
        record: Job,
        *,
        t0: float,
        version: int,
        extra: Any,
        resumed: Resumed | None,
        checkpoints: Sequence[Checkpoint],
        newest: float | None,
        lags: Sequence[float] = CHECKPOINT_LAGS,
        on_disk: OnDisk | None = None,
    ) -> None:
        """Keep, of ``checkpoints`` and of those the read ``resumed`` from, the newest, the newest settled one and
        the oldest of each age band (``lags``: ``by_age``); ``on_disk``: the newest settled one also in the
        store's folder, ``SAVE_EVERY_S`` of the job's time after the last one written."""
        older = resumed.older if resumed is not None else ()
        kept = _Kept(t0, tuple(record.nodes), version, extra, by_age([*older, *checkpoints], newest, lags))
        self._put(store, kind, record, kept)
        if on_disk is not None and newest is not None:
            self._save(store, kind, record, kept, newest - SETTLE_S, on_disk)

    def _found(self, store: Store, kind: str, record: Job, on_disk: OnDisk | None) -> _Kept | None:
        """What is kept of ``kind`` for ``record`` in memory, else (``on_disk``, the first time this process
        asks) in the store's folder."""
        key = (str(store.config.path), kind, record.id)
        with self._lock:
            found = self._entries.get(key)
            if found is not None or on_disk is None or not self.on_disk or key in self._looked_on_disk:
                return found
            self._looked_on_disk.add(key)
        files = self._files_of(store)
        if files is None:
            return None
        saved = files.load(kind, record.id)
        if saved is None or saved.hosts != tuple(record.nodes) or saved.version > store.version:
            return None  # another allocation's (a requeue), or a store made again since at the same path
        try:
            checkpoint = Checkpoint(saved.upto, saved.fingerprint, on_disk.state_from_plain(saved.state))
            extra = on_disk.extra_from_plain(saved.extra)
        except (ValueError, KeyError, TypeError) as err:
            log.warning("%s: skipped: %s", visible(files.path(kind, record.id)), visible(one_line(str(err))))
            return None
        with self._lock:
            self._saved_upto[key] = saved.upto
            found = self._entries.get(key)  # a page's, kept meanwhile, is newer
        if found is None:
            found = _Kept(saved.t0, saved.hosts, saved.version, extra, (checkpoint,))
            self._put(store, kind, record, found)
        return found

    def _files_of(self, store: Store) -> CheckpointFiles | None:
        path = str(store.config.path)
        with self._lock:
            if path not in self._files:
                self._files[path] = CheckpointFiles.of(store)
            return self._files[path]

    def _save(self, store: Store, kind: str, record: Job, kept: _Kept, settled: float, on_disk: OnDisk) -> None:
        """Write ``kept``'s newest checkpoint before ``settled`` when it is ``SAVE_EVERY_S`` past the one
        written last (or before it: a row landed late and the read went back)."""
        if not (self.on_disk and self.writes):
            return
        files = self._files_of(store)
        if files is None:
            return
        key = (str(store.config.path), kind, record.id)
        with self._lock:
            c = due_to_save(kept.checkpoints, settled, self._saved_upto.get(key))
            if c is None:
                return
            self._saved_upto[key] = c.upto
        try:
            extra, state = on_disk.extra_to_plain(kept.extra), on_disk.state_to_plain(c.state)
            saved = Saved(record.id, kind, kept.t0, kept.hosts, kept.version, extra, c.upto, c.fingerprint, state)
            written = files.save(saved)
        except Exception as err:  # a bug in a plain form: the page still answers (the file is only a cache)
            log.error("job %s's %s checkpoint not written: %s", visible(record.id), kind, visible(one_line(repr(err))))
            return
        if written:
            with self._lock:
                self._looked_on_disk.discard(key)

    def _put(self, store: Store, kind: str, record: Job, kept: _Kept) -> None:
        key = (str(store.config.path), kind, record.id)
        with self._lock:
            self._entries[key] = kept
            self._entries.move_to_end(key)
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently kept entries of the jobs not pinned past ``size`` jobs (five kinds a job:
        report, charts, steps, XID onsets, recent)."""
        others = [key for key in self._entries if (key[0], key[2]) not in self._pinned]
        for key in others[: max(0, len(others) - 5 * self.size)]:
            del self._entries[key]


@dataclass(frozen=True, slots=True)
class WindowRead:
    """A job's whole window read at once (``read_window``): a window of one stretch, read for the report and
    the charts together."""

    version: int
    """The store's version before the read (a row committed during it is checked on the next page)."""
    table: pa.Table
    record: Job
    """The job whose window it is, as the store held it when read."""
    t0: float
    """Where the window starts (the job's first start)."""


@dataclass(frozen=True, slots=True)
class SharedRows:
    """The rows of a job's window from ``start`` on (to the window's end) that one query of a page read."""

    version: int
    """The store's version before the query: a row committed after it is not among ``table``'s."""
    record: Job
    start: float
    metrics: frozenset[str]
    table: pa.Table

    def cut(self, cuts: Sequence[float]) -> Iterator[tuple[float | None, pa.Table]]:
        """``stretches``' pieces of these rows: those before each of ``cuts``, then the rest."""
        return _cut(self.table, cuts)


class PageReads:
    """What one page read of a job's window in one query, for its other parts to read again without a query:
    the report reads what follows its checkpoint (``REPORT_METRICS``), and the charts (``SERIES_METRICS``,
    among them) read on from theirs, most often the same time (both keep one at the end of each page). At
    1,024 nodes, 10 s of a 1,536-GPU job's window are 25,000 rows and 40-50 ms of query. Made for one page
    (``reports.jobpage.job_overview``) and dropped with it: it holds one read (``stretches``' read of what
    follows a checkpoint, ``STRETCH_S`` at most), never the window."""

    def __init__(self) -> None:
        self.held: SharedRows | None = None

    def hold(self, rows: SharedRows) -> None:
        """Hold ``rows`` unless a read is held already: the page's first, the report's (it reads first)."""
        if self.held is None:
            self.held = rows

    def rows_from(self, metrics: Sequence[str], record: Job, start: float, end: float | None) -> SharedRows | None:
        """The held rows of ``record``'s window (its id and nodes) from ``start`` to ``end`` (None: no end), when
        the held read holds all of them: it started no later, read every metric of ``metrics`` and had no end
        before ``end``. Its rows of other metrics stay (the readers select theirs)."""
        held = self.held
        if (
            held is None
            or held.record.id != record.id
            or tuple(held.record.nodes) != tuple(record.nodes)
            or held.start > start
            or not held.metrics.issuperset(metrics)
            or (held.record.end is not None and (end is None or held.record.end < end))
        ):
            return None
        t = held.table.column("t")
        keep = pc.greater_equal(t, start)
        if end is not None:
            keep = pc.and_(keep, pc.less_equal(t, end))
        return SharedRows(held.version, record, start, held.metrics, held.table.filter(keep))


def read_window(store: Store, record: Job, t0: float, metrics: Sequence[str] = REPORT_METRICS) -> WindowRead:
    """``record``'s window from ``t0`` (``store.queries.job_window_samples``), all of it."""
    version = store.version
    hosts = list(record.nodes)
    table = queries.job_window_samples(store, list(metrics), hosts=hosts, job=record.id, t0=t0, t1=record.end)
    return WindowRead(version, table, record, t0)


def read_short_window(
    store: Store, record: Job, t0: float, metrics: Sequence[str] = REPORT_METRICS
) -> WindowRead | None:
    """``record``'s window from ``t0``, all of it, when it holds at most ``STRETCH_ROWS`` rows (None: read it by
    stretches), in one scan of the store (``store.queries.job_window_samples_within``)."""
    version = store.version
    hosts = list(record.nodes)
    table = queries.job_window_samples_within(
        store, list(metrics), STRETCH_ROWS, hosts=hosts, job=record.id, t0=t0, t1=record.end
    )
    return None if table is None else WindowRead(version, table, record, t0)


def window_partial(
    store: Store,
    record: Job,
    t0: float,
    jobs: Sequence[Job],
    *,
    kept: KeptStretches | None = None,
    window: WindowRead | None = None,
    reads: PageReads | None = None,
) -> Partial:
    """What ``record``'s window (its nodes from ``t0``, its label anywhere) says of every job among ``jobs``
    (those that ran on its nodes), read stretch by stretch; with ``kept``, from its newest checkpoint on.
    ``window``: the whole window, read already (``read_window``): one stretch, whose end is the checkpoint
    the next page resumes from. ``reads``: where a read of what follows the checkpoint is held for the page's
    charts."""
    version = store.version if window is None else window.version

    def allocations(upto: float) -> tuple[Any, ...]:
        return _allocations(jobs, t0, upto)

    keeping = kept is not None
    if window is not None:
        resumed = None
        total = partial_of(with_lead_in(store, window.table, REPORT_METRICS, t0=t0, hosts=record.nodes), jobs)
        checkpoints = [_end_checkpoint(total, jobs, t0)] if keeping and total.newest_t is not None else []
    else:
        written = window_written(store, record, t0, REPORT_METRICS)
        resumed = (
            kept.resume(store, "report", record, t0, written=written, fingerprint=allocations, on_disk=REPORT_ON_DISK)
            if kept
            else None
        )
        start, shape = (resumed.checkpoint, resumed.extra) if resumed is not None else (None, None)
        total, checkpoints = _read(store, record, t0, jobs, start, shape, keeping=keeping, reads=reads)
        if len(total.shapes) > 1:  # a device a stretch before it lacked: every stretch again, with all of them
            resumed = None
            total, checkpoints = _read(store, record, t0, jobs, None, shapes_union(total.shapes), keeping=keeping)
    if kept is not None:
        kept.keep(
            store,
            "report",
            record,
            t0=t0,
            version=version,
            extra=shapes_union(total.shapes),
            resumed=resumed,
            checkpoints=checkpoints,
            newest=total.newest_t,
            on_disk=REPORT_ON_DISK,
        )
    return total


def kept_fold(
    store: Store,
    kept: KeptStretches,
    kind: str,
    record: Job,
    t0: float,
    *,
    written: Callable[[int, float], float | None],
    fingerprint: Any,
    newest: Callable[[float | None], float | None],
    read: Callable[[float | None, float | None, float | None], tuple[_S, _S]],
    join: Callable[[_S, _S], _S],
) -> _S:
    """A state folded from what a job's window held, resumed from ``kept``'s newest checkpoint of ``kind`` still
    true (``written``: the oldest time of a row landed since a version, before a time; ``fingerprint``: what
    else the state was computed from), with checkpoints left ``SETTLE_S`` before the window's ``newest(since)`` time and at
    the end of the read. ``read(since, cut, until)``: the state of the rows from ``since`` (None: from the
    start) before ``cut``, and the state of those from ``cut`` (None: no cut, all after) before ``until``
    (None: no end); ``join(earlier, later)`` a new state of both, neither changed (a checkpoint is joined to
    many pages). One read a page, of what follows the checkpoint: for states bounded by the window's devices or
    steps, not its rows (the job's steps, its XID onsets)."""
    version = store.version  # before any read: a row committed during it is checked next time
    resumed = kept.resume(store, kind, record, t0, written=written, fingerprint=lambda upto: fingerprint)
    since = resumed.checkpoint.upto if resumed is not None else None
    last = newest(since)
    cuts = [] if last is None else checkpoint_cuts(t0 if since is None else since, last, resumed=False)
    cut = cuts[-1] if cuts else None
    end = None if last is None else read_end(last)  # rows landing at or after it meanwhile: the next page's
    before, after = read(since, cut, end)
    settled = join(resumed.checkpoint.state, before) if resumed is not None else before
    whole = join(settled, after)
    checkpoints = [] if cut is None else [Checkpoint(cut, fingerprint, settled)]
    kept.keep(
        store,
        kind,
        record,
        t0=t0,
        version=version,
        extra=None,
        resumed=resumed,
        checkpoints=checkpoints if end is None else [*checkpoints, Checkpoint(end, fingerprint, whole)],
        newest=last if last is not None else since,  # nothing since the checkpoint: the checkpoints stay
        lags=FOLD_LAGS,
    )
    return whole


def window_written(
    store: Store, record: Job, t0: float, metrics: Sequence[str]
) -> Callable[[int, float], float | None]:
    """``KeptStretches.resume``'s ``written`` for the samples of ``metrics`` in ``record``'s window from ``t0``."""

    def oldest_since(version: int, before: float) -> float | None:
        hosts = list(record.nodes)
        return queries.job_window_written(store, version, metrics, hosts=hosts, job=record.id, t0=t0, before=before)

    return oldest_since


def _read(
    store: Store,
    record: Job,
    t0: float,
    jobs: Sequence[Job],
    start: Checkpoint | None,
    shape: Shape | None,
    *,
    keeping: bool,
    reads: PageReads | None = None,
) -> tuple[Partial, list[Checkpoint]]:
    """The stretches from ``start`` (None: the first start) to the newest sample, joined to ``start``'s; and
    (``keeping``) a checkpoint at each age band's time that the read passed. ``reads``: where what follows
    ``start`` is held, when one query reads it."""
    total = start.state.copy() if start is not None else Partial()
    a = start.upto if start is not None else t0
    # What follows a checkpoint reads up to the store's newest sample of the report's metrics: a cheaper ask than
    # the window's span, and the one a running job's report ends at (``reports.jobs``), read once for both.
    if start is not None:
        newest = queries.latest_sample_t(store, since=a, metrics=REPORT_METRICS)
        span = None if newest is None else (a, newest)
    else:
        span = queries.job_window_span(
            store, REPORT_METRICS, hosts=list(record.nodes), job=record.id, t0=a, t1=record.end
        )
    checkpoints: list[Checkpoint] = []
    if span is None:
        return total, checkpoints
    cuts = checkpoint_cuts(max(a, span[0]), span[1], resumed=start is not None) if keeping else []
    from_start = start is None
    for b, table in stretches(store, REPORT_METRICS, record, max(a, span[0]), span[1], cuts=cuts, reads=reads):
        if from_start:  # the window's first stretch: with each series' sample before it
            table, from_start = with_lead_in(store, table, REPORT_METRICS, t0=t0, hosts=record.nodes), False
        part = partial_of(table, jobs, shape=shape)
        del table
        shape = shapes_union(part.shapes | ({shape} if shape is not None else set()))  # the devices seen so far
        total.add(part)
        if b in cuts:
            checkpoints.append(Checkpoint(b, _allocations(jobs, t0, b), total.copy()))
    if keeping and total.newest_t is not None:
        checkpoints.append(_end_checkpoint(total, jobs, t0))
    return total, checkpoints


def _end_checkpoint(total: Partial, jobs: Sequence[Job], t0: float) -> Checkpoint:
    """The checkpoint at the end of a read that reached the window's newest row (the last stretch has no upper
    bound): every row before it was read, so the next page reads only what follows it, unless a row landed
    before it since. Not a copy: from here the page only reads ``total``, and a page that resumes from a
    checkpoint copies it before adding to it."""
    assert total.newest_t is not None
    end = read_end(total.newest_t)
    return Checkpoint(end, _allocations(jobs, t0, end), total)


def with_lead_in(
    store: Store, table: pa.Table, metrics: Sequence[str], *, t0: float, hosts: Sequence[str] | None
) -> pa.Table:
    """``table``, the first read of ``metrics`` from ``t0`` (a job's first start; ``hosts``: its nodes, None:
    every host), with the last sample before ``t0`` of each of its series that counts a change at its first
    sample (those of ``LEAD_IN_METRICS``, ``store.queries.lead_in_samples``): a job's first energy delta and a
    stale XID value are what a read of every sample makes of them."""
    wanted = [m for m in LEAD_IN_METRICS if m in metrics]
    before = queries.lead_in_samples(store, wanted, t0=t0, hosts=hosts) if wanted else None
    if before is None or not before.num_rows:
        return table
    before = before.select(table.schema.names).cast(table.schema)
    return pa.concat_tables([before, table]).unify_dictionaries().combine_chunks()


def read_end(newest: float) -> float:
    """The checkpoint time of a read whose newest row is at ``newest``: every row before it was read, and a row
    that lands at ``newest`` itself later (a node scraped at the same instant, committed after) is late."""
    return math.nextafter(newest, math.inf)


def checkpoint_cuts(start: float, newest: float, *, resumed: bool) -> list[float]:
    """Where a read from ``start`` to ``newest`` ends a stretch to leave a checkpoint: one per age band when it
    ``resumed`` from a checkpoint, else only the newest band's (the older bands fill as the checkpoints of the
    next pages age: a first read is not cut into more stretches than its rows need). No cut leaves less than
    ``SETTLE_S`` before it: a page that comes a few seconds after the last one reads on from the same
    checkpoint in one stretch, and leaves a newer one once it has ``SETTLE_S`` to spare. Nor is a band cut
    that the checkpoint resumed from is in already: of a band the pages keep the oldest checkpoint
    (``by_age``), and that one is settled. So the first page 20-40 s after a round reads on in one stretch,
    not two (at 1,536 GPUs each stretch is a reduction per GPU, ~0.07 s, and a copy for its checkpoint)."""
    lags = CHECKPOINT_LAGS if resumed else CHECKPOINT_LAGS[:1]
    cuts = set()
    for lag, band_end in zip(lags, [*CHECKPOINT_LAGS[1:], math.inf]):
        cut = newest - lag
        in_band_already = resumed and start > newest - band_end
        if cut >= start + SETTLE_S and not in_band_already:
            cuts.add(cut)
    return sorted(cuts)


def stretches(
    store: Store,
    metrics: Sequence[str],
    record: Job,
    start: float,
    newest: float,
    *,
    cuts: Sequence[float] = (),
    reads: PageReads | None = None,
) -> Iterator[tuple[float | None, pa.Table]]:
    """(end, None for the last; rows of ``metrics``) of each stretch of ``record``'s window from ``start`` to
    ``newest`` (``store.queries.job_window_samples``). A stretch is sized to hold about ``STRETCH_ROWS`` at the
    rate the one before held (``STRETCH_S`` at first, never more than 8 times longer than the one before) and
    ends at the next of ``cuts``; a silence of the nodes is skipped. A window no longer than ``STRETCH_S`` (what
    follows a checkpoint, on a page seconds after the last) is one read, cut at ``cuts`` in memory, and held in
    ``reads`` for the page's other parts."""
    hosts = list(record.nodes)
    if start > newest:  # a checkpoint at the end of the last read, and the window did not grow since
        return
    if newest - start <= STRETCH_S:  # no longer than a first stretch: one read, cut where the checkpoints go
        version = store.version
        table = queries.job_window_samples(store, metrics, hosts=hosts, job=record.id, t0=start, t1=record.end)
        if reads is not None:
            reads.hold(SharedRows(version, record, start, frozenset(metrics), table))
        yield from _cut(table, cuts)
        return
    yield from timed_stretches(
        lambda a, before: queries.job_window_samples(
            store, metrics, hosts=hosts, job=record.id, t0=a, t1=record.end, before=before
        ),
        lambda b: queries.job_window_next(store, metrics, hosts=hosts, job=record.id, t0=b, t1=record.end),
        start,
        newest,
        shortest_s=STRETCH_S,
        rows_wanted=STRETCH_ROWS,
        cuts=cuts,
    )


def timed_stretches(
    read: Callable[[float, float | None], pa.Table],
    next_from: Callable[[float], float | None],
    start: float,
    newest: float,
    *,
    shortest_s: float,
    rows_wanted: int,
    cuts: Sequence[float] = (),
) -> Iterator[tuple[float | None, pa.Table]]:
    """(end, None for the last; rows) of each stretch of time from ``start`` to ``newest``, ``read(t0, before)``
    (``before`` None: the last, with no end). A stretch is sized to hold about ``rows_wanted`` at the rate the one
    before held (``shortest_s`` at first and at least, never more than 8 times longer than the one before) and
    ends at the next of ``cuts``; after an empty one the next starts at ``next_from(its end)`` (a silence is
    skipped)."""
    at: float | None = start
    length = shortest_s
    while at is not None and at <= newest:
        a = at
        b = min([a + length, *(c for c in cuts if c > a)])
        last = b > newest
        table = read(a, None if last else b)
        rows = table.num_rows
        yield None if last else b, table
        del table  # before the next stretch is read: one stretch's rows at a time
        if last:
            return
        if rows:
            length = max(shortest_s, min(rows_wanted * (b - a) / rows, 8 * length))
            at = b
        else:
            at = next_from(b)


def _cut(table: pa.Table, cuts: Sequence[float]) -> Iterator[tuple[float | None, pa.Table]]:
    """``stretches``' pieces of one read: the rows before each of ``cuts`` (in their order), then the rest."""
    t = table.column("t")
    lower: float | None = None
    for c in sorted(cuts):
        below = pc.less(t, c) if lower is None else pc.and_(pc.greater_equal(t, lower), pc.less(t, c))
        yield c, table.filter(below)
        lower = c
    yield None, table if lower is None else table.filter(pc.greater_equal(t, lower))


def shapes_union(shapes: set[Shape]) -> Shape:
    """Every device of ``shapes`` (the stretches' ``Partial.shapes``)."""
    found = Shape(frozenset(), frozenset())
    for shape in shapes:
        found = found.union(shape)
    return found


#: How the report's checkpoints go to disk (``reports.checkpointfiles``): the ``Partial`` and the window's ``Shape``.
REPORT_ON_DISK: Final = OnDisk(Partial.to_plain, Partial.from_plain, Shape.to_plain, Shape.from_plain)


def due_to_save(checkpoints: Sequence[Checkpoint], settled: float, last_saved: float | None) -> Checkpoint | None:
    """The newest of ``checkpoints`` at or before ``settled`` when it is to be written to disk: ``SAVE_EVERY_S``
    past the one written last (``last_saved``; None: none yet), or before it (a row landed late and the read
    went back); else None."""
    found = [c for c in checkpoints if c.upto <= settled]
    if not found:
        return None
    c = found[-1]
    if last_saved is not None and last_saved <= c.upto < last_saved + SAVE_EVERY_S:
        return None
    return c


def by_age(checkpoints: Sequence[Checkpoint], newest: float | None, lags: Sequence[float]) -> tuple[Checkpoint, ...]:
    """The newest checkpoint (where the next page resumes), the newest at least ``lags[0]`` old (where it
    resumes when a row landed late), and in each age band [0, ``lags[0]``), [``lags[i]``, ``lags[i + 1]``) (the
    last one open) the oldest: as it ages out of its band it is the next band's, so that a row landing ``x``
    late finds a checkpoint before it at most ~4x older, even when pages come every few seconds (the newest of a
    band would be replaced before it aged into the next). Oldest first."""
    if newest is None or not checkpoints:
        return ()
    ordered = sorted(checkpoints, key=lambda c: c.upto)
    settled = [c for c in ordered if c.upto <= newest - lags[0] + 1e-9]
    keep = {ordered[-1].upto: ordered[-1], **({settled[-1].upto: settled[-1]} if settled else {})}
    for lo, hi in zip([0.0, *lags], [*lags, math.inf]):
        band = [c for c in ordered if newest - hi < c.upto <= newest - lo + 1e-9]
        if band:
            keep[band[0].upto] = band[0]
    return tuple(keep[t] for t in sorted(keep))


def _allocations(jobs: Sequence[Job], t0: float, upto: float) -> tuple[Any, ...]:
    """What of ``jobs`` attributes rows between ``t0`` and ``upto`` (``analysis.attribution``: the job holding a
    GPU at t, a later job over an earlier one): each one that ran then, in order, with its GPUs."""
    return tuple(
        (j.id, j.start, j.end if j.end is not None and j.end < upto else None, sorted(j.gpus_by_node.items()))
        for j in jobs
        if j.start is not None and j.start < upto and (j.end is None or j.end > t0)
    )
