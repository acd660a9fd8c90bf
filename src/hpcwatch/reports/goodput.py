"""Goodput of one job from the store: the one path the CLI (``hpcwatch goodput``) and the exporter share;
and the simulated run of ``hpcwatch simulate goodput``.

The job's goodput events (failures, checkpoint saves and restores) inside its
wall-clock window, its spans (else its ``train_step_time_s`` samples), re-runs
split at its failures: ``analysis.goodput.account_job``. The simulation is
``analysis.goodputsim`` (imported when a run is simulated).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hpcwatch import vocab
from hpcwatch.analysis.goodput import (
    BADPUT_KINDS,
    GOODPUT_EVENT_KINDS,
    GoodputReport,
    StepTable,
    account_job_steps,
    job_failure_breaks,
    steps_from_step_samples,
)
from hpcwatch.analysis.stepgroups import StepGroups
from hpcwatch.errors import ConfigError, InputError
from hpcwatch.records import Event, Job, Span

if TYPE_CHECKING:  # ``simulate goodput`` never opens a store: pyarrow and duckdb stay unloaded
    import pyarrow as pa

    from hpcwatch.analysis.goodputsim import GoodputRun, GoodputSimConfig, Interval
    from hpcwatch.reports.jobstretches import KeptStretches
    from hpcwatch.store import Store

__all__ = [
    "goodput_report",
    "goodput_with_steps",
    "step_groups",
    "STEP_TIME_METRIC",
    "BADPUT_KINDS",
    "simulation_config",
    "simulated_goodput",
    "simulated_goodput_sweep",
    "simulated_records",
    "MAX_STORED_STEPS",
]

#: Step times some trainers export as a gauge (one sample per step).
STEP_TIME_METRIC = vocab.TRAIN_STEP_TIME_S


def goodput_report(store: Store, job_id: str) -> GoodputReport:
    """Where ``job_id``'s wall time went. ``InputError`` when neither the job nor its steps are stored."""
    return goodput_with_steps(store, job_id)[0]


def goodput_with_steps(
    store: Store, job_id: str, *, kept: KeptStretches | None = None
) -> tuple[GoodputReport, StepTable]:
    """``goodput_report`` and the executed steps it accounts (one row per step, a step re-run after a failure
    apart: ``analysis.goodput.StepTable``), which the job page also draws. The steps come grouped from the
    store (``step_groups``), else from the job's ``train_step_time_s`` samples. ``kept``: what a server keeps
    of the job's grouped steps between pages."""
    record = _with_first_start(store, store.job(job_id))
    events = _goodput_events(store, record)
    breaks = job_failure_breaks(record, events)
    steps = step_groups(store, job_id, record, breaks, kept=kept).step_table()
    if not len(steps):
        steps = steps_from_step_samples(store.iter_samples(STEP_TIME_METRIC, job=job_id), breaks=breaks)
    if record is None and not len(steps):
        raise InputError(f"job {job_id}: neither the job nor its steps are in the store")
    return account_job_steps(record, steps, events), steps


def step_groups(
    store: Store, job_id: str, record: Job | None, breaks: Sequence[float], *, kept: KeptStretches | None = None
) -> StepGroups:
    """``job_id``'s spans grouped into steps (``queries.job_step_groups``), incarnations split at ``breaks``.
    With ``kept`` (a job with a start), from the groups of the spans up to the newest checkpoint still true
    on (no span landed before it since, the same breaks): only the spans that started after it are grouped,
    and a new checkpoint is left ``SETTLE_S`` before the newest span (``reports.jobstretches``)."""
    from hpcwatch.reports.jobstretches import kept_fold
    from hpcwatch.store import queries

    t0 = record.start if record is not None else None
    if kept is None or record is None or t0 is None:
        return StepGroups.of_rows(*queries.job_step_groups(store, job_id, breaks=breaks))

    def read(since: float | None, cut: float | None, until: float | None) -> tuple[StepGroups, StepGroups]:
        groups, ranks = queries.job_step_groups(store, job_id, breaks=breaks, since=since, cut=cut, until=until)
        return (
            StepGroups.of_rows(*_started(groups, ranks, later=False)),
            StepGroups.of_rows(*_started(groups, ranks, later=True)),
        )

    return kept_fold(
        store,
        kept,
        "steps",
        record,
        t0,
        written=lambda since_version, before: queries.job_spans_written(store, since_version, job_id, before=before),
        fingerprint=tuple(float(b) for b in breaks),
        newest=lambda since: queries.newest_span_start(store, job_id, since=since),
        read=read,
        join=StepGroups.join,
    )


def _started(groups: pa.Table, ranks: pa.Table, *, later: bool) -> tuple[pa.Table, pa.Table]:
    """The rows of ``queries.job_step_groups``' tables of the spans started before the cut (or after it)."""
    import pyarrow.compute as pc

    return groups.filter(pc.equal(groups["later"], later)), ranks.filter(pc.equal(ranks["later"], later))


def _goodput_events(store: Store, record: Job | None) -> list[Event]:
    """The goodput events of the job's window (as of its first attempt), one query, in the order the
    per-kind queries gave (a store query costs 1-2 ms before its rows)."""
    t0 = record.start if record is not None else None
    t1 = record.end if record is not None else None
    order = {kind: i for i, kind in enumerate(GOODPUT_EVENT_KINDS)}
    return sorted(store.events(kinds=GOODPUT_EVENT_KINDS, t0=t0, t1=t1), key=lambda e: order[e.kind])


def _with_first_start(store: Store, record: Job | None) -> Job | None:
    """A requeued job's record as of its first attempt (``reports.jobs.first_start``): the wall clock its
    goodput is judged over begins with the first attempt."""
    from hpcwatch.reports.jobs import first_start

    if record is None:
        return None
    return replace(record, start=first_start(store, record))


# -- simulate goodput ------------------------------------------------------------------------------

#: Steps a simulated run may write into a store (5 spans each); past this, a shorter run is asked for.
MAX_STORED_STEPS = 100_000


def simulation_config(
    *,
    gpus: int,
    days: float,
    checkpoint_cost_s: float,
    restart_cost_s: float,
    restore_cost_s: float,
    interval: Interval,
    step_s: float,
    seed: int,
) -> GoodputSimConfig:
    """A simulated job: its size, length, costs and checkpoint interval; Llama 3's start-up and data loading."""
    from hpcwatch.analysis.goodputsim import DEFAULT_INIT_S, DEFAULT_LOAD_FRACTION, GoodputSimConfig

    return GoodputSimConfig(
        gpus=gpus,
        days=days,
        checkpoint_cost_s=checkpoint_cost_s,
        restart_cost_s=restart_cost_s,
        restore_cost_s=restore_cost_s,
        init_s=DEFAULT_INIT_S,
        interval=interval,
        step_s=step_s,
        load_fraction=DEFAULT_LOAD_FRACTION,
        seed=seed,
    )


def simulated_goodput(config: GoodputSimConfig) -> GoodputRun:
    """One synchronous job under Llama 3's failure rates (``analysis.goodputsim.simulate_goodput``)."""
    from hpcwatch.analysis.goodputsim import simulate_goodput

    return simulate_goodput(config)


def simulated_goodput_sweep(config: GoodputSimConfig) -> list[GoodputRun]:
    """``config``'s job at each size of ``analysis.goodputsim.DEFAULT_SWEEP_GPUS`` (its ``gpus`` replaced)."""
    from hpcwatch.analysis.goodputsim import goodput_sweep

    return goodput_sweep(base=config)


def simulated_records(run: GoodputRun, job_id: str) -> Iterator[Job | Span | Event]:
    """The run's records (job, spans, events) to store. ``ConfigError`` past ``MAX_STORED_STEPS`` steps."""
    steps = int(run.inc_steps.sum())
    if steps > MAX_STORED_STEPS:
        raise ConfigError(
            f"--db: the run has {steps} steps (> {MAX_STORED_STEPS}); use fewer --days or a longer --step"
        )
    return run.records(job_id)
