"""What one stretch of samples says of each workload, kept so that stretches join into the whole report.

``analysis.attribution`` reduces a table of samples to a ``Partial``, then reports from it. A job's page or
``hpcwatch job ID`` reads the job's life stretch by stretch (``reports.jobstretches``): at 1,024 nodes a
1,536-GPU job adds 2,000 rows a second, and a day of them read at once is more than one server holds. Each
stretch is reduced to a ``Partial`` (a few numbers per job, GPU and series: bounded by the GPUs, not the
rows), and ``Partial.add`` joins the next stretch, later in sample time, to what came before:

- sums, counts and maxima add up or take the larger; first and last sample times the earlier and the later;
- a counter's delta across the edge of two stretches (energy, InfiniBand bytes) and a change of the "last
  XID" gauge there come from each series' ends (``SeriesEnds``, ``PortEnds``): the earlier stretch's last
  sample and the later one's first, credited to the job of that first sample, as a single pass credits a
  delta to its later sample;
- a series' scrape interval (a GPU's observed time, the energy gap rule) is the median of its gaps, kept as
  a histogram of gaps in whole milliseconds: a scrape every second with 20 ms of jitter keeps ~40 entries,
  whatever the job's age::

      stretch A                       stretch B
      |  x    x    x    x  |          |  x    x    x  |
                       last(A) ------ first(B)      the edge: one gap, one delta, first(B)'s job's

What is kept per GPU, series and port is kept as columns (``Keyed``: one array per field), so that a join is
a few operations per field, not a call per GPU: at 1,536 GPUs a page joins 1,536 cells, 4,600 series and 3,072
ports.

Sums of measured values (utilisation, power, tensor activity, energy deltas) are kept ``Exact``: the correctly
rounded sum (``math.fsum``) and what rounding left out, so that joining stretches in any split gives the sum of
one pass to the last digit (a float sum depends on its order): ``hpcwatch job ID`` (by stretches) and
``hpcwatch jobs`` (one pass) print the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from hpcwatch import vocab

__all__ = [
    "Acc",
    "Cells",
    "Keyed",
    "PortEnds",
    "Partial",
    "SeriesEnds",
    "Shape",
    "CellKey",
    "SeriesKey",
    "Exact",
    "ZERO",
    "energy_plus",
    "exact_plus",
    "exact_plus_rows",
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

    @classmethod
    def total(cls, accs: Sequence[Acc]) -> Acc:
        """The sums of all ``accs`` in one pass per field (a 1,536-GPU job's total on its page: 1,536 joins were a
        tenth of the report): each field as joining them to an empty one in turn gives it (``Cells.add``'s rules),
        but each sum correctly rounded from all the parts at once (joins two by two can lose the tiny rest of a
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
        out.ib_tx = sum((a.ib_tx for a in accs), 0.0)  # in order, as joins add them
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


_K = TypeVar("_K", bound="Keyed")
#: Empty values of ``Keyed``'s array fields: a float (NaN: none, for a maximum or a time), an integer.
_ZERO_F, _NONE_F, _ZERO_I = np.float64(0.0), np.float64(math.nan), np.int64(0)


class Keyed:
    """Rows under distinct keys, kept as columns: one numpy array per numeric field (its first axis the rows)
    and one list per other field. What a stretch holds per GPU, series or port (1,536 GPUs: 1,536 cells, 4,600
    series, 3,072 ports), so that joining two stretches is an operation per field, not a call per row.

    A list's items are never changed in place (a set, a dict, a tuple: replaced by a new one), so a copy shares
    them; its arrays are its own. Subclasses name their fields and each field's empty value (``EMPTY``)."""

    __slots__ = ("arrays", "index", "keys", "lists")

    #: Per field, its value in a row that holds nothing yet: an array's as a numpy scalar of the array's dtype
    #: (a pair's row is that number twice), a list's as the callable that makes it.
    EMPTY: ClassVar[dict[str, Any]] = {}
    #: The fields that are lists (the others are arrays).
    LISTS: ClassVar[tuple[str, ...]] = ()
    #: The array fields of two columns per row (``Exact`` sums: value, rest).
    PAIRS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, keys: list[Any], arrays: dict[str, np.ndarray], lists: dict[str, list[Any]]) -> None:
        """Rows ``keys`` (distinct) with those columns, taken as they are (``of`` for keys that may repeat)."""
        self.keys = keys
        self.index = {key: row for row, key in enumerate(keys)}
        self.arrays = arrays
        self.lists = lists

    @classmethod
    def empty(cls: type[_K]) -> _K:
        return cls.of([], {}, {})

    @classmethod
    def of(cls: type[_K], keys: list[Any], arrays: dict[str, Any], lists: dict[str, list[Any]]) -> _K:
        """Rows from columns in ``keys``' order; a field not given holds its empty value. A key given twice is one
        row, where the key first came, with the values it came with last (as a dict assigned row by row keeps)."""
        rows = {key: row for row, key in enumerate(keys)}
        taken = None if len(rows) == len(keys) else np.fromiter(rows.values(), dtype=np.int64, count=len(rows))
        n = len(rows)
        out_arrays, out_lists = {}, {}
        for name, empty in cls.EMPTY.items():
            if name in cls.LISTS:
                values = lists[name] if name in lists else [empty() for _ in range(len(keys))]
                out_lists[name] = list(values) if taken is None else [values[i] for i in taken.tolist()]
            else:
                shape = (n, 2) if name in cls.PAIRS else (n,)
                given = arrays.get(name)
                if given is None:
                    out_arrays[name] = np.full(shape, empty)
                else:
                    column = np.asarray(given, dtype=empty.dtype)
                    out_arrays[name] = (column if taken is None else column[taken]).reshape(shape)
        return cls(list(rows), out_arrays, out_lists)

    def __len__(self) -> int:
        return len(self.keys)

    def rows_of(self, keys: Sequence[Any]) -> np.ndarray:
        """Each key's row, -1 for a key not here."""
        get = self.index.get
        return np.fromiter((get(key, -1) for key in keys), dtype=np.int64, count=len(keys))

    def rows_adding(self, keys: Sequence[Any]) -> np.ndarray:
        """Each key's row, a row that holds nothing added for a key not here (in the order they first come)."""
        rows = self.rows_of(keys)
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            new = list(dict.fromkeys(keys[i] for i in missing.tolist()))
            self.append(type(self).of(new, {}, {}), np.arange(len(new)))
            rows[missing] = self.rows_of([keys[i] for i in missing.tolist()])
        return rows

    def append(self, other: Keyed, rows: np.ndarray) -> None:
        """``other``'s ``rows`` (keys not here) after these."""
        if not rows.size:
            return
        taken = rows.tolist()
        for key in (other.keys[i] for i in taken):
            self.index[key] = len(self.keys)
            self.keys.append(key)
        for name, column in self.arrays.items():
            self.arrays[name] = np.concatenate([column, other.arrays[name][rows]])
        for name, values in self.lists.items():
            values.extend(other.lists[name][i] for i in taken)

    def keep_rows(self, kept: np.ndarray) -> None:
        """Only the rows where ``kept`` (a boolean a row) is true, in their order."""
        rows = np.flatnonzero(kept)
        if rows.size == len(self.keys):
            return
        taken = rows.tolist()
        self.keys = [self.keys[i] for i in taken]
        self.index = {key: row for row, key in enumerate(self.keys)}
        self.arrays = {name: column[rows] for name, column in self.arrays.items()}
        self.lists = {name: [values[i] for i in taken] for name, values in self.lists.items()}

    def copy(self: _K) -> _K:
        """These rows, to change without changing them: arrays copied, lists' items shared (never changed in
        place)."""
        out = type(self).__new__(type(self))
        out.keys, out.index = list(self.keys), dict(self.index)
        out.arrays = {name: column.copy() for name, column in self.arrays.items()}
        out.lists = {name: list(values) for name, values in self.lists.items()}
        return out

    def to_plain(self) -> tuple[list[Any], dict[str, Any]]:
        """(the keys, per field its column): builtins and numpy arrays, for ``Partial.to_plain``."""
        return list(self.keys), {**self.arrays, **self.lists}

    @classmethod
    def from_plain(cls: type[_K], plain: tuple[list[Any], dict[str, Any]]) -> _K:
        """What ``to_plain`` wrote. ``ValueError`` when it is not: other fields, columns of other lengths."""
        keys, fields = plain
        keys = list(keys)
        if set(fields) != set(cls.EMPTY):
            raise ValueError(f"not {cls.__name__}'s fields: {sorted(fields)}")
        if len(set(keys)) != len(keys) or any(len(fields[name]) != len(keys) for name in cls.EMPTY):
            raise ValueError(f"not {cls.__name__}'s columns: {len(keys)} keys")
        # the arrays copied: a file's are read-only views of its bytes, and a partial's arrays are its own
        arrays = {name: np.array(fields[name]) for name in cls.EMPTY if name not in cls.LISTS}
        return cls.of(keys, arrays, {name: list(fields[name]) for name in cls.LISTS})


class Cells(Keyed):
    """Per (workload, host, device), its sums over its samples: the columns of ``Acc``'s fields (NaN for a
    maximum or time of none); ``items`` gives each row as an ``Acc`` (the report reads them so)."""

    __slots__ = ()

    EMPTY: ClassVar[dict[str, Any]] = {
        "util_sum": _ZERO_F, "util_n": _ZERO_I, "tensor_sum": _ZERO_F, "tensor_n": _ZERO_I, "power_sum": _ZERO_F,
        "power_n": _ZERO_I, "fb_max": _NONE_F, "util_max": _NONE_F, "xid": _ZERO_I, "ib_tx": _ZERO_F,
        "ib_rx": _ZERO_F, "first_t": _NONE_F, "last_t": _NONE_F,
        "sources": frozenset, "profile": lambda: None, "energy_by_gap": dict,
    }  # fmt: skip
    LISTS = ("sources", "profile", "energy_by_gap")
    PAIRS = ("util_sum", "tensor_sum", "power_sum")
    #: How each array field joins a later one: a pair (a sum) exactly, a count or amount added, the larger or
    #: the smaller (NaN: none); sets united, the profile that sorts first as text, energy summed by gap.
    ADDED = ("util_n", "tensor_n", "power_n", "xid", "ib_tx", "ib_rx")
    LARGER, SMALLER = ("fb_max", "util_max", "last_t"), ("first_t",)

    def add(self, later: Cells) -> None:
        """``later``'s samples, after these, joined row by row as the field rules above say (``later`` unchanged)."""
        rows = self.rows_of(later.keys)
        theirs = np.flatnonzero(rows >= 0)
        mine = rows[theirs]
        a, b = self.arrays, later.arrays
        for name in self.PAIRS:
            a[name][mine] = exact_plus_rows(a[name][mine], b[name][theirs])
        for name in self.ADDED:
            a[name][mine] += b[name][theirs]
        for name in self.LARGER:
            a[name][mine] = np.fmax(a[name][mine], b[name][theirs])
        for name in self.SMALLER:
            a[name][mine] = np.fmin(a[name][mine], b[name][theirs])
        sources, profiles, energy = (self.lists[name] for name in self.LISTS)
        later_sources, later_profiles, later_energy = (later.lists[name] for name in self.LISTS)
        for i, j in zip(mine.tolist(), theirs.tolist()):
            if later_sources[j] and not later_sources[j] <= sources[i]:
                sources[i] = sources[i] | later_sources[j]
            profile = later_profiles[j]
            if profile is not None and (profiles[i] is None or str(profile) < str(profiles[i])):
                profiles[i] = profile
            if later_energy[j]:
                energy[i] = energy_plus(energy[i], later_energy[j])
        self.append(later, np.flatnonzero(rows < 0))

    def credit_ib(self, keys: Sequence[CellKey], amounts: np.ndarray, transmitted: np.ndarray) -> None:
        """Add each of ``amounts``, in order, to its cell's (``keys``) transmitted or received bytes; a cell not
        here is added."""
        rows = self.rows_adding(keys)
        np.add.at(self.arrays["ib_tx"], rows[transmitted], amounts[transmitted])
        np.add.at(self.arrays["ib_rx"], rows[~transmitted], amounts[~transmitted])

    def items(self) -> list[tuple[CellKey, Acc]]:
        """Every row's key and ``Acc`` (its set and dict copies)."""
        columns = {name: column.tolist() for name, column in self.arrays.items()}
        for name in (*self.LARGER, *self.SMALLER):
            columns[name] = [None if v != v else v for v in columns[name]]  # NaN: none
        for name in self.PAIRS:
            columns[name] = [tuple(pair) for pair in columns[name]]
        columns["sources"] = [set(s) for s in self.lists["sources"]]
        columns["profile"] = self.lists["profile"]
        columns["energy_by_gap"] = [dict(e) for e in self.lists["energy_by_gap"]]
        names = Acc.__slots__
        out = []
        for key, values in zip(self.keys, zip(*(columns[name] for name in names))):
            acc = Acc.__new__(Acc)
            for name, value in zip(names, values):
                setattr(acc, name, value)
            out.append((key, acc))
        return out


class _Ends(Keyed):
    """A first and a last sample per key (``SeriesEnds``, ``PortEnds``), where two stretches are joined."""

    __slots__ = ()

    def edges(self, later: Keyed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each of ``later``'s keys' row here, -1 where it has none; ``later``'s rows whose key has one; and
        those keys' rows here)."""
        rows = self.rows_of(later.keys)
        theirs = np.flatnonzero(rows >= 0)
        return rows, theirs, rows[theirs]

    def extend(self, later: Keyed, rows: np.ndarray) -> None:
        """Each key's last sample ``later``'s where ``later`` has one (``rows``: ``edges``'), its other keys added."""
        theirs = np.flatnonzero(rows >= 0)
        for name in ("last_t", "last_v"):
            self.arrays[name][rows[theirs]] = later.arrays[name][theirs]
        self.append(later, np.flatnonzero(rows < 0))


class SeriesEnds(_Ends):
    """Per DCGM series (utilisation, energy, XID), its first and last sample in the stretches; ``first_cell``
    the cell of the first (None: nobody's). ``Partial.add`` joins two stretches at them."""

    __slots__ = ()

    EMPTY: ClassVar[dict[str, Any]] = {
        "first_t": _NONE_F, "first_v": _NONE_F, "last_t": _NONE_F, "last_v": _NONE_F, "first_cell": lambda: None,
    }  # fmt: skip
    LISTS = ("first_cell",)


class PortEnds(_Ends):
    """Per InfiniBand counter, its first and last sample in the stretches, whether it counts transmitted bytes,
    how many GPUs its rail has, and the cells holding them at its first sample (who a delta ending there is
    shared among)."""

    __slots__ = ()

    EMPTY: ClassVar[dict[str, Any]] = {
        "first_t": _NONE_F, "first_v": _NONE_F, "last_t": _NONE_F, "last_v": _NONE_F,
        "transmitted": np.bool_(False), "rail_gpus": _ZERO_I, "first_cells": tuple,
    }  # fmt: skip
    LISTS = ("first_cells",)


def exact_plus_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``exact_plus`` of each row of two (n, 2) arrays of ``Exact`` sums: the two-float case at once, the
    others (a rest to carry) one by one."""
    a0, a1, b0, b1 = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
    with np.errstate(all="ignore"):
        total = a0 + b0
        rest = total - a0
        error = (a0 - (total - rest)) + (b0 - rest)
        quick = (a1 == 0.0) & (b1 == 0.0) & (total - total == 0.0) & (total != 0.0)
    out = np.stack([total, np.where(quick, error, 0.0)], axis=1)
    for i in np.flatnonzero(~quick).tolist():
        out[i] = _fsum((float(a0[i]), float(a1[i]), float(b0[i]), float(b1[i])))
    return out


def energy_plus(earlier: dict[int, Exact], later: dict[int, Exact]) -> dict[int, Exact]:
    """A new dict of energy deltas by gap: both's, summed."""
    out = dict(earlier)
    for gap, delta in later.items():
        out[gap] = exact_plus(out.get(gap, ZERO), delta)
    return out


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

    cells: Cells = field(default_factory=Cells.empty)
    gaps: dict[SeriesKey, dict[int, int]] = field(default_factory=dict)
    """Per utilisation and energy series, how many of its gaps were how many ms."""
    ends: SeriesEnds = field(default_factory=SeriesEnds.empty)
    """Per utilisation, energy and XID series."""
    ports: PortEnds = field(default_factory=PortEnds.empty)
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
        self.cells.add(later.cells)
        for key, histogram in later.gaps.items():
            self._count_gaps(key, histogram)
        self._join_ends(later.ends)
        self._join_ports(later.ports)
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

    def workloads(self) -> set[str]:
        """Every workload this partial speaks of: in its cells, its Lustre bytes, its Slurm figures."""
        return (
            {key[0] for key in self.cells.keys}
            | {jobid for _, jobid, _ in self.lustre}
            | {job for job, _ in self.slurm_last}
            | set(self.max_rss)
        )

    def last_seen(self, workloads: AbstractSet[str]) -> dict[str, float]:
        """Each of ``workloads``' newest sample in the cells (one with none: absent)."""
        out: dict[str, float] = {}
        for key, t in zip(self.cells.keys, self.cells.arrays["last_t"].tolist()):
            if key[0] in workloads and t == t and t > out.get(key[0], -math.inf):  # NaN: none
                out[key[0]] = t
        return out

    def drop_workloads(self, workloads: AbstractSet[str]) -> None:
        """Forget what this partial says of ``workloads`` (a reader that reports recent jobs only keeps no more,
        ``reports.storestretches``). The series' and ports' ends stay: the next stretch joins at them."""
        if not workloads:
            return
        keys = self.cells.keys
        self.cells.keep_rows(np.fromiter((key[0] not in workloads for key in keys), dtype=bool, count=len(keys)))
        self.lustre = {key: v for key, v in self.lustre.items() if key[1] not in workloads}
        self.slurm_last = {key: v for key, v in self.slurm_last.items() if key[0] not in workloads}
        self.max_rss = {job: rss for job, rss in self.max_rss.items() if job not in workloads}

    def copy(self) -> Partial:
        """This partial, to join later stretches to without changing it."""
        return Partial(
            cells=self.cells.copy(),
            gaps={key: dict(histogram) for key, histogram in self.gaps.items()},
            ends=self.ends.copy(),
            ports=self.ports.copy(),
            lustre=dict(self.lustre),
            slurm_last=dict(self.slurm_last),
            max_rss={job: dict(per_node) for job, per_node in self.max_rss.items()},
            newest_t=self.newest_t,
            shapes=set(self.shapes),
        )

    def to_plain(self) -> dict[str, Any]:
        """This partial in builtins and numpy arrays (and nothing else: what a restricted unpickler reads back),
        for a server to write a job's checkpoint to disk (``reports.checkpointfiles``); ``from_plain`` gives it
        back equal. The cells, ends and ports as their columns: pickling them is a pass in C, not a call per
        object (1,536 GPUs: 11 ms where objects took 85)."""
        return {
            "cells": self.cells.to_plain(),
            "gaps": self.gaps,
            "ends": self.ends.to_plain(),
            "ports": self.ports.to_plain(),
            "lustre": self.lustre,
            "slurm_last": self.slurm_last,
            "max_rss": self.max_rss,
            "newest_t": self.newest_t,
            "shapes": [shape.to_plain() for shape in self.shapes],
        }

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Partial:
        """The partial ``to_plain`` wrote. ``ValueError`` when ``plain`` is not what it writes (another
        version's fields, columns of unequal lengths)."""
        try:
            return cls(
                cells=Cells.from_plain(plain["cells"]),
                gaps=dict(plain["gaps"]),
                ends=SeriesEnds.from_plain(plain["ends"]),
                ports=PortEnds.from_plain(plain["ports"]),
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

    def _join_ends(self, later: SeriesEnds) -> None:
        """The edge between each series' last sample here and its first in ``later``: one more gap, the energy
        delta across it, and an XID gauge that kept its value (``later`` counted it as new); then each series'
        last sample is ``later``'s."""
        rows, theirs, at = self.ends.edges(later)
        before, after = self.ends.arrays, later.arrays
        gaps = np.rint((after["first_t"][theirs] - before["last_t"][at]) * 1000.0).astype(np.int64)  # ``gap_ms``
        firsts, lasts = after["first_v"][theirs].tolist(), before["last_v"][at].tolist()
        cell_rows = self.cells.index
        first_cells = later.lists["first_cell"]
        energy, xid = self.cells.lists["energy_by_gap"], self.cells.arrays["xid"]
        for j, gap, first, last in zip(theirs.tolist(), gaps.tolist(), firsts, lasts):
            key = later.keys[j]
            metric = key[0]
            if metric in GAP_METRICS:
                self._count_gaps(key, {gap: 1})
            cell = cell_rows.get(first_cells[j]) if first_cells[j] is not None else None
            if cell is None:
                continue
            if metric == ENERGY:
                delta = first - last
                if delta >= 0:
                    energy[cell] = energy_plus(energy[cell], {gap: (delta, 0.0)})
            elif metric == XID and first != 0 and first == last:
                xid[cell] -= 1
        self.ends.extend(later, rows)

    def _join_ports(self, later: PortEnds) -> None:
        """The InfiniBand delta across each port's edge, shared equally over the GPUs of the port's rail, each
        share to the job holding that GPU then (a counter reset, a negative delta, is skipped); then each port's
        last sample is ``later``'s."""
        rows, theirs, at = self.ports.edges(later)
        before, after = self.ports.arrays, later.arrays
        delta = after["first_v"][theirs] - before["last_v"][at]
        rail = after["rail_gpus"][theirs]
        shared = ~(delta < 0) & (rail > 0)
        shares = np.floor_divide(delta[shared], rail[shared]).tolist()  # as Python's float // int
        transmitted = after["transmitted"][theirs][shared].tolist()
        first_cells = later.lists["first_cells"]
        keys, amounts, tx = [], [], []
        for j, share, sent in zip(theirs[shared].tolist(), shares, transmitted):
            for key in first_cells[j]:
                keys.append(key)
                amounts.append(share)
                tx.append(sent)
        if keys:
            self.cells.credit_ib(keys, np.array(amounts, dtype=np.float64), np.array(tx, dtype=bool))
        self.ports.extend(later, rows)
