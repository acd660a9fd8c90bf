"""A job's report read stretch by stretch of its life, and what is settled kept from one page to the next.

``hpcwatch job ID`` and the job page read a Slurm job's window (its nodes from its first start, and its label
anywhere: ``reports.jobs.job_samples``) ``STRETCH_S`` of sample time at a time, each stretch reduced to an
``analysis.jobpartial.Partial`` and joined to those before it. Memory is one stretch's rows whatever the job's
age: at 1,024 nodes a 1,536-GPU job's minute is ~130,000 rows, and a day of them read at once was more than a
server holds (issue #27).

A server keeps (``KeptStretches``), per job, the stretches that ended ``SETTLE_S`` before the window's newest
sample, joined into one ``Partial``; the job's next page reads only the stretches after them::

    t0 (first start)                                   upto               newest sample
    |  s0  |  s1  |  s2  |   …   |  s(k-1)  |          |  sk  |  s(k+1)  |
    <----------- kept: one Partial ------------>       <- read by each page ->

What is kept is dropped, and every stretch read again, when what it was computed from changed:

- a commit since it was read added samples before ``upto`` (a late scrape, a file ingested again):
  ``store.queries.job_window_written`` reads only the parts committed since;
- a job on the job's nodes changed in a way that moves rows before ``upto`` to another job (its start, an
  end before ``upto``, its GPUs), or the job's own first start or nodes changed (a requeue);
- the window gained a device (the engine-activity rule and the InfiniBand rails read the whole window's
  devices: ``analysis.jobpartial.Shape``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from hpcwatch.analysis.attribution import GR_ACTIVE, IB_METRICS, REPORT_METRICS, UTIL, partial_of, shape_of
from hpcwatch.analysis.jobpartial import Partial, Shape
from hpcwatch.records import Job
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["STRETCH_ROWS", "STRETCH_S", "SETTLE_S", "DEFAULT_KEPT_JOBS", "KeptStretches", "window_partial"]

#: Rows one read holds, about: the stretches are sized to it by the rate the job's window had so far. Ours: ~40 MB
#: read and ~0.1 s of reduction; at 1,024 nodes a 1,536-GPU job's minute (the twin's 1 s scrape), a 16-GPU
#: job's 20 minutes.
STRETCH_ROWS: Final = 150_000
#: The shortest stretch, and the first one's length.
STRETCH_S: Final = 60.0
#: A stretch is kept once it ended this long before the window's newest sample: a node scraped late still lands
#: its rows there (which would make what is kept stale, and read again whole). Ours: one stretch.
SETTLE_S: Final = 60.0
#: The metrics whose devices make a window's ``Shape``.
_DEVICE_METRICS: Final = (UTIL, GR_ACTIVE, *IB_METRICS)
#: Jobs whose settled stretches a ``KeptStretches`` holds (each a few MB at 1,536 GPUs).
DEFAULT_KEPT_JOBS: Final = 8


@dataclass(frozen=True, slots=True)
class _Kept:
    """A job's stretches before ``upto``, joined, and what they were computed from."""

    t0: float
    hosts: tuple[str, ...]
    upto: float
    version: int
    """The store's version before they were read: a commit after it may have added rows to them."""
    allocations: tuple[Any, ...]
    shape: Shape
    partial: Partial


class KeptStretches:
    """The settled stretches of the last ``size`` jobs whose report was read (module doc). Safe to share
    between threads; two reads of one job at once both read, and the later one is kept."""

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

    def _put(self, key: tuple[str, str], kept: _Kept | None) -> None:
        with self._lock:
            if kept is None:
                self._entries.pop(key, None)
                return
            self._entries[key] = kept
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


def window_partial(
    store: Store, record: Job, t0: float, jobs: Sequence[Job], *, kept: KeptStretches | None = None
) -> Partial:
    """What ``record``'s window (its nodes from ``t0``, its label anywhere) says of every job among ``jobs``
    (those that ran on its nodes), read stretch by stretch; with ``kept``, from its settled stretches on."""
    hosts = tuple(record.nodes)
    key = (str(store.config.path), record.id)
    version = store.version  # before any read: a row committed during the reads is checked next time
    before = kept._get(key) if kept is not None else None
    if before is not None and not _still_true(store, before, record, t0, hosts, jobs):
        before = None
    start = before.upto if before is not None else t0
    window = _Window(store, record, hosts)
    shape, span = window.devices(start)
    if before is not None:
        if shape.union(before.shape) != before.shape:  # a new device: the kept stretches read the rails without it
            before, start = None, t0
            shape, span = window.devices(start)
        else:
            shape = before.shape
    prefix = Partial()  # the settled stretches: kept for the next page
    if before is not None:
        prefix.add(before.partial)
    upto, total = start, None
    for b, table in window.stretches(start, span):
        part = partial_of(table, jobs, shape=shape)
        del table
        if total is None and span is not None and b is not None and b <= span[1] - SETTLE_S:
            prefix.add(part)
            upto = b
        else:
            if total is None:
                total = prefix.copy()
            total.add(part)
    if kept is not None and upto > t0:
        kept._put(key, _Kept(t0, hosts, upto, version, _allocations(jobs, t0, upto), shape, prefix))
    return total if total is not None else prefix


@dataclass(frozen=True, slots=True)
class _Window:
    """A job's window in the store: its devices, and its rows a stretch at a time."""

    store: Store
    record: Job
    hosts: tuple[str, ...]

    def devices(self, start: float) -> tuple[Shape, tuple[float, float] | None]:
        """The window's ``Shape`` from ``start`` on, and its first and newest sample times (None: none)."""
        devices, span = queries.job_window_devices(
            self.store,
            REPORT_METRICS,
            device_metrics=_DEVICE_METRICS,
            hosts=list(self.hosts),
            job=self.record.id,
            t0=start,
            t1=self.record.end,
        )
        return shape_of(devices), span

    def stretches(self, start: float, span: tuple[float, float] | None) -> Iterator[tuple[float | None, pa.Table]]:
        """(end, None for the last; rows) of each stretch from ``start`` to the newest sample. A stretch
        is sized to hold about ``STRETCH_ROWS`` at the rate the one before held (``STRETCH_S`` at first, never
        shorter, never more than 8 times longer than the one before); a silence of the nodes is skipped."""
        if span is None:
            return
        at: float | None = max(start, span[0])
        newest, length = span[1], STRETCH_S
        while at is not None and at <= newest:
            a = at
            b = a + length
            last = b > newest
            table = queries.job_window_samples(
                self.store,
                REPORT_METRICS,
                hosts=list(self.hosts),
                job=self.record.id,
                t0=a,
                t1=self.record.end,
                before=None if last else b,
            )
            rows = table.num_rows
            yield None if last else b, table
            del table  # before the next stretch is read: one stretch's rows at a time
            if last:
                return
            if rows:
                length = max(STRETCH_S, min(length * STRETCH_ROWS / rows, 8 * length))
                at = b
            else:
                at = queries.job_window_next(
                    self.store, REPORT_METRICS, hosts=list(self.hosts), job=self.record.id, t0=b, t1=self.record.end
                )


def _still_true(store: Store, kept: _Kept, record: Job, t0: float, hosts: tuple[str, ...], jobs: Sequence[Job]) -> bool:
    """Whether ``kept`` was computed from what the store says now (module doc)."""
    if kept.t0 != t0 or kept.hosts != hosts or kept.allocations != _allocations(jobs, t0, kept.upto):
        return False
    return not queries.job_window_written(
        store, kept.version, REPORT_METRICS, hosts=hosts, job=record.id, t0=t0, before=kept.upto
    )


def _allocations(jobs: Sequence[Job], t0: float, upto: float) -> tuple[Any, ...]:
    """What of ``jobs`` attributes rows between ``t0`` and ``upto`` (``analysis.attribution``: the job holding a
    GPU at t, a later job over an earlier one): each one that ran then, in order, with its GPUs."""
    return tuple(
        (j.id, j.start, j.end if j.end is not None and j.end < upto else None, sorted(j.gpus_by_node.items()))
        for j in jobs
        if j.start is not None and j.start < upto and (j.end is None or j.end > t0)
    )
