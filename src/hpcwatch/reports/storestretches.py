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
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from hpcwatch.analysis.attribution import partial_of
from hpcwatch.analysis.jobpartial import Partial, Shape
from hpcwatch.records import Job
from hpcwatch.reports.jobstretches import (
    CHECKPOINT_LAGS,
    Checkpoint,
    by_age,
    checkpoint_cuts,
    read_end,
    shapes_union,
    timed_stretches,
    with_lead_in,
)
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["STORE_STRETCH_ROWS", "STORE_STRETCH_S", "KeptStore", "store_partial"]

#: Rows one stretch of the whole store holds, about: every job's GPUs at once, so more than a job's stretch
#: (``jobstretches.STRETCH_ROWS``), for fewer reductions of every GPU. Ours: ``hpcwatch jobs`` of a 1,024-node
#: store peaks at 0.70 GB two minutes old and 0.75 GB ten minutes old, where one read held 5.3 GB at ten.
STORE_STRETCH_ROWS: Final = 1_000_000
#: The first stretch (before the store's rate is known), and the shortest. Ours: at 1,024 nodes 10 s are ~0.7
#: million rows.
STORE_STRETCH_S: Final = 10.0


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


class KeptStore:
    """The checkpoints of the whole store's partial (module doc), per set of metrics of one store (another store
    given reads whole, and its checkpoints replace the first's). Safe to share between
    threads: one read at a time, so that a scrape that comes during another's (another scope's) waits for it
    and reads on from where it ended, instead of reading the same rows beside it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[tuple[str, ...], float | None], _Kept] = {}

    def partial(
        self, store: Store, metrics: Sequence[str], jobs: Sequence[Job], *, since: float | None = None
    ) -> Partial:
        """``store_partial``'s, read from the newest checkpoint still true on; the read's checkpoints kept. The
        partial returned is kept too: the caller reads it, never changes it."""
        key = (tuple(metrics), since)
        with self._lock:
            version = store.version  # before any read: a row committed during it is checked next time
            older = _still_true(store, metrics, jobs, self._kept.get(key))
            start = older[-1] if older else None
            total, checkpoints = _read_on(store, metrics, jobs, start, since)
            if len(total.shapes) > 1:  # a device the stretches before it lacked: every stretch again, with all
                older = ()
                total, checkpoints = _read_on(store, metrics, jobs, None, since, shapes_union(total.shapes))
            kept = by_age([*older, *checkpoints], total.newest_t, CHECKPOINT_LAGS)
            self._kept[key] = _Kept(store, version, {j.id: j for j in jobs}, kept)
            return total


def _still_true(
    store: Store, metrics: Sequence[str], jobs: Sequence[Job], found: _Kept | None
) -> tuple[Checkpoint, ...]:
    """The checkpoints of ``found`` up to the newest one still true (module doc), oldest first; none when
    none is, when ``found`` is another store's, or when the store's version is behind ``found``'s (made again)."""
    if found is None or found.store is not store or not found.checkpoints or found.version > store.version:
        return ()
    late = queries.samples_written(store, found.version, metrics, before=found.checkpoints[-1].upto)
    limit = min(math.inf if late is None else late, _moved_from(found.jobs, jobs))
    true = [k for k, c in enumerate(found.checkpoints) if c.upto <= limit]
    return found.checkpoints[: true[-1] + 1] if true else ()


def _read_on(
    store: Store,
    metrics: Sequence[str],
    jobs: Sequence[Job],
    start: Checkpoint | None,
    since: float | None,
    shape: Shape | None = None,
) -> tuple[Partial, list[Checkpoint]]:
    """The stretches from ``start`` (None: the store's oldest sample from ``since`` on) to the newest sample,
    joined to ``start``'s, and the checkpoints the read leaves: one per age band it passed (``checkpoint_cuts``)
    and one at its end. ``shape``: the devices to reduce the first stretch with (None: ``start``'s)."""
    total = start.state.copy() if start is not None else Partial()
    if shape is None and start is not None:
        shape = shapes_union(start.state.shapes)
    span = _span_after(store, metrics, start, since)
    if span is None:
        return total, []
    cuts = checkpoint_cuts(*span, resumed=start is not None)
    checkpoints = []
    lead_in = start is None and since is not None
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
        if b in cuts:
            checkpoints.append(Checkpoint(b, None, total.copy()))
    if total.newest_t is not None:  # every row before it was read (one committed during the read: next time)
        # Not a copy: the next read copies it before adding to it, and the caller only reads it.
        checkpoints.append(Checkpoint(read_end(total.newest_t), None, total))
    return total, checkpoints


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


def _moved_from(before: Mapping[str, Job], now: Sequence[Job]) -> float:
    """The oldest time from which ``now``'s jobs attribute a row otherwise than ``before``'s did (inf: none): a
    checkpoint up to it still holds. Attribution reads a job's start, end and GPUs (a row at ``t`` in
    ``(start, end]`` on one of its GPUs is the job's): a job new or gone moves rows from its start, another
    start or other GPUs from the earlier start, another end from the earlier end."""
    moved = math.inf
    for job in now:
        moved = min(moved, _moved(before.get(job.id), job))
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
