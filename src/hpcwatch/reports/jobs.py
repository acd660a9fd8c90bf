"""The job report and the jobs list: per-workload efficiency (jobstats and more) from the attribution analysis.

Workloads are the store's jobs (Slurm, pods read from ``kubectl get pods``) and those known only from
their samples (an ``hpc_job`` label without any Slurm file, a pod label): see ``analysis.attribution``.
``samples`` defaults to the store's; where the CLI reads samples from Prometheus instead
(``--prometheus``), the caller passes the PromQL backend's table (same columns as ``store.samples``)
and the jobs still come from the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch.analysis.attribution import (
    DCGM_METRICS,
    REPORT_METRICS,
    SLURM_METRICS,
    JobReport,
    job_reports,
    reports_of,
)
from hpcwatch.errors import InputError
from hpcwatch.records import MAX_JOB_ID_CHARS, Job
from hpcwatch.reports.jobstretches import (
    KeptStretches,
    PageReads,
    WindowRead,
    read_window,
    window_partial,
)
from hpcwatch.reports.storestretches import KeptStore, store_partial
from hpcwatch.store import Store, queries

if TYPE_CHECKING:  # the PromQL backend (httpx) is only loaded by callers that read Prometheus
    from hpcwatch.promql import PrometheusBackend

__all__ = [
    "jobs_report",
    "job_report",
    "job_samples",
    "prometheus_samples",
    "check_job_id",
    "first_start",
    "JobCost",
    "job_cost",
    "cost_dict",
    "MAX_JOB_ID_CHARS",
    "REPORT_METRICS",
    "DCGM_METRICS",
]


def jobs_report(
    store: Store,
    *,
    samples: pa.Table | None = None,
    user: str | None = None,
    account: str | None = None,
    metrics: tuple[str, ...] = REPORT_METRICS,
    kept: KeptStore | None = None,
    since: float | None = None,
) -> list[JobReport]:
    """One ``JobReport`` per workload (the store's jobs that ran, in its order, then workloads seen only in
    samples), optionally one user's or account's. The store's samples are read stretch by stretch
    (``reports.storestretches``; ``kept``: what a long-running reader kept of them, the exporter's, which may
    keep the recent jobs only, ``KeptStore.ended_within_s``; ``since``:
    only those from then on, which is each job's own report when it first started then or later: a job's
    report reads nothing before its first start, ``job_report``); ``samples`` (Prometheus') are one table."""
    jobs = store.jobs()
    if samples is not None:
        reports = job_reports(samples, jobs)
    else:
        part = store_partial(store, metrics, jobs, kept=kept, since=since)
        reports = reports_of(part, kept.shown(part, jobs) if kept is not None else jobs)
    return [r for r in reports if (user is None or r.user == user) and (account is None or r.account == account)]


def job_samples(store: Store, job_id: str, *, metrics: tuple[str, ...] = REPORT_METRICS) -> pa.Table | None:
    """The samples that can count for ``job_id``: those of its nodes during its run, and those labelled with
    it anywhere (Lustre's ``jobid`` has no compute node). None when the store has no such Slurm job (a
    workload known only from labels): then every sample is read. At 128 nodes this is the job's share of
    the table, not all of it: one scan."""
    record = store.job(job_id)
    t0 = first_start(store, record)
    if record is None or not record.nodes or t0 is None:
        return None
    return read_window(store, record, t0, metrics).table


def first_start(store: Store, record: Job | None) -> float | None:
    """When ``record``'s job first started: Slurm resets a job's start at each requeue, but its life (the
    window its samples, XID errors and goodput are judged over) begins with the first attempt, which the
    ``job_end`` events of its requeued attempts (``state`` REQUEUED, ``start``; a row of ``sacct -D``) keep.
    The one rule ``job_samples`` (so ``job_report`` and the job page) and ``reports.goodput`` share: with the
    latest attempt's start, an XID that killed the first attempt fell outside the job's own report."""
    if record is None:
        return None
    starts = queries.requeued_attempt_starts(store, record.id)
    return min(starts + ([record.start] if record.start is not None else []), default=None)


def job_report(
    store: Store,
    job_id: str,
    *,
    samples: pa.Table | None = None,
    kept: KeptStretches | None = None,
    window: WindowRead | None = None,
    reads: PageReads | None = None,
) -> JobReport:
    """One workload's report, GPU by GPU (``per_gpu``). A Slurm job's is read from its window stretch by
    stretch (``reports.jobstretches``; ``kept``: what a server keeps of it between pages; ``window``: its
    whole window, read already; ``reads``: where a page holds what it read in one query for its charts) unless
    ``samples`` are given; a workload known from labels only is attributed among all the store's samples.
    ``InputError`` when the store neither holds the job nor any sample of it, or when the job never started."""
    check_job_id(job_id)
    record: Job | None
    t0: float | None
    if samples is None and window is not None:  # the record and start it was read for, not asked again
        record, t0 = window.record, window.t0
    else:
        record = store.job(job_id)
        t0 = first_start(store, record)
    if samples is None and record is not None and record.nodes and t0 is not None:
        jobs = store.jobs(on_nodes=record.nodes)
        part = window_partial(store, record, t0, jobs, kept=kept, window=window, reads=reads)
        now = _running_until(store, part.newest_t) if record.end is None else None
        found = next(iter(reports_of(part, jobs, now=now, only=job_id)), None)
    else:
        table = samples if samples is not None else store.samples(list(REPORT_METRICS))
        jobs, now = _neighbours(store, job_id, table)
        found = next(iter(job_reports(table, jobs, now=now, only=job_id)), None)
    if found is not None:
        return found
    if record is None:
        raise InputError(f"no job {job_id} in the store (hpcwatch jobs lists them)")
    raise InputError(f"job {job_id} never started: nothing to report")


def _neighbours(store: Store, job_id: str, samples: pa.Table) -> tuple[list[Job], float | None]:
    """The jobs ``job_id``'s samples are attributed among, and the ``now`` of ``job_reports``: a Slurm job's
    samples are those of its nodes, so only the jobs that ran on them can claim one (a store keeps months of
    other jobs); a workload known from labels only is attributed among all. ``now`` ends a running job: without
    samples, the newest job time of the whole store, as ``job_reports`` would take it from every job."""
    record = store.job(job_id)
    if record is None or not record.nodes:
        return store.jobs(), None
    newest = pc.max(samples.column("t")).as_py() if samples.num_rows else None
    return store.jobs(on_nodes=record.nodes), _running_until(store, newest) if record.end is None else None


def _running_until(store: Store, seen: float | None) -> float:
    """Where a running job's report ends: the store's newest sample of a report metric, as ``jobs_report`` ends
    it (the job's own newest, ``seen``, can be seconds older: its nodes scraped before others); without any, the
    newest job time of the whole store, as ``job_reports`` would take it from every job."""
    newest = queries.latest_sample_t(store, since=seen, metrics=REPORT_METRICS)
    if newest is not None:
        return newest
    return seen if seen is not None else queries.latest_job_time(store)


def check_job_id(job_id: str) -> None:
    """``InputError`` when ``job_id`` is longer than any workload id can be; the message names its length,
    not its text (which may be megabytes, and would come back whole in the error)."""
    if len(job_id) > MAX_JOB_ID_CHARS:
        raise InputError(
            f"a job id of {len(job_id)} characters: ids are at most {MAX_JOB_ID_CHARS} "
            "(a Slurm job, array task or het component, a pod's namespace/name)"
        )


def prometheus_samples(prom: PrometheusBackend, *, t0: float | None, store: Store | None = None) -> pa.Table:
    """The report's samples (``REPORT_METRICS``) read from Prometheus since ``t0`` (a job's start; None: the
    backend's default look-back), in ``store.samples`` columns: what ``jobs --prometheus`` and the web's
    job page under ``serve --prometheus`` pass as ``samples``.

    Slurm's own figures (``SLURM_METRICS``: CPUs, memory, a running job's elapsed time and limit) are written
    by the Slurm readers into ``store``, where the jobs are; Prometheus holds them only if a Slurm exporter is
    scraped. So they are read from both: without the store's, a running job's elapsed time would run to the
    newest scrape instead of Slurm's snapshot, and the two backends would disagree."""
    scraped = prom.samples(list(REPORT_METRICS), t0=t0)
    if store is None:
        return scraped
    slurm = store.samples(list(SLURM_METRICS), t0=t0)
    if not slurm.num_rows:
        return scraped
    return pa.concat_tables([scraped, slurm.select(scraped.schema.names).cast(scraped.schema)])


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCost:
    """What a job cost: its GPU-hours at a configured price, and its energy."""

    gpu_hours: float
    """Allocated GPU-hours (GPUs × the job's wall time, Slurm's clock), else the observed ones (samples' clock)."""
    price_per_gpu_hour: float | None
    """The configured price (``--gpu-hour-price``, in ``currency``); None when none is configured."""
    currency: str
    cost: float | None
    """``gpu_hours × price_per_gpu_hour``; None without a price (never a made-up one)."""
    energy_kwh: float
    """From dcgm-exporter's energy counter (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ), summed over the job's
    GPUs (``analysis.attribution``): the GPUs' own draw, not the node's or the cooling's."""


def job_cost(report: JobReport, *, price_per_gpu_hour: float | None, currency: str = "") -> JobCost:
    """``report``'s cost: GPU-hours × ``price_per_gpu_hour`` and its GPUs' energy."""
    hours = report.gpu_hours_allocated if report.gpu_hours_allocated is not None else report.gpu_hours_observed
    return JobCost(
        gpu_hours=hours,
        price_per_gpu_hour=price_per_gpu_hour,
        currency=currency,
        cost=None if price_per_gpu_hour is None else hours * price_per_gpu_hour,
        energy_kwh=report.energy_kwh,
    )


def cost_dict(cost: JobCost) -> dict[str, Any]:
    """The ``cost`` of ``hpcwatch job --json`` and ``GET /api/job/ID``."""
    return {
        "gpu_hours": cost.gpu_hours,
        "price_per_gpu_hour": cost.price_per_gpu_hour,
        "currency": cost.currency,
        "cost": cost.cost,
        "energy_kwh": cost.energy_kwh,
    }
