"""A detector's samples grouped by series, kept over a sliding window between the scans of a live scan.

A detector that compares a series' points (counter rises, rates between scrapes, memory left after a job)
first groups its samples by series. Over a live scan's five-minute window at 1,024 nodes that is millions of
samples, grouped again every scan although all but the last few seconds were grouped the scan before: most of
a scan's time. A ``SeriesGroups`` holds the grouping: a live scan adds only the samples that arrived and
forgets the points that left the window; ``hpcwatch scan`` makes one from all its samples, once.

Each group maps a series key to its points, tuples whose first item is the time, in the order they were
added. ``forget_before`` drops the points before a time, as the flat window it replaces dropped its samples:
by slicing each series while every series was added in time order (what collectors and the twin do), by
looking at every point otherwise.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from operator import itemgetter
from typing import Self

from hpcwatch.records import Sample

__all__ = ["SeriesGroups"]

Points = list[tuple]
_time = itemgetter(0)


class SeriesGroups:
    """Named groups of series (``key -> points``); subclasses say how a sample is grouped (``add``)."""

    def __init__(self, *names: str) -> None:
        self.groups: dict[str, defaultdict[tuple, Points]] = {name: defaultdict(list) for name in names}
        self.in_time_order = True
        """False once a point came before its series' last one: ``forget_before`` then looks at every point."""

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Self:
        """A grouping of ``samples``, made at once (what a one-off scan reads)."""
        series = cls()
        series.add(samples)
        return series

    def add(self, samples: Iterable[Sample]) -> None:
        raise NotImplementedError

    def append(self, points: Points, point: tuple) -> None:
        """Add ``point`` to a series' ``points`` (``groups[name][key]``), noting whether time still goes on."""
        if points and point[0] < points[-1][0]:
            self.in_time_order = False
        points.append(point)

    def forget_before(self, t: float) -> None:
        """Drop every point before ``t``, and the series left empty."""
        for group in self.groups.values():
            for key in [key for key, points in group.items() if not self._kept_from(points, t)]:
                del group[key]

    def _kept_from(self, points: Points, t: float) -> Points:
        """``points`` without those before ``t``, in place."""
        if not self.in_time_order:
            points[:] = [p for p in points if p[0] >= t]
        elif points and points[0][0] < t:
            del points[: bisect_left(points, t, key=_time)]
        return points

    def __len__(self) -> int:
        """The points held, over every group."""
        return sum(len(points) for group in self.groups.values() for points in group.values())
