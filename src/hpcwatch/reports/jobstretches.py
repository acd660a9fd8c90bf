"""A job's report read stretch by stretch of its life, and what is settled kept from one page to the next.

``hpcwatch job ID`` and the job page read a Slurm job's window (its nodes from its first start, and its label
anywhere: ``reports.jobs.job_samples``) a stretch at a time, each stretch reduced to an
``analysis.jobpartial.Partial`` and joined to those before it. Memory is one stretch's rows whatever the job's
age (a stretch is sized to hold about ``STRETCH_ROWS``): at 1,024 nodes a 1,536-GPU job adds 2,000 rows a
second, and a day of them read at once was more than a server holds (issue #27).

A server keeps (``KeptStretches``), per job, checkpoints: the stretches from the job's start up to some time,
joined. The job's next page starts from the newest checkpoint still true and reads only what follows it. A
page leaves a checkpoint ``SETTLE_S`` before the newest sample, and keeps older ones, one per age band
(``CHECKPOINT_LAGS``), so that rows that land late cost a read of what follows them, not of the job's life::

    t0 (first start)                                                      newest sample
    |  stretch  |  stretch  |  …  |  stretch  | stretch | stretch | stretch |
                          ^ 640 s      ^ 160 s       ^ 40 s        ^ 10 s       checkpoints, by age
                                                                  <--------->  the next page reads this

A checkpoint is not used when what it was computed from changed:

- a commit since the page added samples before its time (a late scrape, a file ingested again):
  ``store.queries.job_window_written`` gives the oldest such sample, from the parts committed since;
- a job on the job's nodes changed in a way that moves rows before it to another job (its start, an end
  before it, its GPUs), or the job's own first start or nodes changed (a requeue);
- the window gained a device (the engine-activity rule and the InfiniBand rails read the whole window's
  devices: ``analysis.jobpartial.Shape``): then every stretch is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from hpcwatch.analysis.attribution import REPORT_METRICS, partial_of
from hpcwatch.analysis.jobpartial import Partial, Shape
from hpcwatch.records import Job
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = [
    "STRETCH_ROWS",
    "STRETCH_S",
    "SETTLE_S",
    "CHECKPOINT_LAGS",
    "DEFAULT_KEPT_JOBS",
    "KeptStretches",
    "window_partial",
    "stretches",
]

#: Rows one read holds, about: the stretches are sized to it by the rate the job's window had so far. Ours: ~40 MB
#: read and ~0.1 s of reduction; at 1,024 nodes a 1,536-GPU job's minute (the twin's 1 s scrape), a 16-GPU
#: job's 20 minutes.
STRETCH_ROWS: Final = 150_000
#: The first stretch's length, and the shortest one that is not cut at a checkpoint.
STRETCH_S: Final = 60.0
#: A page leaves its newest checkpoint this long before the window's newest sample: a node scraped late still
#: lands its rows after it. Ours: ten 1 s scrapes; a cluster that ingests later falls back one age band.
SETTLE_S: Final = 10.0
#: The age bands of the checkpoints a job keeps (the newest checkpoint at least as old as each). Ours: a factor
#: of 4, so rows that land ``x`` late cost a read of at most ~4x of the window, with 7 checkpoints at most.
CHECKPOINT_LAGS: Final = (SETTLE_S, 40.0, 160.0, 640.0, 2_560.0, 10_240.0, 40_960.0)
#: Jobs whose checkpoints a ``KeptStretches`` holds (each checkpoint a few MB at 1,536 GPUs).
DEFAULT_KEPT_JOBS: Final = 4


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    upto: float
    """The stretches before this time, joined."""
    allocations: tuple[Any, ...]
    """``_allocations`` when they were read."""
    partial: Partial


@dataclass(frozen=True, slots=True)
class _Kept:
    """A job's checkpoints, oldest first, and what they were computed from."""

    t0: float
    hosts: tuple[str, ...]
    version: int
    """The store's version before the page read: a commit after it may have added rows before a checkpoint."""
    shape: Shape
    checkpoints: tuple[_Checkpoint, ...]


class KeptStretches:
    """The checkpoints of the last ``size`` jobs whose report was read (module doc). Safe to share between
    threads; two reads of one job at once both read, and the later one is kept."""

    def __init__(self, size: int = DEFAULT_KEPT_JOBS) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, key: tuple[str, str]) -> _Kept | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def _put(self, key: tuple[str, str], kept: _Kept) -> None:
        with self._lock:
            self._entries[key] = kept
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


def window_partial(
    store: Store, record: Job, t0: float, jobs: Sequence[Job], *, kept: KeptStretches | None = None
) -> Partial:
    """What ``record``'s window (its nodes from ``t0``, its label anywhere) says of every job among ``jobs``
    (those that ran on its nodes), read stretch by stretch; with ``kept``, from its newest checkpoint on."""
    window = _Window(store, record, tuple(record.nodes), t0, jobs)
    key = (str(store.config.path), record.id)
    version = store.version  # before any read: a row committed during the reads is checked next time
    before = kept._get(key) if kept is not None else None
    start = window.checkpoint(before)
    total, checkpoints = window.read(start, before.shape if before is not None and start is not None else None)
    shapes = total.shapes
    if len(shapes) > 1:  # a device that a stretch before it lacked: every stretch again, with all of them
        total, checkpoints = window.read(None, _union(shapes))
    if kept is not None:
        shape = next(iter(total.shapes), Shape(frozenset(), frozenset()))
        older = () if start is None or before is None else tuple(c for c in before.checkpoints if c.upto <= start.upto)
        newest = total.newest_t
        kept._put(key, _Kept(window.t0, window.hosts, version, shape, _by_age((*older, *checkpoints), newest)))
    return total


@dataclass(frozen=True, slots=True)
class _Window:
    """A job's window in the store, and the jobs its rows are attributed among."""

    store: Store
    record: Job
    hosts: tuple[str, ...]
    t0: float
    jobs: Sequence[Job]

    def checkpoint(self, kept: _Kept | None) -> _Checkpoint | None:
        """The newest of ``kept``'s checkpoints still true (module doc); None: read from the start."""
        if kept is None or kept.t0 != self.t0 or kept.hosts != self.hosts or not kept.checkpoints:
            return None
        late = queries.job_window_written(
            self.store, kept.version, REPORT_METRICS, hosts=list(self.hosts), job=self.record.id, t0=self.t0
        )
        for c in reversed(kept.checkpoints):
            if (late is None or c.upto <= late) and c.allocations == _allocations(self.jobs, self.t0, c.upto):
                return c
        return None

    def read(self, start: _Checkpoint | None, shape: Shape | None) -> tuple[Partial, list[_Checkpoint]]:
        """The stretches from ``start`` (None: the first start) to the newest sample, joined to ``start``'s; and
        a checkpoint at each age band's time that the read passed."""
        total = start.partial.copy() if start is not None else Partial()
        a = start.upto if start is not None else self.t0
        span = queries.job_window_span(
            self.store, REPORT_METRICS, hosts=list(self.hosts), job=self.record.id, t0=a, t1=self.record.end
        )
        checkpoints: list[_Checkpoint] = []
        if span is None:
            return total, checkpoints
        cuts = sorted({span[1] - lag for lag in CHECKPOINT_LAGS if span[1] - lag > max(a, span[0])})
        for b, table in stretches(self.store, REPORT_METRICS, self.record, max(a, span[0]), span[1], cuts=cuts):
            part = partial_of(table, self.jobs, shape=shape)
            del table
            shape = _union(part.shapes | ({shape} if shape is not None else set()))  # the devices seen so far
            total.add(part)
            if b in cuts:
                checkpoints.append(_Checkpoint(b, _allocations(self.jobs, self.t0, b), total.copy()))
        return total, checkpoints


def stretches(
    store: Store,
    metrics: Sequence[str],
    record: Job,
    start: float,
    newest: float,
    *,
    cuts: Sequence[float] = (),
) -> Iterator[tuple[float | None, pa.Table]]:
    """(end, None for the last; rows of ``metrics``) of each stretch of ``record``'s window from ``start`` to
    ``newest`` (``store.queries.job_window_samples``). A stretch is sized to hold about ``STRETCH_ROWS`` at the
    rate the one before held (``STRETCH_S`` at first, never more than 8 times longer than the one before) and
    ends at the next of ``cuts``; a silence of the nodes is skipped."""
    hosts = list(record.nodes)
    at: float | None = start
    length = STRETCH_S
    while at is not None and at <= newest:
        a = at
        b = min([a + length, *(c for c in cuts if c > a)])
        last = b > newest
        table = queries.job_window_samples(
            store, metrics, hosts=hosts, job=record.id, t0=a, t1=record.end, before=None if last else b
        )
        rows = table.num_rows
        yield None if last else b, table
        del table  # before the next stretch is read: one stretch's rows at a time
        if last:
            return
        if rows:
            length = max(STRETCH_S, min(STRETCH_ROWS * (b - a) / rows, 8 * length))
            at = b
        else:
            at = queries.job_window_next(store, metrics, hosts=hosts, job=record.id, t0=b, t1=record.end)


def _union(shapes: set[Shape]) -> Shape:
    found = Shape(frozenset(), frozenset())
    for shape in shapes:
        found = found.union(shape)
    return found


def _by_age(checkpoints: Sequence[_Checkpoint], newest: float | None) -> tuple[_Checkpoint, ...]:
    """Per age band (``CHECKPOINT_LAGS``), the newest checkpoint at least that old; oldest first."""
    if newest is None:
        return ()
    ordered = sorted(checkpoints, key=lambda c: c.upto)
    keep: dict[float, _Checkpoint] = {}
    for lag in CHECKPOINT_LAGS:
        old_enough = [c for c in ordered if c.upto <= newest - lag + 1e-9]
        if old_enough:
            keep[old_enough[-1].upto] = old_enough[-1]
    return tuple(keep[t] for t in sorted(keep))


def _allocations(jobs: Sequence[Job], t0: float, upto: float) -> tuple[Any, ...]:
    """What of ``jobs`` attributes rows between ``t0`` and ``upto`` (``analysis.attribution``: the job holding a
    GPU at t, a later job over an earlier one): each one that ran then, in order, with its GPUs."""
    return tuple(
        (j.id, j.start, j.end if j.end is not None and j.end < upto else None, sorted(j.gpus_by_node.items()))
        for j in jobs
        if j.start is not None and j.start < upto and (j.end is None or j.end > t0)
    )
