"""The live page's training card: the job training most recently and the time of its newest complete step.

``live_training`` asks the store once: every span to find the job whose spans end last, then that job's last
two step numbers. The live view asks every second, and at 1,024 nodes a 15-minute job holds 8 million spans:
those two questions cost 150 ms of CPU a snapshot, growing with the job. ``FollowedTraining`` keeps the
answer's inputs instead, from the spans committed since its last question (``Store.query_arrow_since_each``):
per job its latest end and step, and the spans of its last two step numbers. Spans are only ever added, so
a maximum kept is the maximum of all, and a job's last two steps are among those kept and those new.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.analysis.steps import anatomy_from_span_table, step_times_s
from hpcwatch.errors import InputError

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["LiveTraining", "live_training", "FollowedTraining", "LIVE_STEPS", "KEEP_SPANS_S"]

#: The step numbers the card reads: the newest may still be arriving rank by rank, the one before is complete.
LIVE_STEPS = 2
#: Ours: the spans kept of a job whose spans ended this long before the newest are dropped (its latest end and
#: step stay): what is kept stays the size of the jobs training now, not of every job a store has seen. Such a
#: job training again shows its steps from the spans of its new commits.
KEEP_SPANS_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveTraining:
    job: str
    step: int
    """The newest step number seen."""
    step_time_s: float | None
    """The newest complete step's time."""


def live_training(store: Store, *, exclude_jobs: Sequence[str] = ()) -> LiveTraining | None:
    """The job training most recently (spans ending last; ``exclude_jobs`` left out) and its newest complete
    step's time; None without spans."""
    return FollowedTraining(store, exclude_jobs=exclude_jobs).current()


def _card(job: str, last_step: int, recent: pa.Table | None) -> LiveTraining:
    """The card of ``job`` from the spans of its last steps (None: not kept, ``KEEP_SPANS_S``)."""
    try:
        anatomy = anatomy_from_span_table(recent) if recent is not None else None
    except InputError:  # no span of a training phase in its last steps
        anatomy = None
    if anatomy is None or not anatomy.steps:
        return LiveTraining(job=job, step=last_step, step_time_s=None)
    return LiveTraining(job=job, step=anatomy.steps[-1], step_time_s=float(step_times_s(anatomy)[-1]))


class FollowedTraining:
    """``live_training``'s answer, kept up to date from the spans committed since the previous question.
    Thread-safe. What it keeps: per job (not excluded) with spans, its latest end and step number, and the
    spans of its last ``LIVE_STEPS`` step numbers (at most a few steps' worth of each job's ranks)."""

    def __init__(self, store: Store, *, exclude_jobs: Sequence[str] = ()) -> None:
        self.store = store
        self.exclude_jobs = tuple(exclude_jobs)
        self._lock = threading.Lock()
        self._version = 0
        """The store version read up to (0: nothing read yet, every span is new)."""
        self._ends: dict[str, tuple[float, int]] = {}
        """job -> (its spans' latest end, its largest step number)."""
        self._recent: dict[str, pa.Table] = {}
        """job -> the spans of its last ``LIVE_STEPS`` step numbers, in the store's order (step, rank, start)."""

    def current(self) -> LiveTraining | None:
        with self._lock:
            self._follow()
            if not self._ends:
                return None
            # The latest end wins; equal ends go to the larger job id, so that the answer does not hang on the order
            # in which they were seen.
            job = max(self._ends, key=lambda j: (self._ends[j][0], j))
            return _card(job, self._ends[job][1], self._recent.get(job))

    def _follow(self) -> None:
        version = self.store.version
        if version == self._version:
            return
        from hpcwatch.store import queries

        self._version, ends, recent = queries.span_tops_since(
            self.store, self._version, steps=LIVE_STEPS, exclude=self.exclude_jobs
        )
        for job, step, end in zip(*(ends.column(c).to_pylist() for c in ("job", "step", "end"))):
            if job is None or end is None or step is None:
                continue
            kept_end, kept_step = self._ends.get(job, (end, step))
            self._ends[job] = (max(kept_end, end), max(kept_step, step))
        for job in set(recent.column("job").to_pylist()):
            new = recent.filter(pc.equal(recent.column("job"), job))
            kept = self._recent.get(job)
            self._recent[job] = _last_steps(new if kept is None else pa.concat_tables([kept, new]), LIVE_STEPS)
        if self._ends:
            horizon = max(end for end, _ in self._ends.values()) - KEEP_SPANS_S
            self._recent = {j: spans for j, spans in self._recent.items() if self._ends[j][0] >= horizon}


def _last_steps(spans: pa.Table, steps: int) -> pa.Table:
    """The spans of the ``steps`` largest step numbers, ordered by (step, rank, start) as the store reads them."""
    numbers = pc.unique(spans.column("step")).to_pylist()
    kept = sorted(n for n in numbers if n is not None)[-steps:]
    rows = spans.filter(pc.is_in(spans.column("step"), value_set=pa.array(kept, type=spans.schema.field("step").type)))
    return rows.sort_by([("step", "ascending"), ("rank", "ascending"), ("start", "ascending")])
