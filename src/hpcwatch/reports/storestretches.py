"""Every job's report from the whole store, read stretch by stretch in time, and read on from what was kept.

``hpcwatch jobs`` and the exporter's per-job families report every job the store holds: what each sample of the
report's metrics says of the job that held its GPU then (``analysis.attribution``). The store is read a stretch
of time at a time (``STORE_STRETCH_ROWS``, every job's GPUs at once), each stretch reduced to an
``analysis.jobpartial.Partial`` and joined to those before it: memory is one stretch's rows whatever the store's
age, where one read grew with it (ten minutes at 1,024 nodes: 5.3 GB; a day ~150 times that).

A reader that runs on (``KeptStore``: the exporter, which Prometheus asks every 15-60 s) keeps checkpoints of
the joined stretches, as a server keeps a job's (``reports.jobstretches.KeptStretches``), and the next read
starts from the newest one still true. Read whole each time, a scrape of a 1,024-node store ten minutes old took
6.7 s, and of a day-old one it would take a quarter of an hour: past any scrape timeout, with every scrape
of each scope reading it again. Kept, a scrape reads what landed since the last one's read. A checkpoint at
``upto`` (every row before it read) is not used when

- a commit since the read added a sample before it (a node scraped late, a file ingested again):
  ``store.queries.samples_written`` gives the oldest such sample, from the parts committed since;
- a job's allocation changed in a way that moves rows before it to another job (``_moved_from``): a job
  recorded late, an end recorded after the fact (the rows after it were the job's), another start or other GPUs;
- a later stretch showed a device those before it lacked (``Shape``): then every stretch is read again.

A read keeps a checkpoint at its end and ``SETTLE_S`` before it, and of the older ones the oldest of each age
band (``jobstretches.CHECKPOINT_LAGS``), so that a row landing ``x`` late, or a job ending ``x`` before Slurm
says so, costs a read of at most ~4x of the store, not of its life.

A reader that reports recent jobs only (``KeptStore(ended_within_s=…)``: the exporter, whose Prometheus keeps
the ended jobs' last values in its own history) keeps no more than it reports: the running workloads and those
that ended within that time before the newest sample (``recent``). What the partial says of the others is
dropped as the read goes (``Partial.drop_workloads``), so the checkpoints hold the recent jobs' cells, not those
of every job of the store's life (months at 1,024 nodes: ~100,000 jobs, which made a scrape of 436,000 lines and
10-12 s, benchmarks/RESULTS.md). A job dropped whose allocation changes since (a requeue) makes the next read
start from the store's first sample; a workload without a record (a pod, a label) seen again after it was
dropped, silent that long, starts anew: its figures count from its return, as Prometheus' series of it had gone
stale.

Kept ``on_disk`` (the exporter), the newest settled checkpoint is also written to the store's folder, at most
once a ``SAVE_EVERY_S`` of the store's time (``reports.checkpointfiles``, kind ``store``, with the allocations
the rows were attributed among and the workloads dropped), and a process that starts (an exporter restarted, an
upgrade) reads on from it by the same checks, instead of reading the store's life: months at 1,024 nodes.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from hpcwatch.analysis.attribution import partial_of, report_time
from hpcwatch.analysis.jobpartial import Partial, Shape
from hpcwatch.errors import one_line
from hpcwatch.records import Job
from hpcwatch.reports.checkpointfiles import CheckpointFiles, Saved
from hpcwatch.reports.jobstretches import (
    CHECKPOINT_LAGS,
    SETTLE_S,
    Checkpoint,
    by_age,
    checkpoint_cuts,
    due_to_save,
    read_end,
    shapes_union,
    timed_stretches,
    with_lead_in,
)
from hpcwatch.reports.text import visible
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["STORE_STRETCH_ROWS", "STORE_STRETCH_S", "STORE_KIND", "KeptStore", "recent", "store_partial"]

log = logging.getLogger(__name__)

#: Rows one stretch of the whole store holds, about: every job's GPUs at once, so more than a job's stretch
#: (``jobstretches.STRETCH_ROWS``), for fewer reductions of every GPU. Ours: ``hpcwatch jobs`` of a 1,024-node
#: store peaks at 0.70 GB two minutes old and 0.75 GB ten minutes old, where one read held 5.3 GB at ten.
STORE_STRETCH_ROWS: Final = 1_000_000
#: The first stretch (before the store's rate is known), and the shortest. Ours: at 1,024 nodes 10 s are ~0.7
#: million rows.
STORE_STRETCH_S: Final = 10.0
#: A read that keeps recent jobs only drops the others' figures when its cells have grown this many times since it
#: last did (and at each checkpoint): a read of months drops as it goes, for a pass over the cells now and then. Ours.
DROP_GROWTH: Final = 2
#: The kind of the whole store's checkpoint file (``reports.checkpointfiles``).
STORE_KIND: Final = "store"


def recent(job: Job, since: float) -> bool:
    """Whether ``job`` has not ended (it runs, or waits to), or ended at ``since`` or later."""
    return job.end is None or job.end >= since


def store_partial(
    store: Store,
    metrics: Sequence[str],
    jobs: Sequence[Job],
    *,
    kept: KeptStore | None = None,
    since: float | None = None,
) -> Partial:
    """What every sample of ``metrics`` in ``store`` (from ``since`` on, when given) says of each of ``jobs``,
    read stretch by stretch in time (module doc); with ``kept``, from its newest checkpoint still true on. The
    stretches are reduced with the devices of those before them, and read again with every device when a later
    one showed one they lacked (``Shape``): the report is one pass's, to the last digit."""
    return (kept if kept is not None else KeptStore()).partial(store, metrics, jobs, since=since)


_Key = tuple[tuple[str, ...], float | None]
"""What a reader's checkpoints are of: the metrics read, from when (None: the store's first sample)."""


@dataclass(frozen=True, slots=True)
class _Kept:
    """A store's checkpoints of one set of metrics, oldest first, and what they were computed from."""

    store: Store
    """Which store: two in memory have one path."""
    version: int
    """The store's version before the read: a commit after it may have added rows before a checkpoint."""
    jobs: Mapping[str, Job]
    """The jobs the rows were attributed among, by id."""
    checkpoints: tuple[Checkpoint, ...]
    dropped: frozenset[str] = frozenset()
    """The workloads whose figures the checkpoints no longer hold (``Partial.drop_workloads``)."""


class KeptStore:
    """The checkpoints of the whole store's partial (module doc), per set of metrics of one store (another store
    given reads whole, and its checkpoints replace the first's). Safe to share between
    threads: one read at a time, so that a scrape that comes during another's (another scope's) waits for it
    and reads on from where it ended, instead of reading the same rows beside it."""

    def __init__(self, *, ended_within_s: float = math.inf, on_disk: bool = False) -> None:
        self.ended_within_s = ended_within_s
        """The workloads a partial holds the figures of: those running at its newest sample or that ended within
        this many seconds before it (``recent``; inf: every one). The others' are dropped (module doc)."""
        self.on_disk = on_disk
        """Whether the newest settled checkpoint is also written to the store's folder, and a read with none
        kept in memory reads on from the one there (module doc)."""
        self._lock = threading.Lock()
        self._kept: dict[_Key, _Kept] = {}
        self._files: tuple[Store, CheckpointFiles | None] | None = None
        self._looked_on_disk: set[tuple[str, _Key]] = set()
        self._saved_upto: dict[tuple[str, _Key], float] = {}

    def partial(
        self, store: Store, metrics: Sequence[str], jobs: Sequence[Job], *, since: float | None = None
    ) -> Partial:
        """``store_partial``'s, read from the newest checkpoint still true on, holding the recent workloads'
        figures (``shown``); the read's checkpoints kept. The partial returned is kept too: the caller reads it,
        never changes it."""
        key = (tuple(metrics), since)
        with self._lock:
            version = store.version  # before any read: a row committed during it is checked next time
            found = self._kept.get(key)
            if found is None or found.store is not store:
                found = self._load(store, key)
            older = _still_true(store, metrics, jobs, found)
            read = _Read(store, metrics, {j.id: j for j in jobs}, self.ended_within_s, since)
            if older and found is not None:
                read.dropped |= found.dropped
            total, checkpoints = read.on(older[-1] if older else None)
            if len(total.shapes) > 1:  # a device the stretches before it lacked: every stretch again, with all
                older, read = (), _Read(store, metrics, read.jobs, self.ended_within_s, since)
                total, checkpoints = read.on(None, shapes_union(total.shapes))
            kept = by_age([*older, *checkpoints], total.newest_t, CHECKPOINT_LAGS)
            self._kept[key] = _Kept(store, version, read.jobs, kept, frozenset(read.dropped))
            self._save(store, key, self._kept[key])
            return total

    def shown(self, part: Partial, jobs: Sequence[Job]) -> list[Job]:
        """Those of ``jobs`` whose figures ``part`` (this one's) holds: the recent ones."""
        if self.ended_within_s == math.inf:
            return list(jobs)
        since = report_time(part, jobs) - self.ended_within_s
        return [j for j in jobs if recent(j, since)]

    def _files_of(self, store: Store) -> CheckpointFiles | None:
        if self._files is None or self._files[0] is not store:
            self._files = (store, CheckpointFiles.of(store) if self.on_disk else None)
        return self._files[1]

    def _load(self, store: Store, key: _Key) -> _Kept | None:
        """The checkpoint in the store's folder, the first time this one asks (None: none that this reader can
        read on from: another window's, a store made again since, a file not ours)."""
        files = self._files_of(store)
        seen = (str(store.config.path), key)
        if files is None or seen in self._looked_on_disk:
            return None
        self._looked_on_disk.add(seen)
        saved = files.load(STORE_KIND, _file_name(key))
        if saved is None or saved.version > store.version:
            return None
        try:
            return _kept_from_plain(store, saved, key, self.ended_within_s)
        except (ValueError, KeyError, TypeError) as err:
            log.warning(
                "%s: skipped: %s", visible(files.path(STORE_KIND, _file_name(key))), visible(one_line(str(err)))
            )
            return None

    def _save(self, store: Store, key: _Key, kept: _Kept) -> None:
        """Write ``kept``'s newest checkpoint ``SETTLE_S`` before its newest sample when it is ``SAVE_EVERY_S`` past
        the one written last (or before it: a row landed late and the read went back)."""
        files = self._files_of(store)
        newest = kept.checkpoints[-1].state.newest_t if kept.checkpoints else None
        if files is None or newest is None:
            return
        seen = (str(store.config.path), key)
        c = due_to_save(kept.checkpoints, newest - SETTLE_S, self._saved_upto.get(seen))
        if c is None:
            return
        self._saved_upto[seen] = c.upto
        try:
            extra = {
                "since": key[1],
                "ended_within_s": self.ended_within_s,
                "jobs": [(j.id, j.start, j.end, sorted(j.gpus_by_node.items())) for j in kept.jobs.values()],
                "dropped": sorted(kept.dropped),
            }
            files.save(
                Saved(_file_name(key), STORE_KIND, 0.0, (), kept.version, extra, c.upto, None, c.state.to_plain())
            )
        except Exception as err:  # a bug in a plain form: the scrape still answers (the file is only a cache)
            log.error("the store's checkpoint not written: %s", visible(one_line(repr(err))))


def _file_name(key: _Key) -> str:
    metrics, since = key
    return f"every job: {','.join(metrics)} from {since}"


def _kept_from_plain(store: Store, saved: Saved, key: _Key, ended_within_s: float) -> _Kept | None:
    """What ``saved`` holds, as kept in memory; None when it was read from another time on or kept fewer jobs
    than ``ended_within_s`` asks. Only the allocations of the jobs are kept (what ``_moved`` compares)."""
    extra = saved.extra
    if extra["since"] != key[1] or float(extra["ended_within_s"]) < ended_within_s:
        return None
    jobs = {
        str(job): Job(id=str(job), start=start, end=end, gpus_by_node={node: tuple(g) for node, g in gpus})
        for job, start, end, gpus in extra["jobs"]
    }
    checkpoint = Checkpoint(saved.upto, None, Partial.from_plain(saved.state))
    return _Kept(store, saved.version, jobs, (checkpoint,), frozenset(map(str, extra["dropped"])))


def _still_true(
    store: Store, metrics: Sequence[str], jobs: Sequence[Job], found: _Kept | None
) -> tuple[Checkpoint, ...]:
    """The checkpoints of ``found`` up to the newest one still true (module doc), oldest first; none when
    none is, when ``found`` is another store's, or when the store's version is behind ``found``'s (made again)."""
    if found is None or found.store is not store or not found.checkpoints or found.version > store.version:
        return ()
    if found.dropped and _changed(found.jobs, jobs, found.dropped):  # a dropped job back: the store's life again
        return ()
    late = queries.samples_written(store, found.version, metrics, before=found.checkpoints[-1].upto)
    limit = min(math.inf if late is None else late, _moved_from(found.jobs, jobs))
    true = [k for k, c in enumerate(found.checkpoints) if c.upto <= limit]
    return found.checkpoints[: true[-1] + 1] if true else ()


class _Read:
    """One read of the store's stretches on from a checkpoint, dropping as it goes the figures of the workloads
    that are not recent (``ended_within_s`` before the stretch's end; inf: none)."""

    def __init__(
        self,
        store: Store,
        metrics: Sequence[str],
        jobs: Mapping[str, Job],
        ended_within_s: float,
        since: float | None,
    ) -> None:
        self.store, self.metrics, self.jobs, self.since = store, metrics, jobs, since
        self.ended_within_s = ended_within_s
        self.dropped: set[str] = set()
        """The workloads whose figures this read, or those it reads on from, dropped."""

    def on(self, start: Checkpoint | None, shape: Shape | None = None) -> tuple[Partial, list[Checkpoint]]:
        """The stretches from ``start`` (None: the store's oldest sample from ``since`` on) to the newest sample,
        joined to ``start``'s, and the checkpoints the read leaves: one per age band it passed
        (``checkpoint_cuts``) and one at its end. ``shape``: the devices to reduce the first stretch with (None:
        ``start``'s)."""
        store, metrics, jobs = self.store, self.metrics, list(self.jobs.values())
        total = start.state.copy() if start is not None else Partial()
        if shape is None and start is not None:
            shape = shapes_union(start.state.shapes)
        span = _span_after(store, metrics, start, self.since)
        if span is None:
            return total, []
        cuts = checkpoint_cuts(*span, resumed=start is not None)
        checkpoints = []
        lead_in = start is None and self.since is not None
        cells_then = len(total.cells)
        for b, table in timed_stretches(
            lambda a, before: queries.window_samples(store, metrics, t0=a, before=before),
            lambda b: queries.next_sample_t(store, metrics, b),
            *span,
            shortest_s=STORE_STRETCH_S,
            rows_wanted=STORE_STRETCH_ROWS,
            cuts=cuts,
        ):
            if lead_in:  # a read from ``since``: with each series' sample before it, as a read of every sample has
                table, lead_in = with_lead_in(store, table, metrics, t0=span[0], hosts=None), False
            part = partial_of(table, jobs, shape=shape)
            del table  # before the next stretch is read
            shape = shapes_union(part.shapes | ({shape} if shape is not None else set()))
            total.add(part)
            if b is not None and (b in cuts or len(total.cells) > DROP_GROWTH * max(cells_then, 1)):
                self._drop_old(total, b)
                cells_then = len(total.cells)
            if b in cuts:
                checkpoints.append(Checkpoint(b, None, total.copy()))
        if total.newest_t is not None:  # every row before it was read (one committed during the read: next time)
            self._drop_old(total, total.newest_t)
            # Not a copy: the next read copies it before adding to it, and the caller only reads it.
            checkpoints.append(Checkpoint(read_end(total.newest_t), None, total))
        return total, checkpoints

    def _drop_old(self, total: Partial, now: float) -> None:
        """Drop from ``total`` what it says of the workloads not recent at ``now``: the jobs that ended more than
        ``ended_within_s`` before it, the workloads without a record last seen then (one seen only in Lustre's
        or Slurm's figures has no time: kept)."""
        if self.ended_within_s == math.inf:
            return
        since = now - self.ended_within_s
        held = total.workloads()
        jobs = self.jobs
        old = {w for w in held & jobs.keys() if not recent(jobs[w], since)}
        old |= {w for w, t in total.last_seen(held - jobs.keys()).items() if t < since}
        total.drop_workloads(old)
        self.dropped |= old


def _span_after(
    store: Store, metrics: Sequence[str], start: Checkpoint | None, since: float | None
) -> tuple[float, float] | None:
    """The times of the first and the newest sample of ``metrics`` to read after ``start`` (None: of the whole
    store from ``since`` on); None when there is none."""
    if start is None:
        span = queries.samples_span(store, metrics)
        if span is None or since is None:
            return span
        return (max(span[0], since), span[1]) if span[1] >= since else None
    newest = queries.latest_sample_t(store, since=start.upto, metrics=metrics)
    return None if newest is None else (start.upto, newest)


def _changed(before: Mapping[str, Job], now: Sequence[Job], among: AbstractSet[str]) -> bool:
    """Whether the allocation of one of ``among`` moved rows between ``before`` and ``now`` (``_moved``)."""
    now_among = {j.id: j for j in now if j.id in among}
    return any(_moved(before.get(job), now_among.get(job)) != math.inf for job in among)


def _moved_from(before: Mapping[str, Job], now: Sequence[Job]) -> float:
    """The oldest time from which ``now``'s jobs attribute a row otherwise than ``before``'s did (inf: none): a
    checkpoint up to it still holds. Attribution reads a job's start, end and GPUs (a row at ``t`` in
    ``(start, end]`` on one of its GPUs is the job's): a job new or gone moves rows from its start, another
    start or other GPUs from the earlier start, another end from the earlier end."""
    moved = math.inf
    for job in now:
        old = before.get(job.id)
        if old is not job:  # the store hands the same record while it is unchanged: most of them
            moved = min(moved, _moved(old, job))
    for gone in before.keys() - {job.id for job in now}:
        moved = min(moved, _moved(before[gone], None))
    return moved


def _moved(old: Job | None, new: Job | None) -> float:
    def earliest(*times: float | None) -> float:
        return min((t for t in times if t is not None), default=math.inf)

    if old is None or new is None:
        either = old if old is not None else new
        return earliest(either.start) if either is not None else math.inf
    if old.start != new.start or old.gpus_by_node != new.gpus_by_node:
        return earliest(old.start, new.start)
    return earliest(old.end, new.end) if old.end != new.end else math.inf
