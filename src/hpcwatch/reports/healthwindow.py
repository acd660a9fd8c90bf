"""The health window kept between judgements: each judgement reads only the rows committed since the last.

The live problems (``web.live.ProblemJudge``) judge the last 15 minutes of samples every few seconds. At
1,024 nodes that window holds 10 million rows, and reading it again (DuckDB's sort, the Arrow conversion, the
label sets) was more than half of each judgement, although all but its last seconds had been read by the
judgement before. A ``KeptWindow`` holds the window's rows from one judgement to the next and reads each time
only the rows committed since it last read (each row's commit, ``_v``, which compaction keeps): a late scrape or
a file ingested again lands in the next read whatever its time, as it would in a fresh read. Rows older than the
window's start leave it.

The rows are held per metric, in chunks of one read each (merged as they pile up, so that a metric holds a
handful), with their texts (metric, host, GPU, job, label set) as codes into dictionaries that only grow; the
label sets' dictionary is rebuilt from the codes in use when it has doubled (a job's labels come and go). A
label set is read once, by DuckDB's 64-bit hash of its text: should two texts share a hash, the window is no
longer kept and the caller reads the window at once (``queries.window_samples``), which reads the text per row.

``samples`` returns the rows ``queries.window_samples`` gives, in another order: per metric (metrics in name
order, as the store orders them), then by read, each read in time order. The health rules' series do not depend
on the rows' order (``analysis.health._series``).

``events`` keeps the judgement's events the same way: read since the last judgement (events are never replaced
in a store), those of each kind in time order. A judgement reads every active test's newest result (an NCCL
log's lines of every job ever), and parsing them all again grew with the store's age.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.records import Event
from hpcwatch.store import Store, queries

__all__ = ["KeptWindow"]

_T = TypeVar("_T")

#: The label sets' dictionary is never pruned under this many: a pruning reads every row's code.
LABELS_PRUNED_FROM = 1024
#: The text columns held as codes, beside ``t`` and ``value`` (``labels`` by its hash, ``_LabelSets``).
_TEXT_COLUMNS = ("metric", "host", "gpu", "job")


class _Texts:
    """A dictionary that only grows: each text's code, and the texts as an Arrow array."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self._array: pa.Array | None = None

    def encode(self, column: pa.ChunkedArray) -> pa.Array:
        """``column``'s codes (int32, a null where the text is null)."""
        encoded = pc.dictionary_encode(column.combine_chunks())
        codes = [self.codes.setdefault(text, len(self.codes)) for text in encoded.dictionary.to_pylist()]
        if self._array is not None and len(self._array) != len(self.codes):
            self._array = None
        return pa.array(codes, pa.int32()).take(encoded.indices)

    @property
    def array(self) -> pa.Array:
        if self._array is None:
            self._array = pa.array(list(self.codes), pa.string())
        return self._array


class _Collision(Exception):
    """Two label sets share a hash."""


class _LabelSets:
    """The label sets' dictionary, by hash: a text is read once per read, not once per row."""

    def __init__(self, texts: Sequence[str] = (), hashes: Sequence[int] = ()) -> None:
        self.texts = list(texts)
        self.code_of: dict[int, int] = {h: code for code, h in enumerate(hashes)}
        self.hashes = list(hashes)
        self._array: pa.Array | None = None

    def encode(self, hashes: np.ndarray, sets: pa.Table) -> pa.Array:
        """The codes of rows whose label sets have ``hashes``; ``sets``: the read's (labels_hash, labels). A
        row without labels gets a null."""
        set_hashes = sets["labels_hash"].to_numpy()
        if np.unique(set_hashes).size < set_hashes.size:
            raise _Collision
        codes = np.empty(set_hashes.size, dtype=np.int32)
        absent = np.zeros(set_hashes.size, dtype=bool)
        for i, (h, text) in enumerate(zip(set_hashes.tolist(), sets["labels"].to_pylist())):
            if text is None:
                absent[i] = True
                codes[i] = 0
                continue
            code = self.code_of.get(h)
            if code is None:
                code = self.code_of[h] = len(self.texts)
                self.texts.append(text)
                self.hashes.append(h)
                self._array = None
            elif self.texts[code] != text:
                raise _Collision
            codes[i] = code
        by_hash = np.argsort(set_hashes)
        found = by_hash[np.searchsorted(set_hashes[by_hash], hashes)]
        return pa.array(codes[found], mask=absent[found] if absent.any() else None)

    @property
    def array(self) -> pa.Array:
        if self._array is None:
            self._array = pa.array(self.texts, pa.string())
        return self._array


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Rows of one metric: ``t``, ``value`` and the texts' codes, in one Arrow chunk per column."""

    rows: pa.Table
    t_min: float
    t_max: float
    in_time_order: bool
    held: int
    """The rows of the buffers it slices (a slice keeps its buffers: copied once it holds under half)."""

    @classmethod
    def of(cls, rows: pa.Table, *, in_time_order: bool) -> _Chunk:
        rows = rows.combine_chunks()
        t = rows["t"]
        return cls(rows, pc.min(t).as_py(), pc.max(t).as_py(), in_time_order, rows.num_rows)

    def then(self, newer: _Chunk) -> _Chunk:
        """This chunk's rows followed by ``newer``'s."""
        in_order = self.in_time_order and newer.in_time_order and self.t_max <= newer.t_min
        return _Chunk.of(pa.concat_tables([self.rows, newer.rows]), in_time_order=in_order)

    def from_time(self, t0: float) -> _Chunk | None:
        """The rows at or after ``t0`` (None: none)."""
        if self.t_min >= t0:
            return self
        if self.t_max < t0:
            return None
        if not self.in_time_order:
            return _Chunk.of(self.rows.filter(pc.greater_equal(self.rows["t"], t0)), in_time_order=False)
        first = int(np.searchsorted(self.rows["t"].to_numpy(), t0, side="left"))
        kept = self.rows.slice(first)
        if kept.num_rows * 2 < self.held:
            return _Chunk.of(kept, in_time_order=True)  # a copy: the old rows' buffers go
        return _Chunk(kept, float(kept["t"][0].as_py()), self.t_max, True, self.held)


class KeptWindow:
    """A window of samples of one store kept between reads (module docstring). One per reader: its reads take
    turns; asked of another store or of other metrics, it starts anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._broken = False
        self._store: Store | None = None
        self._newest: tuple[Store, float] | None = None
        self._events: dict[tuple[Store, tuple[str, ...]], _KeptEvents] = {}
        self._clear(())

    def newest(self, store: Store) -> float | None:
        """``store``'s newest sample time (``Store.time_range``'s), read from the last one found on: DuckDB skips
        the row groups before it (samples never leave a store)."""
        with self._lock:
            since = self._newest[1] if self._newest is not None and self._newest[0] is store else None
            found = queries.latest_sample_t(store, since=since)
            newest = found if found is not None else since
            self._newest = None if newest is None else (store, newest)
            return newest

    def every(self, name: str, at: float | None, every_s: float, make: Callable[[], _T]) -> _T:
        """What ``make()`` returned, kept until ``at`` (the window's end, the data's clock) moved on by
        ``every_s`` or went back: a judgement part whose answer changes more slowly than the judgements come."""
        held = self._results.get(name)
        if held is None or at is None or held[0] is None or not held[0] <= at < held[0] + every_s:
            held = self._results[name] = (at, make())
        return held[1]

    def _clear(self, metrics: Sequence[str]) -> None:
        self._results: dict[str, tuple[float | None, Any]] = {}
        self._metrics = tuple(metrics)
        self._version = 0
        self._chunks: dict[int, list[_Chunk]] = {}  # metric code -> its chunks, oldest first
        self._texts = {name: _Texts() for name in _TEXT_COLUMNS}
        self._labels = _LabelSets()
        self._labels_pruned_at = 0

    def events(self, store: Store, kinds: Sequence[str], *, t0: float | None = None) -> list[Event]:
        """``store.events`` of each of ``kinds`` from ``t0`` (None: all), kind after kind, reading only the
        events committed since the last call for these kinds (each set of kinds is kept on its own)."""
        with self._lock:
            key = (store, tuple(kinds))
            kept = self._events.get(key)
            if kept is None:
                kept = self._events[key] = _KeptEvents()
            return kept.read(store, kinds, t0)

    def samples(self, store: Store, metrics: Sequence[str], *, t0: float) -> pa.Table | None:
        """The rows of ``metrics`` from ``t0`` (``queries.window_samples``'s, in another order), reading only
        what was committed since the last call; None when two label sets share a hash (read it at once)."""
        with self._lock:
            if self._broken:
                return None
            if store is not self._store or tuple(metrics) != self._metrics:
                self._clear(metrics)
                self._store = store
            rows, sets = queries.window_samples_after(store, metrics, t0=t0, version=self._version)
            try:
                self._add(rows, sets)
            except _Collision:
                self._broken = True
                self._clear(())
                return None
            self._forget_before(t0)
            self._prune_labels()
            return self._table()

    def _add(self, rows: pa.Table, sets: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        labels = self._labels.encode(rows["labels_hash"].to_numpy(), sets)  # first: it may refuse the read
        coded = pa.table(
            {
                "t": rows["t"],
                "value": rows["value"],
                **{name: self._texts[name].encode(rows[name]) for name in _TEXT_COLUMNS},
                "labels": labels,
            }
        )
        metric_codes = coded["metric"].to_numpy()  # the rows come ordered by metric, then time
        edges = [0, *(np.flatnonzero(np.diff(metric_codes)) + 1).tolist(), coded.num_rows]
        chunks = [
            (int(metric_codes[a]), _Chunk.of(coded.slice(a, b - a), in_time_order=True))
            for a, b in zip(edges, edges[1:])
        ]
        version = max(self._version, int(pc.max(rows["_v"]).as_py()))
        try:
            for metric, chunk in chunks:
                self._append(metric, chunk)
        except BaseException:  # part of a read held (out of memory): start anew rather than count rows twice
            self._clear(self._metrics)
            raise
        self._version = version

    def _append(self, metric: int, chunk: _Chunk) -> None:
        """``chunk`` after the metric's others, merged with the newest while they are no larger: a metric holds
        a handful of chunks, each row copied a few times in its life (as a binary counter carries)."""
        chunks = self._chunks.setdefault(metric, [])
        chunks.append(chunk)
        while len(chunks) > 1 and chunks[-2].rows.num_rows <= chunks[-1].rows.num_rows:
            newer = chunks.pop()
            chunks[-1] = chunks[-1].then(newer)

    def _forget_before(self, t0: float) -> None:
        for metric in list(self._chunks):
            kept = [c for c in (chunk.from_time(t0) for chunk in self._chunks[metric]) if c is not None]
            if kept:
                self._chunks[metric] = kept
            else:
                del self._chunks[metric]

    def _prune_labels(self) -> None:
        """The label sets' dictionary rebuilt from the codes in use, once it doubled since it last was (or since
        the first read)."""
        if not self._labels_pruned_at:
            self._labels_pruned_at = len(self._labels.texts)
        if len(self._labels.texts) <= max(2 * self._labels_pruned_at, LABELS_PRUNED_FROM):
            return
        used = np.unique(
            np.concatenate(
                [c.rows["labels"].drop_null().to_numpy() for chunks in self._chunks.values() for c in chunks] or [[]]
            )
        ).astype(np.int64)
        new_code = np.full(len(self._labels.texts), -1, dtype=np.int32)
        new_code[used] = np.arange(used.size, dtype=np.int32)
        renumber = pa.array(new_code)
        for chunks in self._chunks.values():
            for i, c in enumerate(chunks):
                rows = c.rows.set_column(
                    c.rows.schema.get_field_index("labels"), "labels", renumber.take(c.rows["labels"])
                )
                chunks[i] = _Chunk(rows, c.t_min, c.t_max, c.in_time_order, c.held)
        self._labels = _LabelSets([self._labels.texts[i] for i in used], [self._labels.hashes[i] for i in used])
        self._labels_pruned_at = used.size

    def _table(self) -> pa.Table:
        """The rows as ``queries.window_samples`` gives them: metric, t, value, host, gpu, job, labels, the texts
        as dictionary arrays (each column's chunks share one dictionary)."""
        dictionaries = {name: texts.array for name, texts in self._texts.items()} | {"labels": self._labels.array}
        metric_names = self._texts["metric"].array.to_pylist()
        batches = []
        for metric in sorted(self._chunks, key=lambda code: metric_names[code]):
            for chunk in self._chunks[metric]:
                rows = chunk.rows
                batches.append(
                    pa.record_batch(
                        {
                            "metric": pa.DictionaryArray.from_arrays(rows["metric"].chunk(0), dictionaries["metric"]),
                            "t": rows["t"].chunk(0),
                            "value": rows["value"].chunk(0),
                            **{
                                name: pa.DictionaryArray.from_arrays(rows[name].chunk(0), dictionaries[name])
                                for name in ("host", "gpu", "job", "labels")
                            },
                        }
                    )
                )
        if not batches:
            return _EMPTY
        return pa.Table.from_batches(batches)


_EMPTY = pa.table(
    {
        "metric": pa.array([], pa.string()),
        "t": pa.array([], pa.float64()),
        "value": pa.array([], pa.float64()),
        **{name: pa.array([], pa.string()) for name in ("host", "gpu", "job", "labels")},
    }
)


class _KeptEvents:
    """Events of some kinds, each kind's in time order, extended by those committed since the last read."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self.version = 0
        self.by_kind: dict[str, list[Event]] = {}
        self.t0: float | None = None
        """The start of the last read's window (None: all time)."""

    def read(self, store: Store, kinds: Sequence[str], t0: float | None) -> list[Event]:
        if self.t0 is not None and (t0 is None or t0 < self.t0):
            self._forget()  # asked further back than what was kept: all read again
        self.t0 = t0
        self.version, new = queries.events_of_kinds(store, kinds, since_version=self.version)
        for event in new:  # in time order: each goes at its kind's end, unless it came late
            insort(self.by_kind.setdefault(event.kind, []), event, key=_time)
        if t0 is not None:  # those before the window leave it (a read further back reads them again)
            self.by_kind = {kind: events[_first_at(events, t0) :] for kind, events in self.by_kind.items()}
        return [e for kind in kinds for e in self.by_kind.get(kind, ())]


def _time(event: Event) -> float:
    return event.t


def _first_at(events: list[Event], t0: float) -> int:
    """The index of the first of ``events`` (in time order) at or after ``t0``."""
    return bisect_left(events, t0, key=_time)
