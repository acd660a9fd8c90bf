"""What one stretch of samples says of each workload, kept so that stretches join into the whole report.

``analysis.attribution`` reduces a table of samples to a ``Partial``, then reports from it. A job's page or
``hpcwatch job ID`` reads the job's life stretch by stretch (``reports.jobstretches``): at 1,024 nodes a
1,536-GPU job adds 2,000 rows a second, and a day of them read at once is more than one server holds. Each
stretch is reduced to a ``Partial`` (a few numbers per job, GPU and series: bounded by the GPUs, not the
rows), and ``Partial.add`` joins the next stretch, later in sample time, to what came before:

- sums, counts and maxima add up or take the larger; first and last sample times the earlier and the later;
- a counter's delta across the edge of two stretches (energy, InfiniBand bytes) and a change of the "last
  XID" gauge there come from each series' ``Ends``: the earlier stretch's last sample and the later one's
  first, credited to the job of that first sample, as a single pass credits a delta to its later sample;
- a series' scrape interval (a GPU's observed time, the energy gap rule) is the median of its gaps, kept as
  a histogram of gaps in whole milliseconds: a scrape every second with 20 ms of jitter keeps ~40 entries,
  whatever the job's age::

      stretch A                       stretch B
      |  x    x    x    x  |          |  x    x    x  |
                       last(A) ------ first(B)      the edge: one gap, one delta, first(B)'s job's

Sums of measured values (utilisation, power, tensor activity, energy deltas) are kept ``Exact``: the correctly
rounded sum (``math.fsum``) and what rounding left out, so that joining stretches in any split gives the sum of
one pass to the last digit (a float sum depends on its order): ``hpcwatch job ID`` (by stretches) and
``hpcwatch jobs`` (one pass) print the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcwatch import vocab

__all__ = [
    "Acc",
    "Ends",
    "PortEnds",
    "Partial",
    "Shape",
    "CellKey",
    "SeriesKey",
    "Exact",
    "ZERO",
    "exact_plus",
    "exact_sums",
    "gap_ms",
    "median_gap_s",
]

#: (workload, host, device) of an accumulator; host and device as text ("None" for a row without one).
CellKey = tuple[str, str, str]
#: (metric, host, device) of a series.
SeriesKey = tuple[str, str, str]

UTIL, ENERGY, XID = vocab.DCGM_FI_DEV_GPU_UTIL, vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, vocab.DCGM_FI_DEV_XID_ERRORS
#: The series whose gaps are kept (observed time; the energy gap rule).
GAP_METRICS = (UTIL, ENERGY)


#: A sum kept as (its correctly rounded value, the rest): ``exact_plus`` of two is the rounded sum of all the
#: values behind them, whatever the order (up to one part in 2**106 of what rounding left out).
Exact = tuple[float, float]
ZERO: Exact = (0.0, 0.0)


def _fsum(terms: Iterable[float]) -> Exact:
    values = list(terms)
    try:
        total = math.fsum(values)
    except (ValueError, OverflowError):  # inf - inf, or an overflow on the way: what a float sum says
        return (float(sum(values)), 0.0)
    if not math.isfinite(total):
        return (total, 0.0)
    values.append(-total)
    return (total, math.fsum(values))


def exact_plus(a: Exact, b: Exact) -> Exact:
    a0, a1 = a
    b0, b1 = b
    if a1 == 0.0 and b1 == 0.0:
        # Two floats: their rounded sum and its exact error (Knuth's TwoSum) are what ``_fsum`` returns.
        total = a0 + b0
        if total - total == 0.0 and total != 0.0:  # finite, and no zero whose sign fsum would choose
            rest = total - a0
            return (total, (a0 - (total - rest)) + (b0 - rest))
    return _fsum((a0, a1, b0, b1))


def exact_sums(groups: np.ndarray, values: np.ndarray, n: int) -> list[Exact]:
    """Per group code (0 .. n-1), the ``Exact`` sum of its ``values``."""
    out = [ZERO] * n
    if not len(groups):
        return out
    order = np.argsort(groups, kind="stable")
    codes, ordered = groups[order], values[order].tolist()
    starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]])).tolist()
    for start, end, code in zip(starts, [*starts[1:], len(ordered)], codes[starts].tolist()):
        out[code] = _fsum(ordered[start:end])
    return out


def gap_ms(gap_s: float) -> int:
    """A gap between two samples in whole milliseconds (half to even, as numpy's ``rint``)."""
    return int(round(gap_s * 1000.0))


def median_gap_s(histogram: dict[int, int] | None) -> float:
    """The median of a series' gaps (the mean of the two middle ones for an even count), in seconds; 0 without
    gaps (a series of one sample)."""
    if not histogram:
        return 0.0
    n = sum(histogram.values())
    lo_rank, hi_rank = (n - 1) // 2, n // 2
    lo = hi = None
    seen = 0
    for gap in sorted(histogram):
        seen += histogram[gap]
        if lo is None and seen > lo_rank:
            lo = gap
        if seen > hi_rank:
            hi = gap
            break
    assert lo is not None and hi is not None
    return (lo + hi) / 2000.0


@dataclass(slots=True)
class Acc:
    """One (workload, host, device)'s sums over its samples."""

    util_sum: Exact = ZERO
    util_n: int = 0
    tensor_sum: Exact = ZERO
    tensor_n: int = 0
    power_sum: Exact = ZERO
    power_n: int = 0
    fb_max: float | None = None
    util_max: float | None = None
    xid: int = 0
    ib_tx: float = 0.0
    ib_rx: float = 0.0
    first_t: float | None = None
    last_t: float | None = None
    sources: set[str] = field(default_factory=set)
    profile: str | None = None
    energy_by_gap: dict[int, Exact] = field(default_factory=dict)
    """Energy deltas (mJ, each >= 0) summed by the gap (ms) they span: which count is only known once the
    series' median gap is (``MAX_COUNTER_GAP_INTERVALS`` of them at most)."""

    def add(self, other: Acc) -> None:
        """``other``'s samples, later in time, to these (``other`` unchanged)."""
        self.util_sum = exact_plus(self.util_sum, other.util_sum)
        self.util_n += other.util_n
        self.tensor_sum = exact_plus(self.tensor_sum, other.tensor_sum)
        self.tensor_n += other.tensor_n
        self.power_sum = exact_plus(self.power_sum, other.power_sum)
        self.power_n += other.power_n
        self.fb_max = _larger(self.fb_max, other.fb_max)
        self.util_max = _larger(self.util_max, other.util_max)
        self.xid += other.xid
        self.ib_tx += other.ib_tx
        self.ib_rx += other.ib_rx
        self.first_t = _smaller(self.first_t, other.first_t)
        self.last_t = _larger(self.last_t, other.last_t)
        self.sources |= other.sources
        if other.profile is not None and (self.profile is None or str(other.profile) < str(self.profile)):
            self.profile = other.profile
        for gap, delta in other.energy_by_gap.items():
            self.energy_by_gap[gap] = exact_plus(self.energy_by_gap.get(gap, ZERO), delta)

    @classmethod
    def total(cls, accs: Sequence[Acc]) -> Acc:
        """The sums of all ``accs`` in one pass per field (a 1,536-GPU job's total on its page: 1,536 ``add``
        calls were a tenth of the report): each field as adding them to an empty one in turn gives it, but each
        sum correctly rounded from all the parts at once (``add``'s joins two by two can lose the tiny rest of a
        sum that lies half a digit from the next float, and move it by a digit)."""
        out = cls()
        if not accs:
            return out
        out.util_sum = _fsum([x for a in accs for x in a.util_sum])
        out.tensor_sum = _fsum([x for a in accs for x in a.tensor_sum])
        out.power_sum = _fsum([x for a in accs for x in a.power_sum])
        out.util_n = sum(a.util_n for a in accs)
        out.tensor_n = sum(a.tensor_n for a in accs)
        out.power_n = sum(a.power_n for a in accs)
        out.fb_max = max((a.fb_max for a in accs if a.fb_max is not None), default=None)
        out.util_max = max((a.util_max for a in accs if a.util_max is not None), default=None)
        out.xid = sum(a.xid for a in accs)
        out.ib_tx = sum((a.ib_tx for a in accs), 0.0)  # in order, as ``add`` adds them
        out.ib_rx = sum((a.ib_rx for a in accs), 0.0)
        out.first_t = min((a.first_t for a in accs if a.first_t is not None), default=None)
        out.last_t = max((a.last_t for a in accs if a.last_t is not None), default=None)
        out.sources = set().union(*(a.sources for a in accs))
        out.profile = min((a.profile for a in accs if a.profile is not None), key=str, default=None)
        parts: dict[int, list[float]] = {}
        for a in accs:
            for gap, delta in a.energy_by_gap.items():
                parts.setdefault(gap, []).extend(delta)
        out.energy_by_gap = {gap: _fsum(values) for gap, values in parts.items()}
        return out

    def copy(self) -> Acc:
        """These sums, to add to without changing them (a kept checkpoint is joined to many pages): every field
        as it is, the two mutable ones copied. A loop over the slots: as fast as naming each field (1.1 us; a page
        copies one per GPU) where ``dataclasses.replace`` took 2.4, and a field added to ``Acc`` is copied too."""
        out = Acc.__new__(Acc)
        for name in Acc.__slots__:
            setattr(out, name, getattr(self, name))
        out.sources = set(self.sources)
        out.energy_by_gap = dict(self.energy_by_gap)
        return out


def _larger(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _smaller(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


@dataclass(frozen=True, slots=True)
class Ends:
    """A DCGM series' first and last sample in a stretch; ``first_cell`` the first one's (None: nobody's)."""

    first_t: float
    first_v: float
    first_cell: CellKey | None
    last_t: float
    last_v: float


@dataclass(frozen=True, slots=True)
class PortEnds:
    """An InfiniBand counter's first and last sample in a stretch, with the cells holding its rail's GPUs at
    the first one (who a delta ending there is shared among) and how many GPUs the rail has."""

    first_t: float
    first_v: float
    last_t: float
    last_v: float
    transmitted: bool
    rail_gpus: int
    first_cells: tuple[CellKey, ...]


@dataclass(frozen=True, slots=True)
class Shape:
    """The devices of a job's whole window that the report's rules read across time: which reported
    utilisation, and which engine activity (a device without GPU_UTIL in the window has its engine activity
    read as utilisation), and each host's InfiniBand HCAs (an HCA's rail is a share of its host's GPUs, by
    how many HCAs it has). Stretches read with the window's shape agree with one pass over it."""

    util: frozenset[tuple[Any, Any]]
    engine: frozenset[tuple[Any, Any]]
    hcas: frozenset[tuple[Any, Any]] = frozenset()
    """(host, HCA device) of every InfiniBand counter."""

    def to_plain(self) -> tuple[frozenset[tuple[Any, Any]], ...]:
        """This shape in builtins (``Partial.to_plain``); ``from_plain`` gives it back equal."""
        return (self.util, self.engine, self.hcas)

    @classmethod
    def from_plain(cls, plain: tuple[Any, Any, Any]) -> Shape:
        util, engine, hcas = plain
        return cls(frozenset(util), frozenset(engine), frozenset(hcas))

    def union(self, other: Shape) -> Shape:
        return Shape(self.util | other.util, self.engine | other.engine, self.hcas | other.hcas)

    def gpus_by_host(self) -> dict[Any, list[Any]]:
        """Each host's devices with utilisation, engine-activity-only ones included (they read as utilisation)."""
        out: dict[Any, list[Any]] = {}
        for host, device in sorted(self.util | self.engine, key=str):
            if device is not None:
                out.setdefault(host, []).append(device)
        return out

    def hca_count(self) -> dict[Any, int]:
        """How many HCAs each host has."""
        out: dict[Any, int] = {}
        for host, _ in self.hcas:
            out[host] = out.get(host, 0) + 1
        return out


@dataclass(slots=True)
class Partial:
    """What one stretch of samples (or several, joined in time order) says; ``add`` joins a later one."""

    cells: dict[CellKey, Acc] = field(default_factory=dict)
    gaps: dict[SeriesKey, dict[int, int]] = field(default_factory=dict)
    """Per utilisation and energy series, how many of its gaps were how many ms."""
    ends: dict[SeriesKey, Ends] = field(default_factory=dict)
    """Per utilisation, energy and XID series."""
    ports: dict[SeriesKey, PortEnds] = field(default_factory=dict)
    lustre: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(metric, jobid, target) -> the largest cumulative byte count seen."""
    slurm_last: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    """(job, metric) -> (t, value) of Slurm's newest figure."""
    max_rss: dict[str, dict[str, int]] = field(default_factory=dict)
    """job -> node -> the largest MaxRSS."""
    newest_t: float | None = None
    shapes: set[Shape] = field(default_factory=set)
    """The ``Shape`` each stretch was read with: one, when the stretches agree with one pass."""

    def add(self, later: Partial) -> None:
        """Join ``later`` (its samples all after these) to this one; ``later`` is left unchanged (a kept
        stretch is joined to many pages)."""
        for key, acc in later.cells.items():
            mine = self.cells.get(key)
            if mine is None:
                self.cells[key] = acc.copy()
            else:
                mine.add(acc)
        for key, histogram in later.gaps.items():
            self._count_gaps(key, histogram)
        for key, ends in later.ends.items():
            before = self.ends.get(key)
            if before is not None:
                self._join(key, before, ends)
            self.ends[key] = ends if before is None else _spanning(before, ends)
        for key, port in later.ports.items():
            earlier = self.ports.get(key)
            if earlier is not None:
                self._join_port(earlier, port)
                port = PortEnds(
                    earlier.first_t,
                    earlier.first_v,
                    port.last_t,
                    port.last_v,
                    earlier.transmitted,
                    earlier.rail_gpus,
                    earlier.first_cells,
                )
            self.ports[key] = port
        for key, v in later.lustre.items():
            self.lustre[key] = max(self.lustre.get(key, 0.0), v)
        for job_metric, (t, v) in later.slurm_last.items():
            if job_metric not in self.slurm_last or t >= self.slurm_last[job_metric][0]:
                self.slurm_last[job_metric] = (t, v)
        for job, per_node in later.max_rss.items():
            mine_rss = self.max_rss.setdefault(job, {})
            for node, rss in per_node.items():
                mine_rss[node] = max(mine_rss.get(node, 0), rss)
        self.shapes |= later.shapes
        if later.newest_t is not None:
            self.newest_t = later.newest_t if self.newest_t is None else max(self.newest_t, later.newest_t)

    def copy(self) -> Partial:
        """This partial, to join later stretches to without changing it (its ends are immutable: shared)."""
        return Partial(
            cells={key: acc.copy() for key, acc in self.cells.items()},
            gaps={key: dict(histogram) for key, histogram in self.gaps.items()},
            ends=dict(self.ends),
            ports=dict(self.ports),
            lustre=dict(self.lustre),
            slurm_last=dict(self.slurm_last),
            max_rss={job: dict(per_node) for job, per_node in self.max_rss.items()},
            newest_t=self.newest_t,
            shapes=set(self.shapes),
        )

    def to_plain(self) -> dict[str, Any]:
        """This partial in builtins (and nothing else: what a restricted unpickler reads back), for a server to
        write a job's checkpoint to disk (``reports.checkpointfiles``); ``from_plain`` gives it back equal. The
        cells, ends and ports as one list per field, so that pickling them is a pass in C, not a call per
        object (1,536 GPUs: 11 ms where the objects took 85), and a field added to ``Acc``, ``Ends`` or
        ``PortEnds`` goes with them."""
        return {
            "cells": _columns(self.cells, Acc),
            "gaps": self.gaps,
            "ends": _columns(self.ends, Ends),
            "ports": _columns(self.ports, PortEnds),
            "lustre": self.lustre,
            "slurm_last": self.slurm_last,
            "max_rss": self.max_rss,
            "newest_t": self.newest_t,
            "shapes": [shape.to_plain() for shape in self.shapes],
        }

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Partial:
        """The partial ``to_plain`` wrote. ``ValueError`` when ``plain`` is not what it writes (another
        version's fields, lists of unequal lengths)."""
        try:
            return cls(
                cells=_objects(plain["cells"], Acc),
                gaps=dict(plain["gaps"]),
                ends=_objects(plain["ends"], Ends),
                ports=_objects(plain["ports"], PortEnds),
                lustre=dict(plain["lustre"]),
                slurm_last=dict(plain["slurm_last"]),
                max_rss=dict(plain["max_rss"]),
                newest_t=plain["newest_t"],
                shapes={Shape.from_plain(shape) for shape in plain["shapes"]},
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a partial's plain form: {type(err).__name__}: {err}") from err

    def _count_gaps(self, key: SeriesKey, histogram: dict[int, int]) -> None:
        mine = self.gaps.setdefault(key, {})
        for gap, n in histogram.items():
            mine[gap] = mine.get(gap, 0) + n

    def _join(self, key: SeriesKey, before: Ends, after: Ends) -> None:
        """The edge between a series' last sample in one stretch and its first in the next: one more gap, the
        energy delta across it, and an XID gauge that kept its value (``after`` counted it as new)."""
        metric = key[0]
        gap = gap_ms(after.first_t - before.last_t)
        if metric in GAP_METRICS:
            self._count_gaps(key, {gap: 1})
        cell = self.cells.get(after.first_cell) if after.first_cell is not None else None
        if cell is None:
            return
        if metric == ENERGY:
            delta = after.first_v - before.last_v
            if delta >= 0:
                cell.energy_by_gap[gap] = exact_plus(cell.energy_by_gap.get(gap, ZERO), (delta, 0.0))
        elif metric == XID and after.first_v != 0 and after.first_v == before.last_v:
            cell.xid -= 1

    def _join_port(self, before: PortEnds, after: PortEnds) -> None:
        """The InfiniBand delta across the edge, shared equally over the GPUs of the port's rail, each share to
        the job holding that GPU then (a counter reset, a negative delta, is skipped)."""
        delta = after.first_v - before.last_v
        if delta < 0 or not after.rail_gpus:
            return
        share = float(delta // after.rail_gpus)
        for key in after.first_cells:
            cell = self.cells.setdefault(key, Acc())
            if after.transmitted:
                cell.ib_tx += share
            else:
                cell.ib_rx += share


def _columns(objects: dict[Any, Any], cls: Any) -> tuple[list[Any], dict[str, list[Any]]]:
    """(the keys, per field of ``cls``'s slots the values' field in the keys' order)."""
    values = objects.values()
    return list(objects), {name: [getattr(v, name) for v in values] for name in cls.__slots__}


def _objects(columns: tuple[list[Any], dict[str, list[Any]]], cls: Any) -> dict[Any, Any]:
    """``_columns``' objects again, made without ``__init__`` (each field set as ``_columns`` read it)."""
    keys, fields = columns
    names = cls.__slots__
    if set(fields) != set(names) or any(len(fields[name]) != len(keys) for name in names):
        raise ValueError(f"not {cls.__name__}'s fields: {sorted(fields)}")
    out = {}
    setter = object.__setattr__  # the frozen ones' too
    for key, values in zip(keys, zip(*(fields[name] for name in names))):
        obj = cls.__new__(cls)
        for name, value in zip(names, values):
            setter(obj, name, value)
        out[key] = obj
    return out


def _spanning(before: Ends, after: Ends) -> Ends:
    return Ends(before.first_t, before.first_v, before.first_cell, after.last_t, after.last_v)
