"""What a manager asks of the cluster, per Slurm account and over time: GPU-hours, utilisation, goodput, MFU,
cost, energy, and the assessment tier (``GET /api/decider``, the page's Decider mode).

Every figure is one the other reports already compute, summed per account and per time bucket; nothing here
is a new analysis:

- allocated GPU-hours: the Slurm allocation (``Job.gpus`` × the part of its run inside the bucket, Slurm's
  clock; a running job runs until the window's end), as ``reports.jobs``' ``gpu_hours_allocated``;
- observed and busy GPU-hours: ``analysis.attribution.job_reports`` over the bucket's samples (the samples'
  clock): per GPU a job held, observed = its samples × their scrape interval, busy = observed × its mean
  utilisation (``DCGM_FI_DEV_GPU_UTIL``, or a MIG instance's engine activity);
- goodput: ``reports.goodput.goodput_report`` of each job (ml-goodput-measurement's productive share of the
  job's wall time), counted in the bucket where the job's accounted window ends (the last one for a job
  still running past the window's end);
- MFU: ``analysis.mfu.compute_mfu`` over each job's median step in the bucket, when a model shape is given;
- cost: allocated GPU-hours × the configured price (``reports.jobs.job_cost``'s rule);
- energy: the GPUs' energy counter (``job_reports``' ``energy_kwh``);
- tier: each stored ``assessment`` event (``reports.assess.assessment_event``), cluster-wide.

Buckets, on the data's clock (UTC s)::

    window   |<------------------------------ window_s ------------------------------>| until
    buckets  |--partial--|--------bucket_s--------|--------bucket_s--------|--partial--|
                         ^ multiples of bucket_s (UTC midnight for days)

A sample at t stands for the interval (t - dt, t] (``analysis.attribution``), so it belongs to the bucket
with b0 < t <= b1. A value the store cannot give is None and ``missing`` says why, never a zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpcwatch import vocab
from hpcwatch.analysis.attribution import JobReport, job_reports
from hpcwatch.analysis.goodput import GoodputReport, steps_from_spans
from hpcwatch.analysis.mfu import DEFAULT_GPU, compute_mfu
from hpcwatch.assess.evidence import ModelShape
from hpcwatch.errors import ConfigError, InputError
from hpcwatch.records import Job, Span
from hpcwatch.reports.assess import TIER_NUMBERS
from hpcwatch.reports.goodput import goodput_report
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = [
    "DeciderReport",
    "AccountFigures",
    "AccountSeries",
    "TierPoint",
    "decider_report",
    "decider_dict",
    "default_bucket_s",
    "DEFAULT_WINDOW_S",
    "HOUR_S",
    "DAY_S",
    "MAX_BUCKETS",
    "MIN_BUCKET_S",
]

HOUR_S = 3600.0
DAY_S = 86_400.0
#: The manager's default question: the last week.
DEFAULT_WINDOW_S = 7 * DAY_S
#: Windows up to this long are bucketed by the hour, longer ones by the day (ours: 48 hourly points still read).
HOURLY_UP_TO_S = 2 * DAY_S
#: Bounds a request can ask for: a bucket shorter than a minute is shorter than a scrape at some sites, and
#: more than 400 buckets is more points than a sparkline has pixels (and one attribution pass each).
MIN_BUCKET_S = 60.0
MAX_BUCKETS = 400

#: What the figures read of dcgm-exporter: utilisation (MIG instances: engine activity) and the energy counter.
UTILISATION_METRICS = (
    vocab.DCGM_FI_DEV_GPU_UTIL,
    vocab.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
)
NO_PRICE = "no GPU-hour price configured (serve --gpu-hour-price)"
NO_MODEL = "the store holds step times, not the model: MFU needs the model shape (params, layers, d_model, seq)"


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountFigures:
    """One account's figures over one span of time ``t0``..``t1`` (UTC s). Hours are GPU-hours."""

    t0: float
    t1: float
    jobs: int
    """Jobs of the account whose allocation or samples fall in the span."""
    gpu_hours_allocated: float
    """Slurm's clock: GPUs × the part of each job's run in the span."""
    gpu_hours_observed: float
    """The samples' clock: GPU time of the account's jobs that utilisation samples cover."""
    gpu_hours_busy: float | None
    """Observed GPU-hours × mean utilisation (0..100 % → 0..1); None when no sample was seen."""
    utilisation: float | None
    """busy / observed (0..1): how busy the GPUs the jobs held were while watched; None without samples."""
    coverage: float | None
    """observed / allocated: how much of the allocation the utilisation speaks for; None without allocation."""
    goodput: float | None
    """Productive seconds / wall seconds (0..1) of the jobs whose goodput window ends in the span."""
    goodput_productive_s: float = 0.0
    goodput_wall_s: float = 0.0
    mfu: float | None = None
    """Model FLOPs utilisation (0..1), mean over jobs weighted by GPU-seconds of steps."""
    mfu_gpu_s: float = 0.0
    """The GPU-seconds of steps ``mfu`` is weighted by."""
    cost: float | None = None
    """gpu_hours_allocated × the price, in the report's currency; None without a price."""
    energy_kwh: float | None = None
    """The GPUs' own energy counter (kWh), None when no GPU of the account reported one. Each bucket misses
    one scrape interval per GPU (a counter's first sample in a bucket has no delta)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Field → why it is None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountSeries:
    account: str | None
    """The Slurm account (a pod's namespace for Kubernetes workloads); None: jobs without one."""
    total: AccountFigures
    """The whole window."""
    buckets: tuple[AccountFigures, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TierPoint:
    t: float
    """When the assessment was made (UTC s)."""
    tier: str
    tier_number: int | None
    """``reports.assess.TIER_NUMBERS`` (higher is better); None for a tier name we do not know."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeciderReport:
    t0: float
    t1: float
    """The window (UTC s, the data's clock)."""
    bucket_s: float
    edges: tuple[float, ...]
    """Bucket boundaries, ``t0`` first and ``t1`` last."""
    price_per_gpu_hour: float | None
    currency: str
    accounts: tuple[AccountSeries, ...]
    """Most allocated GPU-hours first."""
    tiers: tuple[TierPoint, ...]
    """Every stored assessment of the window, oldest first (the tier is the cluster's, not an account's)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Report part (``accounts``, ``tiers``, ``mfu``, ``cost``) → why it is empty or None."""


def default_bucket_s(window_s: float) -> float:
    """An hour for windows up to two days, else a day."""
    return HOUR_S if window_s <= HOURLY_UP_TO_S else DAY_S


def bucket_edges(t0: float, t1: float, bucket_s: float) -> tuple[float, ...]:
    """``t0``, the multiples of ``bucket_s`` strictly inside the window, ``t1``: days start at UTC midnight."""
    first = math.floor(t0 / bucket_s) + 1
    inner = [k * bucket_s for k in range(first, math.ceil(t1 / bucket_s))]
    return (t0, *(e for e in inner if t0 < e < t1), t1)


def _checked(window_s: float, bucket_s: float) -> None:
    if not window_s > 0:
        raise ConfigError(f"window_s: must be > 0, got {window_s!r}")
    if not bucket_s >= MIN_BUCKET_S:
        raise ConfigError(f"bucket_s: must be >= {MIN_BUCKET_S:g}, got {bucket_s!r}")
    if window_s / bucket_s > MAX_BUCKETS:
        raise ConfigError(f"window_s / bucket_s: at most {MAX_BUCKETS} buckets, asked {math.ceil(window_s / bucket_s)}")


def decider_report(
    store: Store,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    bucket_s: float | None = None,
    until: float | None = None,
    price_per_gpu_hour: float | None = None,
    currency: str = "",
    model: ModelShape | None = None,
    gpu: str = DEFAULT_GPU,
) -> DeciderReport:
    """The window ``window_s`` seconds before ``until`` (default: the store's newest sample, so a store read
    a month later still shows its last week) in buckets of ``bucket_s`` (``default_bucket_s``), per account.
    ``ConfigError`` for a window or bucket out of bounds; ``InputError`` when the store holds no sample and
    no job to place the window."""
    bucket_s = default_bucket_s(window_s) if bucket_s is None else bucket_s
    _checked(window_s, bucket_s)
    t1 = until if until is not None else _newest(store)
    t0 = t1 - window_s
    edges = bucket_edges(t0, t1, bucket_s)
    jobs = [j for j in store.jobs() if _overlaps(j, t0, t1)]
    goodputs = _goodputs(store, jobs, t0, t1)
    spans_by_job = {} if model is None else {j.id: store.spans(j.id) for j in jobs}
    per_bucket = [
        _bucket_tallies(b0, b1, store, jobs, goodputs, spans_by_job, model=model, gpu=gpu, until=t1)
        for b0, b1 in zip(edges[:-1], edges[1:])
    ]
    accounts = _series(per_bucket, edges, price_per_gpu_hour, model)
    return DeciderReport(
        t0=t0,
        t1=t1,
        bucket_s=bucket_s,
        edges=edges,
        price_per_gpu_hour=price_per_gpu_hour,
        currency=currency,
        accounts=accounts,
        tiers=_tiers(store, t0, t1),
        missing=_report_missing(accounts, store, t0, t1, price_per_gpu_hour, model),
    )


def _newest(store: Store) -> float:
    """The data's clock: the newest sample, else the newest job start or end."""
    newest = store.time_range()[1]
    if newest is not None:
        return float(newest)
    times = [t for j in store.jobs() for t in (j.start, j.end) if t is not None]
    if not times:
        raise InputError("the store holds no sample and no job: nothing to report")
    return max(times)


def _overlaps(job: Job, t0: float, t1: float) -> bool:
    return job.start is not None and job.start < t1 and (job.end is None or job.end > t0)


def _allocated_hours(job: Job, b0: float, b1: float, until: float) -> float:
    """GPUs × the part of the job's run inside (b0, b1]; a running job runs until ``until``."""
    if job.start is None:
        return 0.0
    end = job.end if job.end is not None else until
    return job.gpus * max(0.0, min(end, b1) - max(job.start, b0)) / HOUR_S


def _goodputs(store: Store, jobs: Sequence[Job], t0: float, t1: float) -> dict[str, GoodputReport]:
    """Each job's goodput whose accounted window ends after ``t0``; a job without steps has none (its wall
    time is not "0 % productive", it is unaccounted). A running job's window may end past ``t1`` (its spans
    arrive before the samples that set the data's clock): it counts in the last bucket."""
    out = {}
    for job in jobs:
        try:
            report = goodput_report(store, job.id)
        except InputError:
            continue
        if report.steps and report.total_s > 0 and report.t1 > t0:
            out[job.id] = report
    return out


def _bucket_samples(store: Store, b0: float, b1: float) -> pa.Table:
    """The samples of (b0, b1], read one bucket at a time so a week of a large cluster is never in memory at
    once (the store's bounds are inclusive; a sample at b0 is the previous bucket's)."""
    samples = store.samples(list(UTILISATION_METRICS), t0=b0, t1=b1)
    return samples.filter(pc.greater(samples.column("t"), b0))


@dataclass(slots=True)
class _Tally:
    """One account's running sums in one bucket."""

    jobs: set[str] = field(default_factory=set)
    allocated_h: float = 0.0
    observed_h: float = 0.0
    busy_h: float = 0.0
    util_seen: bool = False
    energy_kwh: float = 0.0
    energy_seen: bool = False
    productive_s: float = 0.0
    wall_s: float = 0.0
    mfu_sum: float = 0.0
    mfu_gpu_s: float = 0.0


def _bucket_tallies(
    b0: float,
    b1: float,
    store: Store,
    jobs: Sequence[Job],
    goodputs: dict[str, GoodputReport],
    spans_by_job: dict[str, list[Span]],
    *,
    model: ModelShape | None,
    gpu: str,
    until: float,
) -> dict[str | None, _Tally]:
    """Each account's sums in the bucket (b0, b1]."""
    tallies: dict[str | None, _Tally] = defaultdict(_Tally)
    account_of = {j.id: j.account for j in jobs}
    for job in jobs:
        hours = _allocated_hours(job, b0, b1, until)
        if hours > 0:
            tallies[job.account].allocated_h += hours
            tallies[job.account].jobs.add(job.id)
    sub = _bucket_samples(store, b0, b1)
    if sub.num_rows:
        for report in job_reports(sub, jobs, now=b1):
            if report.per_gpu:
                _add_samples(tallies[account_of.get(report.id, report.account)], report)
    for job_id, g in goodputs.items():
        if b0 < min(g.t1, until) <= b1:
            tally = tallies[account_of[job_id]]
            tally.productive_s += g.productive_s
            tally.wall_s += g.total_s
    if model is not None:
        for job_id, spans in spans_by_job.items():
            _add_mfu(tallies[account_of[job_id]], spans, b0, b1, model, gpu)
    return dict(tallies)


def _add_samples(tally: _Tally, report: JobReport) -> None:
    """Observed, busy GPU-hours and energy of one job's GPUs in one bucket."""
    tally.jobs.add(report.id)
    for g in report.per_gpu:
        tally.observed_h += g.observed_s / HOUR_S
        if g.mean_util_pct is not None:
            tally.busy_h += g.observed_s / HOUR_S * g.mean_util_pct / 100.0
            tally.util_seen = True
    if any(g.energy_kwh for g in report.per_gpu):
        tally.energy_kwh += report.energy_kwh
        tally.energy_seen = True


def _add_mfu(tally: _Tally, spans: Sequence[Span], b0: float, b1: float, model: ModelShape, gpu: str) -> None:
    """The job's MFU over its median step that started in the bucket, weighted by its GPU-seconds of steps."""
    steps = steps_from_spans(spans)
    inside = (steps.start_s > b0) & (steps.start_s <= b1)
    if not inside.any():
        return
    ranks = len({s.rank for s in spans})
    result = compute_mfu(
        params=model.params,
        layers=model.layers,
        d_model=model.d_model,
        seq=model.seq,
        tokens_per_step=model.tokens_per_step,
        step_time_s=float(np.median(steps.dur_s[inside])),
        gpus=ranks,
        gpu=gpu,
    )
    weight = ranks * float(steps.dur_s[inside].sum())
    tally.mfu_sum += result.mfu * weight
    tally.mfu_gpu_s += weight


def _figures(t: _Tally, b0: float, b1: float, price: float | None, model: ModelShape | None) -> AccountFigures:
    missing: dict[str, str] = {}
    busy = _or_missing(missing, "gpu_hours_busy", t.busy_h if t.util_seen else None, "no utilisation sample")
    return AccountFigures(
        t0=b0,
        t1=b1,
        jobs=len(t.jobs),
        gpu_hours_allocated=t.allocated_h,
        gpu_hours_observed=t.observed_h,
        gpu_hours_busy=busy,
        utilisation=_or_missing(
            missing,
            "utilisation",
            busy / t.observed_h if busy is not None and t.observed_h > 0 else None,
            "no utilisation sample of the account's jobs",
        ),
        coverage=_or_missing(
            missing, "coverage", t.observed_h / t.allocated_h if t.allocated_h > 0 else None, "no Slurm allocation"
        ),
        goodput=_or_missing(
            missing,
            "goodput",
            t.productive_s / t.wall_s if t.wall_s > 0 else None,
            "no job with recorded steps ended its accounted window here",
        ),
        goodput_productive_s=t.productive_s,
        goodput_wall_s=t.wall_s,
        mfu=_or_missing(
            missing,
            "mfu",
            t.mfu_sum / t.mfu_gpu_s if t.mfu_gpu_s > 0 else None,
            NO_MODEL if model is None else "no training step recorded",
        ),
        mfu_gpu_s=t.mfu_gpu_s,
        cost=_or_missing(missing, "cost", None if price is None else t.allocated_h * price, NO_PRICE),
        energy_kwh=_or_missing(missing, "energy_kwh", t.energy_kwh if t.energy_seen else None, "no GPU energy counter"),
        missing=missing,
    )


def _or_missing(missing: dict[str, str], name: str, value: float | None, why: str) -> float | None:
    if value is None:
        missing[name] = why
    return value


def _merged(tallies: Iterable[_Tally]) -> _Tally:
    """The window's sums from its buckets' (so its ratios are ratios of sums, never means of ratios)."""
    out = _Tally()
    for t in tallies:
        out.jobs |= t.jobs
        for name in (
            "allocated_h",
            "observed_h",
            "busy_h",
            "energy_kwh",
            "productive_s",
            "wall_s",
            "mfu_sum",
            "mfu_gpu_s",
        ):
            setattr(out, name, getattr(out, name) + getattr(t, name))
        out.util_seen |= t.util_seen
        out.energy_seen |= t.energy_seen
    return out


def _series(
    per_bucket: list[dict[str | None, _Tally]],
    edges: tuple[float, ...],
    price: float | None,
    model: ModelShape | None,
) -> tuple[AccountSeries, ...]:
    accounts = {a for bucket in per_bucket for a in bucket}
    out = []
    for account in accounts:
        tallies = [bucket.get(account) or _Tally() for bucket in per_bucket]
        buckets = tuple(_figures(t, edges[k], edges[k + 1], price, model) for k, t in enumerate(tallies))
        total = _figures(_merged(tallies), edges[0], edges[-1], price, model)
        out.append(AccountSeries(account=account, total=total, buckets=buckets))
    return tuple(sorted(out, key=lambda s: (-s.total.gpu_hours_allocated, s.account or "")))


def _tiers(store: Store, t0: float, t1: float) -> tuple[TierPoint, ...]:
    return tuple(
        TierPoint(t=e.t, tier=str(e.attrs.get("tier")), tier_number=TIER_NUMBERS.get(str(e.attrs.get("tier"))))
        for e in store.events(EventKind.ASSESSMENT, t0=t0, t1=t1)
    )


def _report_missing(
    accounts: Sequence[AccountSeries],
    store: Store,
    t0: float,
    t1: float,
    price: float | None,
    model: ModelShape | None,
) -> dict[str, str]:
    missing = {}
    if not accounts:
        missing["accounts"] = "no job ran in the window"
    if not store.events(EventKind.ASSESSMENT, t0=t0, t1=t1):
        missing["tiers"] = 'no stored assessment in the window (hpcwatch collect, task = "assess")'
    if price is None:
        missing["cost"] = NO_PRICE
    if model is None:
        missing["mfu"] = NO_MODEL
    return missing


def _figures_dict(f: AccountFigures) -> dict[str, Any]:
    return {name: getattr(f, name) for name in _FIGURE_FIELDS} | {"missing": dict(f.missing)}


_FIGURE_FIELDS = (
    "t0",
    "t1",
    "jobs",
    "gpu_hours_allocated",
    "gpu_hours_observed",
    "gpu_hours_busy",
    "utilisation",
    "coverage",
    "goodput",
    "mfu",
    "cost",
    "energy_kwh",
)


def decider_dict(report: DeciderReport) -> dict[str, Any]:
    """The JSON document of ``GET /api/decider``: the dataclasses' fields (the sums behind goodput and MFU
    left out), each account's ``total`` and ``buckets`` aligned on ``edges``."""
    return {
        "t0": report.t0,
        "t1": report.t1,
        "bucket_s": report.bucket_s,
        "edges": list(report.edges),
        "price_per_gpu_hour": report.price_per_gpu_hour,
        "currency": report.currency,
        "accounts": [
            {
                "account": s.account,
                "total": _figures_dict(s.total),
                "buckets": [_figures_dict(b) for b in s.buckets],
            }
            for s in report.accounts
        ],
        "tiers": [{"t": p.t, "tier": p.tier, "tier_number": p.tier_number} for p in report.tiers],
        "missing": dict(report.missing),
    }
