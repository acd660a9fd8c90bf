"""A detector's samples grouped by series, kept over a sliding window between the scans of a live scan.

A detector that compares a series' points (counter rises, rates between scrapes, memory left after a job)
first groups its samples by series. Over a live scan's five-minute window at 1,024 nodes that is millions of
samples, grouped again every scan although all but the last few seconds were grouped the scan before: most of
a scan's time. A ``SeriesGroups`` holds the grouping: a live scan adds only the samples that arrived and
forgets the points that left the window; ``hpcwatch scan`` makes one from all its samples, once.

Samples arrive as ``Run``s: consecutive points of one series (one metric, one label set). A live scan reads
its rows as columns and cuts them into runs (``runs_of_table``), so a series' key is worked out once
a read, not once a sample; ``add`` cuts a list of ``Sample``s into runs of the samples that follow one another.

Each group maps a series key to its points, tuples whose first item is the time, in the order they were
added. ``forget_before`` drops the points before a time, as the flat window it replaces dropped its samples:
by slicing each series while every series was added in time order (what collectors and the twin do), by
looking at every point otherwise. A subclass that keeps something per pair of consecutive points (a rate, a
rise) is told of each pair made and each pair dropped while the series are in time order (``pairs_added``,
``pairs_dropped``); once a point came out of order, it works from the points again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from operator import itemgetter
from typing import Self

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.records import Sample

__all__ = ["SeriesGroups", "Run", "runs_of", "runs_of_table", "Points"]

Points = list[tuple]
_time = itemgetter(0)


@dataclass(frozen=True, slots=True)
class Run:
    """Points of one series that arrived one after the other: ``t`` and ``values`` side by side."""

    metric: str
    labels: Mapping[str, str]
    t: list[float]
    values: list[float]


def runs_of(samples: Iterable[Sample]) -> list[Run]:
    """``samples`` as runs, in their order: a run ends where the next sample is of another metric or carries
    another labels mapping (the store's readers share one mapping per series)."""
    runs: list[Run] = []
    for s in samples:
        run = runs[-1] if runs else None
        if run is None or s.metric != run.metric or s.labels is not run.labels:
            run = Run(s.metric, s.labels, [], [])
            runs.append(run)
        run.t.append(s.t)
        run.values.append(s.value)
    return runs


def runs_of_table(table: pa.Table) -> list[Run]:
    """The rows of a table with ``metric``, ``labels`` (JSON text), ``t`` and ``value`` columns as runs, one a
    series, each in the table's order. A labels text is decoded once, and its mapping shared by its runs."""
    if not table.num_rows:
        return []
    metrics = pc.dictionary_encode(table["metric"]).combine_chunks()
    labels = pc.dictionary_encode(table["labels"]).combine_chunks()
    series = metrics.indices.to_numpy().astype(np.int64) * len(labels.dictionary) + labels.indices.to_numpy()
    order = np.argsort(series, kind="stable")
    series = series[order]
    t, values = table["t"].to_numpy()[order].tolist(), table["value"].to_numpy()[order].tolist()
    edges = [0, *(np.flatnonzero(np.diff(series)) + 1).tolist(), len(series)]
    names = metrics.dictionary.to_pylist()
    decoded = [orjson.loads(text) for text in labels.dictionary.to_pylist()]
    width = len(decoded)
    return [
        Run(names[code // width], decoded[code % width], t[a:b], values[a:b])
        for code, a, b in zip(series[edges[:-1]].tolist(), edges, edges[1:])
    ]


class SeriesGroups:
    """Named groups of series (``key -> points``); subclasses say how a run is grouped (``add_runs``)."""

    def __init__(self, *names: str) -> None:
        self.groups: dict[str, defaultdict[tuple, Points]] = {name: defaultdict(list) for name in names}
        self.in_time_order = True
        """False once a point came before its series' last one (``extend``): ``forget_before`` then looks at
        every point."""

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Self:
        """A grouping of ``samples``, made at once (what a one-off scan reads)."""
        series = cls()
        series.add(samples)
        return series

    def add(self, samples: Iterable[Sample]) -> None:
        self.add_runs(runs_of(samples))

    def add_runs(self, runs: Iterable[Run]) -> None:
        raise NotImplementedError

    def extend(self, name: str, key: tuple, points: Iterable[tuple]) -> None:
        """Add ``points`` (time first, in arrival order) to the series ``key`` of group ``name``, noting whether
        the series are still in order: each point at or after the one before, and after it when it has the same
        time and a smaller value (as ``list.sort`` would put them, which the detectors do otherwise)."""
        held = self.groups[name][key]
        start = len(held)
        held.extend(points)
        if self.in_time_order and (
            (start and held[start] < held[start - 1])
            or (len(held) - start > 1 and any(b < a for a, b in pairwise(held[start:])))
        ):
            self.in_time_order = False
        if self.in_time_order:
            self.pairs_added(name, key, held, max(start, 1))

    def pairs_added(self, name: str, key: tuple, points: Points, first: int) -> None:
        """The pairs ``(points[i - 1], points[i])`` for ``i >= first`` were made (series in time order)."""

    def pairs_dropped(self, name: str, key: tuple, points: Points, count: int) -> None:
        """The pairs ``(points[i], points[i + 1])`` for ``i < count`` go (their first point leaves the window)."""

    def forget_before(self, t: float) -> None:
        """Drop every point before ``t``, and the series left empty."""
        for name, group in self.groups.items():
            for key in [key for key, points in group.items() if not self._kept_from(name, key, points, t)]:
                del group[key]

    def _kept_from(self, name: str, key: tuple, points: Points, t: float) -> Points:
        """``points`` without those before ``t``, in place."""
        if not self.in_time_order:
            points[:] = [p for p in points if p[0] >= t]
        elif points and points[0][0] < t:
            count = bisect_left(points, t, key=_time)
            self.pairs_dropped(name, key, points, count)
            del points[:count]
        return points

    def __len__(self) -> int:
        """The points held, over every group."""
        return sum(len(points) for group in self.groups.values() for points in group.values())
