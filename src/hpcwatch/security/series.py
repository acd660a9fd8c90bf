"""A detector's samples kept over a sliding window between the scans of a live scan, as columns.

A detector that compares a series' points (counter rises, rates between scrapes, memory left after a job)
reads them grouped by series. Over a live scan's five-minute window at 1,024 nodes that is millions of
points, of which a scan adds a few percent: grouping them all again every scan, or keeping them as Python
tuples a series and touching each series at each read, was most of a scan. A detector's ``WindowSeries``
holds its points as numpy columns (``PointColumns``: each point's series id, time and value): a live scan
adds the rows it read (``add_table``, the store's columns) and forgets those that left the window
(``forget_before``); ``hpcwatch scan`` makes one from all its samples, once (``of``). The rules then look at
the window with a few numpy calls, and in Python only at the few points that may fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Self

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.records import Sample

__all__ = ["WindowSeries", "PointColumns", "PairIds", "numbering_of_held"]


class WindowSeries:
    """What a detector that reads its samples grouped keeps over a live scan's window (``Detector.series``):
    subclasses say how they hold the samples (``add``, ``add_table``) and forget them (``forget_before``)."""

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Self:
        """The samples, added at once (what a one-off scan reads)."""
        series = cls()
        series.add(samples)
        return series

    def add(self, samples: Iterable[Sample]) -> None:
        """Records, in their order."""
        raise NotImplementedError

    def add_table(self, table: pa.Table) -> None:
        """The rows of a table with ``metric``, ``labels`` (JSON text), ``t`` and ``value`` columns, in their
        order (``store.queries.sample_rows_matching``'s)."""
        raise NotImplementedError

    def forget_before(self, t: float) -> None:
        """Drop the points before ``t``."""
        raise NotImplementedError

    def __len__(self) -> int:
        """The points held."""
        raise NotImplementedError


class PointColumns:
    """Points of many series over a sliding window as columns, each a numpy array: ``t`` and the columns named
    at creation. ``add`` appends a chunk (one array a column, of one length); ``forget_before`` keeps the rows at
    or after a time; ``columns()`` is every row held, in the order added, one array a column (joined once after
    a change). A point costs 8 bytes a column, not a ~100-byte tuple."""

    def __init__(self, *names: str) -> None:
        self.names = ("t", *names)
        self._chunks: list[dict[str, np.ndarray]] = []
        self._joined: dict[str, np.ndarray] | None = None

    def add(self, **columns: np.ndarray) -> None:
        if set(columns) != set(self.names):
            raise ValueError(f"columns {sorted(columns)} are not {sorted(self.names)}")
        if len({len(column) for column in columns.values()}) != 1:
            raise ValueError("columns of different lengths")
        if len(columns["t"]):
            self._chunks.append(columns)
            self._joined = None

    def forget_before(self, t: float) -> None:
        if not self._chunks:
            return
        joined = self.columns()
        kept = joined["t"] >= t
        if not kept.all():
            self._chunks = [{name: column[kept] for name, column in joined.items()}] if kept.any() else []
            self._joined = None

    def columns(self) -> dict[str, np.ndarray]:
        if self._joined is None:
            if not self._chunks:
                self._joined = {name: np.empty(0) for name in self.names}
            elif len(self._chunks) == 1:
                self._joined = self._chunks[0]
            else:
                self._joined = {name: np.concatenate([c[name] for c in self._chunks]) for name in self.names}
                self._chunks = [self._joined]
        return self._joined

    def renumber(self, name: str, numbers: np.ndarray) -> None:
        """Column ``name`` (ids) replaced by ``numbers[ids]``: what keeps a series' id small after others left."""
        joined = self.columns()
        if len(joined["t"]):
            self._joined = {**joined, name: numbers[joined[name]]}
            self._chunks = [self._joined]

    def __len__(self) -> int:
        return sum(len(chunk["t"]) for chunk in self._chunks)


def numbering_of_held(ids: np.ndarray, known: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(the ids still held, in order; each known id's new number, -1 for those gone), when the ``known`` ids are
    more than twice those held (and a thousand more): series come and go (a job's Lustre counters, its label),
    and ids once given would otherwise grow with a live scan's age. None when not worth it."""
    held = np.unique(ids)
    if known <= 2 * len(held) + 1024:
        return None
    numbers = np.full(known, -1, np.int64)
    numbers[held] = np.arange(len(held))
    return held, numbers


class PairIds:
    """Ids of the (metric, labels text) pairs of the rows a live scan reads, learnt once a pair.

    ``learn(metric, labels)`` gives a new pair's ids (a tuple of ``width`` ints: its series, its group...), once;
    ``of_table`` gives each row's, matching the pairs of a read against those already learnt in one arrow call:
    a read at 1,024 nodes holds ~90,000 pairs, and a Python dict lookup of each (metric, text) key was a tenth
    of a scan. Past ``most`` pairs learnt (a long run's job ids, in Lustre's labels), all are forgotten and
    learnt again."""

    def __init__(self, width: int, learn: Callable[[str, Mapping[str, str]], tuple[int, ...]], most: int) -> None:
        self.width, self.learn, self.most = width, learn, most
        self._known: pa.Array = pa.array([], pa.string())
        self._ids = np.empty((0, width), np.int64)

    def of_table(self, table: pa.Table) -> np.ndarray:
        """Each row's ids (rows x ``width``), for a table with ``metric`` and ``labels`` (JSON text) columns."""
        if not table.num_rows:
            return np.empty((0, self.width), np.int64)
        metrics = pc.dictionary_encode(table["metric"]).combine_chunks()
        labels = pc.dictionary_encode(table["labels"]).combine_chunks()
        width = len(labels.dictionary)
        pairs, rows = np.unique(
            metrics.indices.to_numpy().astype(np.int64) * width + labels.indices.to_numpy(), return_inverse=True
        )
        names, texts = metrics.dictionary.take(pairs // width), labels.dictionary.take(pairs % width)
        keys = pc.binary_join_element_wise(names, texts, "\n")  # no metric name holds a newline
        if len(self._known) + len(keys) > self.most:
            self._known, self._ids = pa.array([], pa.string()), self._ids[:0]
        at = pc.index_in(keys, value_set=self._known).fill_null(-1).to_numpy().astype(np.int64)
        new = np.flatnonzero(at < 0)
        if new.size:
            learnt = [
                self.learn(name, orjson.loads(text))
                for name, text in zip(names.take(new).to_pylist(), texts.take(new).to_pylist())
            ]
            at[new] = len(self._known) + np.arange(new.size)
            self._known = pa.concat_arrays([self._known, keys.take(new)])
            self._ids = np.vstack([self._ids, np.array(learnt, np.int64).reshape(-1, self.width)])
        return self._ids[at][rows]
