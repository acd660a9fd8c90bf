"""Goodput: how much of a training job's wall time moved the model forward, and where the rest went.

A large synchronous job loses time to many small things and a few large ones:
start-up, data loading that makes every rank wait, checkpoint saves, restores
after a failure, the steps computed since the last checkpoint (lost when a GPU
dies) and the time to get going again (requeue + restart). The categories follow
Google's ml-goodput-measurement ``BadputType`` (program start-up, data loading,
checkpoint save, checkpoint restore, wasted progress from disruption, other),
https://github.com/AI-Hypercomputer/ml-goodput-measurement (goodput_utils.py).

One job, one failure, drawn on its wall clock::

    t0        first step           save     failure   requeue+restart  restore  steps again     t1
    |--init---|==s1==|==s2==|==s3==|-ckpt-|==s4==|==s5=X ......recovery...... |-rst-|==s4==|==s5==|...|
              productive (minus the load that blocked each step)  lost_progress      recovery

Steps after the last *completed* save before a failure are lost (``lost_progress``),
with the partial step in flight; the time from the failure to the next step,
less the restore, is ``recovery``; the start of the first incarnation is
``init``; what is left (gaps, the tail after the last step) is ``other``.
Productive time is the kept steps' duration less their blocking data load.

Inputs are the store's records, through one code path whether they come from
a real cluster or from the failure twin (``hpcwatch.analysis.goodputsim``):

- ``Job`` (start, end): the wall-clock window; a requeued Slurm job keeps its id.
- steps: a ``StepTable`` built from ``Span`` records (``steps_from_spans``) or
  from ``train_step_time_s`` samples (``steps_from_step_samples``).
- ``Event`` kinds ``checkpoint_save`` / ``checkpoint_restore`` (``t`` = when it
  began; attrs ``duration_s``, ``step``) and ``failure`` (attrs ``cause``, ``step``).

The ideal step time is the mean of the step times at or under median + 3·MAD, as
ml-goodput-measurement's ``compute_ideal_step_time`` does (goodput_utils.py); unlike
it we keep steps shorter than 1 s, because our reference model's step is 42 ms.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcwatch import vocab
from hpcwatch.records import Event, Job, Sample, Span
from hpcwatch.vocab import EventKind

__all__ = [
    "BADPUT_KINDS",
    "StepTable",
    "GoodputReport",
    "steps_from_spans",
    "steps_from_step_samples",
    "ideal_step_time",
    "account_goodput",
    "account_job",
    "account_job_steps",
    "job_step_table",
    "job_failure_breaks",
    "GOODPUT_EVENT_KINDS",
    "REQUEUE_AFTER_FAILURE_S",
    "GOODPUT_SOURCE",
]

GOODPUT_SOURCE = "https://github.com/AI-Hypercomputer/ml-goodput-measurement"

#: Badput categories, in timeline order.
BADPUT_KINDS: tuple[str, ...] = (
    "init",
    "data_loading",
    "checkpoint_save",
    "checkpoint_restore",
    "lost_progress",
    "recovery",
    "other",
)

#: Event kinds the accounting reads. ``checkpoint`` (a save seen from the storage side, as the twin's
#: Lustre writes are) counts as a save that stopped training ``duration_s`` (0 s when not given); its
#: step may be in ``step`` or in a ``path`` ending ``step_N.pt``.
GOODPUT_EVENT_KINDS: tuple[str, ...] = (
    EventKind.FAILURE,
    EventKind.CHECKPOINT_SAVE,
    EventKind.CHECKPOINT_RESTORE,
    EventKind.CHECKPOINT,
    EventKind.JOB_END,
)
#: A requeue this long after a failure event is that failure's, not a second interruption. Ours: Slurm
#: requeues a job whose node stopped answering after ``SlurmdTimeout`` (300 s by default,
#: https://slurm.schedmd.com/slurm.conf.html#OPT_SlurmdTimeout), and after its teardown when a rank died.
REQUEUE_AFTER_FAILURE_S = 600.0
_SAVE_KINDS = (EventKind.CHECKPOINT_SAVE, EventKind.CHECKPOINT)
_STEP_IN_PATH = re.compile(r"step[_-]?(\d+)")

#: Outlier cut for the ideal step time: median + MAD_CUT * MAD (ml-goodput-measurement uses 3).
MAD_CUT = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTable:
    """One row per executed step (a step re-run after a restart is a new row).

    Columns (numpy, same length): ``step`` (int64, the training step number),
    ``start_s`` (UTC s, first rank's start), ``dur_s`` (s, until the last rank
    finished), ``load_s`` (s, data loading that blocked every rank: the minimum
    over ranks of the ``load`` phase; 0 when unknown), ``wait_s`` (s, the ranks' mean ``barrier_wait``:
    how long the average GPU of the step sat waiting for the slowest rank; 0 when unknown).
    """

    step: np.ndarray
    start_s: np.ndarray
    dur_s: np.ndarray
    load_s: np.ndarray
    wait_s: np.ndarray | None = None
    """None (no barrier wait recorded, as for step-time samples) reads as zeros."""

    def __post_init__(self) -> None:
        n = len(self.step)
        if not (len(self.start_s) == len(self.dur_s) == len(self.load_s) == n):
            raise ValueError("StepTable columns must have the same length")
        if self.wait_s is not None and len(self.wait_s) != n:
            raise ValueError("StepTable columns must have the same length")

    @property
    def wait(self) -> np.ndarray:
        """``wait_s``, zeros when it was not recorded."""
        return self.wait_s if self.wait_s is not None else np.zeros(len(self.step))

    def __len__(self) -> int:
        return len(self.step)

    def first_start_of_last(self, steps: int) -> float | None:
        """The earliest start among the rows of the ``steps`` highest step numbers (every incarnation's): no span
        of those steps started before it (``store.queries.recent_span_table`` reads from there on). None
        without rows."""
        if not len(self.step):
            return None
        newest = np.unique(self.step)[-steps:]
        return float(np.min(self.start_s[np.isin(self.step, newest)]))

    @property
    def end_s(self) -> np.ndarray:
        end: np.ndarray = self.start_s + self.dur_s
        return end

    def sorted(self) -> StepTable:
        order = np.argsort(self.start_s, kind="stable")
        return StepTable(
            step=self.step[order],
            start_s=self.start_s[order],
            dur_s=self.dur_s[order],
            load_s=self.load_s[order],
            wait_s=None if self.wait_s is None else self.wait_s[order],
        )

    @staticmethod
    def empty() -> StepTable:
        z = np.zeros(0)
        return StepTable(step=np.zeros(0, dtype=np.int64), start_s=z, dur_s=z, load_s=z)


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputReport:
    """Where a job's wall time went. Every ``badput_s`` value and ``productive_s`` add up to ``total_s``."""

    job: str
    t0: float
    t1: float
    total_s: float
    productive_s: float
    badput_s: dict[str, float]
    ideal_step_s: float | None
    steps: int
    """Executed steps, re-runs included."""
    lost_steps: int
    interruptions: int
    interruptions_by_cause: dict[str, int]
    overlap_s: float = 0.0
    """Time counted twice by overlapping records (e.g. a save during a step); 0 for clean timelines."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    barrier_wait_s: float = 0.0
    """Of ``productive_s``, the part the average rank spent in ``barrier_wait`` (waiting for the slowest
    rank: a straggler's cost). Wall-clock goodput counts it as productive (the steps ran), as
    ml-goodput-measurement does; ``compute_goodput`` does not."""

    @property
    def goodput(self) -> float:
        """Productive wall time / wall time: the steps that moved the model forward, however slow."""
        return self.productive_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def compute_goodput(self) -> float:
        """(Productive wall time less the ranks' mean barrier wait) / wall time: the share of the GPUs'
        time that computed, which a straggler lowers where ``goodput`` does not see it."""
        return (self.productive_s - self.barrier_wait_s) / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        total = self.total_s or 1.0
        return {
            "job": self.job,
            "goodput": self.goodput,
            "compute_goodput": self.compute_goodput,
            "barrier_wait_s": float(self.barrier_wait_s),
            "badput": {k: float(v) / total for k, v in self.badput_s.items()},
            "badput_s": {k: float(v) for k, v in self.badput_s.items()},
            "productive_s": float(self.productive_s),
            "total_s": self.total_s,
            "t0": self.t0,
            "t1": self.t1,
            "ideal_step_s": self.ideal_step_s,
            "steps": self.steps,
            "lost_steps": self.lost_steps,
            "interruptions": self.interruptions,
            "interruptions_by_cause": dict(self.interruptions_by_cause),
            "overlap_s": self.overlap_s,
            "notes": list(self.notes),
        }


# -- building the step table -------------------------------------------------------------------


def steps_from_spans(spans: Iterable[Span], *, breaks: Sequence[float] = ()) -> StepTable:
    """Group a job's spans into executed steps.

    ``breaks`` are failure times: a step number seen again after a failure is a
    re-run, so spans are grouped by (incarnation, step).
    """
    rows = [(s.step, s.start, s.dur, s.phase == "load", s.phase == "barrier_wait", s.rank) for s in spans]
    if not rows:
        return StepTable.empty()
    step = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    start = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    dur = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
    is_load = np.fromiter((r[3] for r in rows), dtype=bool, count=len(rows))
    is_wait = np.fromiter((r[4] for r in rows), dtype=bool, count=len(rows))
    return _span_steps(step, start, dur, is_load, is_wait, len({r[5] for r in rows}), breaks)


def _span_steps(
    step: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    is_load: np.ndarray,
    is_wait: np.ndarray,
    ranks: int,
    breaks: Sequence[float],
) -> StepTable:
    table = _group_steps(step, start, start + dur, np.where(is_load, dur, np.inf), breaks, np.where(is_wait, dur, 0.0))
    if table.wait_s is None:
        return table
    return StepTable(
        step=table.step, start_s=table.start_s, dur_s=table.dur_s, load_s=table.load_s, wait_s=table.wait_s / ranks
    )


def steps_from_step_samples(samples: Iterable[Sample], *, breaks: Sequence[float] = ()) -> StepTable:
    """Steps from ``train_step_time_s`` samples (label ``step``); ``t`` is when the step ended.

    Data loading is unknown on this path and counted as 0.
    """
    rows = [(int(s.labels.get("step", -1)), s.t - s.value, s.t) for s in samples if s.metric == vocab.TRAIN_STEP_TIME_S]
    if not rows:
        return StepTable.empty()
    arr = np.array(rows, dtype=np.float64)
    return _group_steps(arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2], np.full(len(arr), np.inf), breaks)


def _group_steps(
    step: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    load: np.ndarray,
    breaks: Sequence[float],
    wait: np.ndarray | None = None,
) -> StepTable:
    """One row per (incarnation, step): first start, last end, smallest blocking load (inf = none), and the
    sum of ``wait`` (barrier wait seconds of each row; the caller divides by the ranks)."""
    incarnation = np.searchsorted(np.sort(np.asarray(breaks, dtype=np.float64)), start, side="right")
    # (incarnation, step) as one integer in the same order: numpy's unique over rows sorts structured
    # views, a third of the job page's goodput at 1,536 ranks.
    step = step.astype(np.int64)
    low = int(step.min()) if len(step) else 0
    width = int(step.max()) - low + 1 if len(step) else 1
    keys, inverse = np.unique(incarnation.astype(np.int64) * width + (step - low), return_inverse=True)
    inverse = inverse.reshape(-1)
    n = len(keys)
    first = np.full(n, np.inf)
    np.minimum.at(first, inverse, start)
    last = np.full(n, -np.inf)
    np.maximum.at(last, inverse, end)
    blocking = np.full(n, np.inf)
    np.minimum.at(blocking, inverse, load)
    blocking[~np.isfinite(blocking)] = 0.0
    waited = None
    if wait is not None:
        waited = np.zeros(n)
        np.add.at(waited, inverse, wait)
    return StepTable(
        step=keys % width + low, start_s=first, dur_s=last - first, load_s=blocking, wait_s=waited
    ).sorted()


def ideal_step_time(durations: np.ndarray) -> float | None:
    """Mean of step times <= median + 3·MAD (ml-goodput-measurement's ``compute_ideal_step_time``)."""
    d = np.asarray(durations, dtype=np.float64)
    if d.size == 0:
        return None
    med = float(np.median(d))
    mad = float(np.median(np.abs(d - med)))
    kept = d[d <= med + MAD_CUT * mad]
    return float(kept.mean()) if kept.size else None


# -- the accounting ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Op:
    """A checkpoint save or restore, clipped to the incarnation it happened in."""

    t: float
    dur_s: float
    step: int
    complete: bool
    incarnation: int


def _step_of(e: Event) -> int:
    if "step" in e.attrs:
        return int(e.attrs["step"])
    found = _STEP_IN_PATH.search(str(e.attrs.get("path", "")))
    return int(found.group(1)) if found else -1


def _ops(events: Sequence[Event], kinds: tuple[str, ...], failures: np.ndarray, t1: float) -> list[_Op]:
    mine = [e for e in events if e.kind in kinds]
    limits = np.minimum(np.concatenate([failures, [np.inf]]), t1).tolist()
    incarnations = np.searchsorted(failures, np.array([e.t for e in mine], dtype=np.float64), side="right").tolist()
    ops = []
    for e, k in zip(mine, incarnations):
        dur = float(e.attrs.get("duration_s", 0.0) or 0.0)
        limit = limits[k]
        end = min(e.t + dur, limit)
        ops.append(
            _Op(t=e.t, dur_s=max(0.0, end - e.t), step=_step_of(e), complete=e.t + dur <= limit + 1e-9, incarnation=k)
        )
    return ops


def _by_incarnation(ops: list[_Op], n: int) -> list[list[_Op]]:
    out: list[list[_Op]] = [[] for _ in range(n)]
    for op in ops:
        if op.incarnation < n:
            out[op.incarnation].append(op)
    return out


def _covered(steps: StepTable, x: np.ndarray) -> np.ndarray:
    """Total step time before each time in ``x`` (steps of one job do not overlap each other)."""
    cum = np.concatenate([[0.0], np.cumsum(steps.dur_s)])
    i = np.searchsorted(steps.start_s, x, side="right") - 1
    inside = np.clip(x - steps.start_s[np.maximum(i, 0)], 0.0, steps.dur_s[np.maximum(i, 0)])
    return np.where(i < 0, 0.0, cum[np.maximum(i, 0)] + inside)


def _window(
    job: Job | None, steps: StepTable, events: Sequence[Event], t0: float | None, t1: float | None
) -> tuple[float, float]:
    """The job's wall-clock window: the scheduler's start/end, widened to cover every record."""
    starts = [e.t for e in events] + ([float(steps.start_s.min())] if len(steps) else [])
    ends = [e.t + float(e.attrs.get("duration_s", 0.0) or 0.0) for e in events]
    ends += [float(steps.end_s.max())] if len(steps) else []
    if t0 is None:
        if job is not None and job.start is not None:
            starts.append(job.start)
        t0 = min(starts, default=0.0)
    if t1 is None:
        t1 = job.end if job is not None and job.end is not None else max(ends, default=t0)
    return float(t0), float(t1)


@dataclass(slots=True)
class _Tally:
    """Running totals of the accounting (seconds)."""

    badput: dict[str, float]
    productive: float = 0.0
    estimated_steps: int = 0
    notes: list[str] = field(default_factory=list)

    def steps_unrecorded(self, n: int, est_s: float, *, lost: bool, load_share: float) -> None:
        """Credit ``n`` steps we know ran (their numbers were skipped) but have no record of."""
        self.estimated_steps += n
        if lost:
            self.badput["lost_progress"] += est_s
        else:
            self.badput["data_loading"] += est_s * load_share
            self.productive += est_s * (1.0 - load_share)


def account_goodput(
    job: Job | None, steps: StepTable, events: Sequence[Event], *, t0: float | None = None, t1: float | None = None
) -> GoodputReport:
    """Split the job's wall time into productive time and the ``BADPUT_KINDS``.

    Steps missing from the records (step numbers that jump, as when only some
    steps are traced, or a collection that began mid-job) are credited at the
    ideal step time, taken from the time around them; a note says how many.
    Those numbered up to the last completed save before a failure are kept,
    the later ones lost, even when both sit in one gap (a job traced from
    mid-run whose last checkpoint came before the first trace).
    """
    steps = steps.sorted()
    t0, t1 = _window(job, steps, events, t0, t1)
    failures = np.sort(
        np.array([e.t for e in events if e.kind == EventKind.FAILURE and t0 <= e.t <= t1], dtype=np.float64)
    )
    saves = _ops(events, _SAVE_KINDS, failures, t1)
    restores = _ops(events, ("checkpoint_restore",), failures, t1)
    bounds = np.concatenate([[t0], failures, [t1]])
    n_inc = len(bounds) - 1
    # Steps are sorted by start, so each incarnation's steps are one slice.
    cuts = np.searchsorted(np.searchsorted(failures, steps.start_s, side="right"), np.arange(n_inc + 1), side="left")
    saves_by_k, restores_by_k = _by_incarnation(saves, n_inc), _by_incarnation(restores, n_inc)
    lost = np.zeros(len(steps), dtype=bool)
    tally = _Tally(badput=dict.fromkeys(BADPUT_KINDS, 0.0))
    ideal = ideal_step_time(steps.dur_s) or 0.0
    load_share = float(steps.load_s.sum() / steps.dur_s.sum()) if len(steps) and steps.dur_s.sum() > 0 else 0.0
    kept_step = 0
    keeps: list[_Keep] = []
    for k in range(n_inc):
        lo, hi = float(bounds[k]), float(bounds[k + 1])
        sl = slice(int(cuts[k]), int(cuts[k + 1]))
        k_saves, k_restores = saves_by_k[k], restores_by_k[k]
        kept_step = max([r.step for r in k_restores] + [kept_step])
        first_expected = kept_step + 1
        keep = _Keep()
        if k < len(failures):
            saved = [s.step for s in k_saves if s.complete]
            if not saved and cuts[k + 1] < cuts[k + 2]:
                kept_step = max(kept_step, _resumed_after(steps, int(cuts[k + 1]), tally, hi))
            kept_step = max(saved + [kept_step])
            lost[sl] = steps.step[sl] > kept_step
            keep = _Keep(
                step=kept_step,
                save=max((s for s in k_saves if s.complete and s.step == kept_step), key=lambda s: s.t, default=None),
            )
            if kept_step <= 0:
                tally.notes.append(
                    f"failure at t={hi:.0f}: no checkpoint seen before it, so every step since the start counts as lost"
                )
        keeps.append(keep)
        startup = _startup(steps, sl, lo, hi, k_restores, first_expected, ideal, tally, keep, load_share)
        tally.badput["init" if k == 0 else "recovery"] += startup
        if k < len(failures) and (sl.stop > sl.start or k_saves):
            # The step in flight when the failure hit, after the last thing we saw finish.
            ends = [lo] + ([float(steps.start_s[sl.stop - 1] + steps.dur_s[sl.stop - 1])] if sl.stop > sl.start else [])
            ends += [op.t + op.dur_s for op in k_saves + k_restores]
            tally.badput["lost_progress"] += max(0.0, hi - max(ends))
    _between_steps(steps, cuts, ideal, keeps, load_share, tally)
    return _finish(job, steps, events, failures, saves, restores, lost, tally, t0, t1)


def _resumed_after(steps: StepTable, first: int, tally: _Tally, failure_t: float) -> int:
    """With no save on record, the checkpoint a restart read is the step before the one it resumed at
    (``first``: the next incarnation's first step), as ml-goodput-measurement infers lost progress from
    step numbers run again."""
    resumed = int(steps.step[first]) - 1
    if resumed > 0:
        tally.notes.append(
            f"failure at t={failure_t:.0f}: no checkpoint on record; the restart resumed at step "
            f"{resumed + 1}, so steps up to {resumed} count as saved"
        )
    return resumed


@dataclass(frozen=True, slots=True)
class _Keep:
    """What a failure leaves of an incarnation: steps up to ``step`` (the last completed save, ``save``);
    the last incarnation, which no failure ends, keeps every step."""

    step: float = np.inf
    save: _Op | None = None

    def split(self, first: int, n: int, lo: float, hi: float, ideal: float) -> tuple[int, float, float]:
        """Unrecorded steps ``first .. first + n - 1`` that ran in ``[lo, hi]``: how many are kept, and the
        time credited to the kept ones and to the lost ones (at the ideal step time, capped by the room).

        Kept steps ran first. When the gap holds both and the last save is in it, the save's time is the
        border (kept steps before it began, lost ones after it ended); otherwise kept ones fill the gap first.
        """
        kept_n = int(min(max(self.step - first + 1, 0), n))
        lost_n = n - kept_n
        save = self.save
        if kept_n and lost_n and save is not None and lo <= save.t <= hi:
            return kept_n, min(kept_n * ideal, save.t - lo), min(lost_n * ideal, max(0.0, hi - save.t - save.dur_s))
        kept_s = min(kept_n * ideal, hi - lo)
        return kept_n, kept_s, min(lost_n * ideal, hi - lo - kept_s)


def _credit(
    tally: _Tally, keep: _Keep, first: int, n: int, lo: float, hi: float, ideal: float, load_share: float
) -> float:
    """Credit ``n`` unrecorded steps from ``first`` that ran in ``[lo, hi]``; returns the seconds credited."""
    kept_n, kept_s, lost_s = keep.split(first, n, lo, hi, ideal)
    if kept_n:
        tally.steps_unrecorded(kept_n, kept_s, lost=False, load_share=load_share)
    if n - kept_n:
        tally.steps_unrecorded(n - kept_n, lost_s, lost=True, load_share=load_share)
    return kept_s + lost_s


def _startup(
    steps: StepTable,
    sl: slice,
    lo: float,
    hi: float,
    restores: list[_Op],
    first_expected: int,
    ideal: float,
    tally: _Tally,
    keep: _Keep,
    load_share: float,
) -> float:
    """Start-up time of one incarnation, less the steps that must have run before its first recorded one."""
    restore_s = sum(r.dur_s for r in restores)
    if sl.stop == sl.start:
        return max(0.0, hi - lo - restore_s)
    first_start = float(steps.start_s[sl.start])
    room = max(0.0, first_start - lo - restore_s)
    unrecorded = max(0, int(steps.step[sl.start]) - first_expected)
    if not unrecorded:
        return room
    credited = _credit(tally, keep, first_expected, unrecorded, first_start - room, first_start, ideal, load_share)
    return max(0.0, room - credited)


def _between_steps(
    steps: StepTable, cuts: np.ndarray, ideal: float, keeps: list[_Keep], load_share: float, tally: _Tally
) -> None:
    """Steps whose numbers were skipped between two recorded steps of one incarnation."""
    if len(steps) < 2:
        return
    same = np.ones(len(steps) - 1, dtype=bool)
    same[cuts[1:-1][(cuts[1:-1] > 0) & (cuts[1:-1] < len(steps))] - 1] = False
    missing = np.where(same, np.maximum(np.diff(steps.step) - 1, 0), 0)
    gap_s = np.maximum(steps.start_s[1:] - steps.end_s[:-1], 0.0)
    incarnation = np.searchsorted(cuts, np.arange(1, len(steps)), side="right") - 1
    kept_step = np.array([keeps[k].step for k in incarnation.tolist()], dtype=np.float64)
    kept_n = np.clip(kept_step - steps.step[:-1], 0, missing)
    # Gaps that hold only kept or only lost steps, in bulk; the few that hold the border one by one.
    est = np.minimum(missing * ideal, gap_s)
    for is_lost, pick in ((False, (missing > 0) & (kept_n == missing)), (True, (missing > 0) & (kept_n == 0))):
        if pick.any():
            tally.steps_unrecorded(
                int(missing[pick].sum()), float(est[pick].sum()), lost=is_lost, load_share=load_share
            )
    for i in np.flatnonzero((kept_n > 0) & (kept_n < missing)).tolist():
        _credit(
            tally,
            keeps[int(incarnation[i])],
            int(steps.step[i]) + 1,
            int(missing[i]),
            float(steps.end_s[i]),
            float(steps.end_s[i]) + float(gap_s[i]),
            ideal,
            load_share,
        )


def _finish(
    job: Job | None,
    steps: StepTable,
    events: Sequence[Event],
    failures: np.ndarray,
    saves: list[_Op],
    restores: list[_Op],
    lost: np.ndarray,
    tally: _Tally,
    t0: float,
    t1: float,
) -> GoodputReport:
    badput = tally.badput
    save_t = np.array([op.t for op in saves], dtype=np.float64)
    save_dur = np.array([op.dur_s for op in saves], dtype=np.float64)
    overlap = float((_covered(steps, save_t + save_dur) - _covered(steps, save_t)).sum()) if len(steps) else 0.0
    save_alone = float(save_dur.sum()) - overlap
    badput["checkpoint_save"] += save_alone
    badput["checkpoint_restore"] += sum(r.dur_s for r in restores)
    badput["lost_progress"] += float(steps.dur_s[lost].sum())
    kept_load = np.minimum(steps.load_s[~lost], steps.dur_s[~lost])
    badput["data_loading"] += float(kept_load.sum())
    productive = tally.productive + float(steps.dur_s[~lost].sum() - kept_load.sum())
    # The ranks' mean barrier wait of the kept steps, within what is left of each step after its load; steps
    # credited without records (``tally.productive``) waited the recorded steps' share of their time.
    waited = float(np.minimum(steps.wait[~lost], steps.dur_s[~lost] - kept_load).clip(min=0.0).sum())
    total_dur = float(steps.dur_s.sum()) if len(steps) else 0.0
    if total_dur > 0 and tally.productive > 0:
        busy_share = 1.0 - float(steps.load_s.sum()) / total_dur
        waited += tally.productive * float(steps.wait.sum()) / total_dur / busy_share if busy_share > 0 else 0.0
    total = t1 - t0
    notes = list(tally.notes)
    if tally.estimated_steps:
        notes.append(
            f"{tally.estimated_steps} steps without records (skipped step numbers) credited at the ideal step time"
        )
    other = total - productive - sum(badput.values())
    if other < -1e-6 * max(total, 1.0):
        notes.append(f"records overlap by {-other:.3f} s; 'other' clamped to 0")
    badput["other"] = max(0.0, other)
    causes = Counter(
        str(e.attrs.get("cause", "unknown")) for e in events if e.kind == EventKind.FAILURE and t0 <= e.t <= t1
    )
    return GoodputReport(
        job=job.id if job is not None else "",
        t0=t0,
        t1=t1,
        total_s=total,
        productive_s=productive,
        badput_s=badput,
        ideal_step_s=ideal_step_time(steps.dur_s[~lost]),
        steps=len(steps),
        lost_steps=int(lost.sum()),
        interruptions=int(failures.size),
        interruptions_by_cause=dict(causes),
        overlap_s=float(overlap),
        notes=tuple(notes),
        barrier_wait_s=min(waited, max(productive, 0.0)),
    )


def account_job(
    job: Job | None, spans: Iterable[Span], events: Sequence[Event], step_samples: Iterable[Sample] = ()
) -> GoodputReport:
    """The whole path for one job's records: steps from its spans (else its ``train_step_time_s``
    samples), re-runs split at its failures, then ``account_goodput``. Views call this."""
    return account_job_steps(job, job_step_table(job, spans, events, step_samples), events)


def account_job_steps(job: Job | None, steps: StepTable, events: Sequence[Event]) -> GoodputReport:
    """``account_job`` of steps already grouped (``job_step_table``'s), for a caller that also draws them."""
    return account_goodput(job, steps, sorted(_job_events(job, events), key=lambda e: e.t))


def job_step_table(
    job: Job | None, spans: Iterable[Span], events: Sequence[Event], step_samples: Iterable[Sample] = ()
) -> StepTable:
    """The executed steps ``account_job`` accounts (re-runs apart): the job page draws their times."""
    return _executed_steps(_job_events(job, events), spans, step_samples)


def job_failure_breaks(job: Job | None, events: Sequence[Event]) -> list[float]:
    """The times that split ``job``'s steps into incarnations (``steps_from_spans``' ``breaks``): its failures,
    each requeue of an attempt among them."""
    return [e.t for e in _job_events(job, events) if e.kind == EventKind.FAILURE]


def _job_events(job: Job | None, events: Sequence[Event]) -> list[Event]:
    return _requeues_as_failures(
        [
            e
            for e in events
            if e.kind in GOODPUT_EVENT_KINDS and (job is None or str(e.attrs.get("job", job.id)) == job.id)
        ]
    )


def _executed_steps(mine: Sequence[Event], spans: Iterable[Span], step_samples: Iterable[Sample]) -> StepTable:
    breaks = [e.t for e in mine if e.kind == EventKind.FAILURE]
    steps = steps_from_spans(spans, breaks=breaks)
    if not len(steps):
        steps = steps_from_step_samples(step_samples, breaks=breaks)
    return steps


def _requeues_as_failures(events: list[Event]) -> list[Event]:
    """``events`` less their ``job_end`` ones, with each attempt Slurm requeued (a REQUEUED ``job_end``,
    from ``sacct --json``) as a failure at its end, cause ``requeued``, unless a failure event within
    ``REQUEUE_AFTER_FAILURE_S`` before it already says why (the same interruption, seen twice)."""
    failures = [e.t for e in events if e.kind == EventKind.FAILURE]
    out, seen = [e for e in events if e.kind != EventKind.JOB_END], set()
    for e in events:
        if e.kind != EventKind.JOB_END or e.attrs.get("state") != "REQUEUED":
            continue
        end = float(e.attrs.get("end", e.t))
        key = (str(e.attrs.get("job")), e.attrs.get("start"))
        if key in seen or any(end - REQUEUE_AFTER_FAILURE_S <= t <= end for t in failures):
            continue
        seen.add(key)
        out.append(
            Event(
                kind=EventKind.FAILURE, t=end, source=e.source, attrs={"job": e.attrs.get("job"), "cause": "requeued"}
            )
        )
    return sorted(out, key=lambda e: e.t)
