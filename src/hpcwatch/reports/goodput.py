"""Goodput of one job from the store: the one path the CLI (``hpcwatch goodput``) and the exporter share.

The job's goodput events (failures, checkpoint saves and restores) inside its
wall-clock window, its spans (else its ``train_step_time_s`` samples), re-runs
split at its failures: ``analysis.goodput.account_job``.
"""

from __future__ import annotations

from dataclasses import replace

from hpcwatch import vocab
from hpcwatch.analysis.goodput import GOODPUT_EVENT_KINDS, GoodputReport, account_job
from hpcwatch.errors import InputError
from hpcwatch.records import Job
from hpcwatch.store import Store, queries

__all__ = ["goodput_report", "STEP_TIME_METRIC"]

#: Step times some trainers export as a gauge (one sample per step).
STEP_TIME_METRIC = vocab.TRAIN_STEP_TIME_S


def goodput_report(store: Store, job_id: str) -> GoodputReport:
    """Where ``job_id``'s wall time went. ``InputError`` when neither the job nor its steps are stored."""
    record = _with_first_start(store, store.job(job_id))
    t0 = record.start if record is not None else None
    t1 = record.end if record is not None else None
    events = [e for kind in GOODPUT_EVENT_KINDS for e in store.events(kind, t0=t0, t1=t1)]
    spans = store.spans(job_id)
    step_samples = [] if spans else list(store.iter_samples(STEP_TIME_METRIC, job=job_id))
    if record is None and not spans and not step_samples:
        raise InputError(f"job {job_id}: neither the job nor its steps are in the store")
    return account_job(record, spans, events, step_samples)


def _with_first_start(store: Store, record: Job | None) -> Job | None:
    """A requeued job's record as of its first attempt: Slurm resets its start (and submit time) at each
    requeue, but the wall clock its goodput is judged over begins with the first attempt, which the
    ``job_end`` events of its requeued attempts (``state`` REQUEUED, ``start``; a row of ``sacct -D``) keep."""
    if record is None:
        return None
    starts = queries.requeued_attempt_starts(store, record.id)
    if not starts:
        return record
    first = min(starts + ([record.start] if record.start is not None else []))
    return replace(record, start=first)
