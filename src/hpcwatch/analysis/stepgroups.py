"""A job's executed steps as groups of its spans, kept so that the spans of a later stretch join them.

Goodput reads a job's steps from its spans grouped in the store, one group per (incarnation, step):
``store.queries.job_step_groups``. A 1,536-rank job adds 9,000 spans a step; grouping every one of them again
for each job page grew with the job's age (0.1 s at 5 minutes, a second at an hour). A server keeps the groups
of the spans up to a time (``reports.goodput``, with ``reports.jobstretches.KeptStretches``) and groups only
the spans that started since; ``StepGroups.join`` adds them up:

- first start and last end: the earlier and the later; the blocking load: the shorter;
- the barrier waits: summed exactly, as integers of 1e-18 s (what DuckDB's ``DECIMAL(38, 18)`` sum holds),
  so that any split gives the one pass's sum to the last bit;
- the job's ranks: the union of each stretch's.

A step whose spans straddle the cut is one group in each stretch, joined here as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcwatch.analysis.goodput import StepTable

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["StepGroups", "WAIT_UNITS"]

#: The barrier waits' sum is kept in these units a second: DuckDB's ``DECIMAL(38, 18)`` of the store's sum.
WAIT_UNITS = 10**18


@dataclass(frozen=True, slots=True)
class StepGroups:
    """One row per (incarnation, step) of a job's spans, ordered by (incarnation, step), and the job's ranks."""

    incarnation: np.ndarray
    step: np.ndarray
    first_start: np.ndarray
    last_end: np.ndarray
    load_s: np.ndarray
    """The shortest ``load`` span; +inf without one."""
    wait: np.ndarray
    """Object array of Python ints: the ``barrier_wait`` spans' summed duration in 1/``WAIT_UNITS`` s."""
    ranks: np.ndarray
    """The job's distinct ranks, sorted."""

    @classmethod
    def empty(cls) -> StepGroups:
        no_int, no_float = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(no_int, no_int, no_float, no_float, no_float, np.zeros(0, dtype=object), no_int)

    @classmethod
    def of_rows(cls, groups: pa.Table, ranks: pa.Table) -> StepGroups:
        """From ``store.queries.job_step_groups``' two tables (any row order)."""
        n = groups.num_rows
        waits = groups.column("wait").to_pylist()
        found = cls(
            incarnation=_column(groups, "incarnation", np.int64, 0),
            step=_column(groups, "step", np.int64, 0),
            first_start=_column(groups, "first_start", np.float64, np.nan),
            last_end=_column(groups, "last_end", np.float64, np.nan),
            load_s=_column(groups, "load_s", np.float64, np.inf),
            wait=_objects([0 if w is None else _units(w) for w in waits], n),
            ranks=np.unique(np.asarray(ranks.column("rank").drop_null().to_numpy(), dtype=np.int64)),
        )
        return found.join(cls.empty())  # ordered, and one row per (incarnation, step)

    def __len__(self) -> int:
        return len(self.step)

    def join(self, later: StepGroups) -> StepGroups:
        """These groups and ``later``'s (spans that started after these), a step in both joined as one."""
        incarnation = np.concatenate([self.incarnation, later.incarnation])
        step = np.concatenate([self.step, later.step])
        order = np.lexsort((step, incarnation))
        incarnation, step = incarnation[order], step[order]
        changes = (incarnation[1:] != incarnation[:-1]) | (step[1:] != step[:-1])
        starts = np.flatnonzero(np.concatenate([[True], changes])) if len(step) else np.zeros(0, dtype=np.int64)

        def reduced(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray) -> np.ndarray:
            joined: np.ndarray = ufunc.reduceat(np.concatenate([a, b])[order], starts) if len(starts) else a[:0]
            return joined

        return StepGroups(
            incarnation=incarnation[starts],
            step=step[starts],
            first_start=reduced(np.fmin, self.first_start, later.first_start),
            last_end=reduced(np.fmax, self.last_end, later.last_end),
            load_s=reduced(np.minimum, self.load_s, later.load_s),
            wait=reduced(np.add, self.wait, later.wait),
            ranks=np.union1d(self.ranks, later.ranks),
        )

    def step_table(self) -> StepTable:
        """The executed steps in order of first start (then incarnation, step), as ``analysis.goodput`` reads
        them: a missing load or wait reads 0, the waits are the ranks' mean."""
        if not len(self):
            return StepTable.empty()
        order = np.lexsort((self.step, self.incarnation, self.first_start))
        ranks = len(self.ranks) or 1
        # int / int is correctly rounded: the sum's nearest float, whatever the split it was added up in.
        wait_s = np.array([int(w) / WAIT_UNITS for w in self.wait[order].tolist()], dtype=np.float64)
        first = self.first_start[order]
        return StepTable(
            step=self.step[order],
            start_s=first,
            dur_s=self.last_end[order] - first,
            load_s=np.where(np.isinf(self.load_s[order]), 0.0, self.load_s[order]),
            wait_s=wait_s / ranks,
        )


def _column(table: pa.Table, name: str, dtype: Any, null: float) -> np.ndarray:
    return np.asarray(table.column(name).fill_null(null).to_numpy(zero_copy_only=False), dtype=dtype)


def _units(total: Any) -> int:
    """A ``DECIMAL(38, 18)`` sum (a ``decimal.Decimal``) as an exact integer of 1/``WAIT_UNITS`` s."""
    numerator, denominator = total.as_integer_ratio()
    return int(numerator * WAIT_UNITS // denominator)


def _objects(values: list[int], n: int) -> np.ndarray:
    out = np.empty(n, dtype=object)
    out[:] = values
    return out
