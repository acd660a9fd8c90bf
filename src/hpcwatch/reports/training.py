"""Each job's recent steps and goodput, asked again and again (the exporter's training families, every scrape):
computed again only for the jobs whose spans, goodput events or record changed since the last ask.

A scrape reported every job with spans: its recent steps (``reports.steps.step_report``) and its goodput
(``reports.goodput``), which groups every step of the job's life, so a scrape grew with the spans of every
job the store ever held (at 1,024 nodes a 1,536-rank job writes 9,000 spans a second: 5.5 million in ten
minutes, 0.6 s of a scrape). A job's figures follow from its spans, its goodput events (failures, checkpoints,
job ends; an event that names no job is every job's) and its record: a job none of which changed since the
last ask keeps its figures, and the goodput of one that changed is grouped on from the step groups kept of it
(``reports.jobstretches.kept_fold``).

Asked with ``ended_within_s`` (the exporter's window), only the jobs that run or ended within that time before
the store's newest sample are reported and kept (``reports.storestretches.recent``); a job with spans but no
record has no end to judge by: reported while it has spans.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcwatch.analysis.goodput import GOODPUT_EVENT_KINDS
from hpcwatch.errors import InputError
from hpcwatch.records import Job
from hpcwatch.reports.goodput import goodput_with_steps
from hpcwatch.reports.jobstretches import KeptStretches
from hpcwatch.reports.steps import StepReport, step_report
from hpcwatch.reports.storestretches import recent
from hpcwatch.store import queries

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["JobTraining", "KeptTraining", "KEPT_GROUPED_JOBS"]

#: Jobs whose step groups are kept to read on from (each a few MB at 1,536 ranks): the running ones that
#: change from one scrape to the next. Ours.
KEPT_GROUPED_JOBS = 16


@dataclass(frozen=True, slots=True)
class JobTraining:
    """A job's recent steps and its goodput (productive time / wall time)."""

    job: str
    steps: StepReport
    goodput: float


@dataclass(frozen=True, slots=True)
class _Found:
    record: Job | None
    training: JobTraining | None
    """None: the job's spans hold no step to report."""


class KeptTraining:
    """Each job's ``JobTraining`` from one ask to the next (module doc). Safe to share between threads: one ask
    at a time, so that a scrape that comes during another's reuses what that one computed."""

    def __init__(self, *, ended_within_s: float = math.inf) -> None:
        self.ended_within_s = ended_within_s
        """The jobs reported: those that run or ended within this many seconds before the newest sample."""
        self._newest: float | None = None
        """The store's newest sample when last asked (the next ask reads from it)."""
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._recent_steps = 0
        self._version = 0
        self._found: dict[str, _Found] = {}
        self._groups = KeptStretches(size=KEPT_GROUPED_JOBS)

    def reports(self, store: Store, *, recent_steps: int) -> list[JobTraining]:
        """Every job with spans whose last ``recent_steps`` steps say something, by job id."""
        with self._lock:
            if (store, recent_steps) != (self._store, self._recent_steps) or store.version < self._version:
                self._store, self._recent_steps, self._version, self._found = store, recent_steps, 0, {}
                self._newest = None
            version, spans, events = queries.training_changed_since(store, self._version, GOODPUT_EVENT_KINDS)
            records = store.jobs_by_id()
            since = self._window_start(store)
            for job in sorted(spans | set(self._found)):  # every job with spans
                found = self._found.get(job)
                record = records.get(job)
                if record is not None and not recent(record, since):  # ended before the window: not reported
                    self._found.pop(job, None)
                    continue
                changed = job in spans or job in events or None in events  # an event without a job: every job's
                if changed or found is None or found.record != record:
                    self._found[job] = _Found(record, self._training(store, job, recent_steps))
            self._version = version
            return [f.training for _, f in sorted(self._found.items()) if f.training is not None]

    def _window_start(self, store: Store) -> float:
        """The oldest end of a job reported (-inf: every one)."""
        if self.ended_within_s == math.inf:
            return -math.inf
        newest = queries.latest_sample_t(store, since=self._newest)
        self._newest = newest if newest is not None else self._newest
        return -math.inf if self._newest is None else self._newest - self.ended_within_s

    def _training(self, store: Store, job: str, recent_steps: int) -> JobTraining | None:
        try:
            steps = step_report(store, job, recent_steps=recent_steps)
        except InputError:
            return None  # spans of no training phase: nothing to say about its steps
        if steps.step_time_s is None:
            return None
        goodput, _ = goodput_with_steps(store, job, kept=self._groups)
        return JobTraining(job, steps, goodput.goodput)
