"""A digest: the jobs of one user or one account that ended in a period, with their totals and advice.

The jobs are ``reports.jobs.jobs_report``'s (what ``hpcwatch jobs --json`` lists), read from the first start of
the earliest of them on (a store keeps every sample since it was made; a day's digest of a 1,024-node store months
old read all of it), so a digest's figures are that report's figures summed: GPU-hours (allocation x elapsed, hours), energy (kWh,
measured by the GPUs' counters), and the mean GPU utilisation weighted by each job's GPU-hours
over the jobs that have one (a job without DCGM samples has none, and is left out of the mean
rather than counted as 0 %). Periods are UTC: a day from 00:00, a week from Monday 00:00.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from typing import Literal

from hpcwatch.analysis.attribution import JobReport
from hpcwatch.reports.jobs import first_start, jobs_report
from hpcwatch.store import Store

__all__ = ["Digest", "DigestPeriod", "digest_report", "digests", "last_period", "PERIODS"]

DigestPeriod = Literal["daily", "weekly"]
PERIODS: tuple[DigestPeriod, ...] = ("daily", "weekly")
_DAY_S = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    period: DigestPeriod
    t0: float
    """UTC seconds, the period's start (inclusive)."""
    t1: float
    """UTC seconds, its end (exclusive)."""
    user: str | None
    account: str | None
    jobs: tuple[JobReport, ...]
    """The jobs that ended in [t0, t1), by end time."""
    gpu_hours: float
    """Sum of the jobs' ``gpu_hours``."""
    energy_kwh: float
    mean_gpu_util: float | None
    """GPU-hour-weighted mean of the jobs' ``mean_gpu_util`` (%), over the jobs that have one."""
    idle_gpus: int
    """Sum of the jobs' ``idle_gpus``."""


def last_period(period: DigestPeriod, now: float) -> tuple[float, float]:
    """The last whole day (or Monday-to-Monday week) before ``now``, UTC: (start, end) in seconds."""
    day = calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0))
    if period == "daily":
        return float(day - _DAY_S), float(day)
    monday = day - time.gmtime(now).tm_wday * _DAY_S
    return float(monday - 7 * _DAY_S), float(monday)


def digest_report(
    store: Store,
    *,
    period: DigestPeriod,
    t0: float,
    t1: float,
    user: str | None = None,
    account: str | None = None,
) -> Digest:
    """One user's or one account's digest of [t0, t1) (both None: every job's)."""
    reports = _ended_reports(store, t0=t0, t1=t1, user=user, account=account)
    return _digest(reports, period=period, t0=t0, t1=t1, user=user, account=account)


def digests(store: Store, *, period: DigestPeriod, t0: float, t1: float) -> tuple[list[Digest], list[Digest]]:
    """Every user's digest and every account's of [t0, t1), from one ``jobs_report`` (users, accounts with a
    job that ended then, sorted by name)."""
    ended = _ended_reports(store, t0=t0, t1=t1)
    users = sorted({r.user for r in ended if r.user})
    accounts = sorted({r.account for r in ended if r.account})
    return (
        [_digest([r for r in ended if r.user == u], period=period, t0=t0, t1=t1, user=u, account=None) for u in users],
        [
            _digest([r for r in ended if r.account == a], period=period, t0=t0, t1=t1, user=None, account=a)
            for a in accounts
        ],
    )


def _ended_reports(
    store: Store, *, t0: float, t1: float, user: str | None = None, account: str | None = None
) -> list[JobReport]:
    """The reports of the jobs that ended in [t0, t1), from the samples since the first start of the earliest of
    them (``jobs_report``'s ``since``): each such job's report is the one a read of every sample gives, its
    series' scrape intervals (the median gap) taken from the samples read, as its job page takes them."""
    ended = [j for j in store.jobs() if j.end is not None and t0 <= j.end < t1]
    since = min((s for s in (first_start(store, j) for j in ended) if s is not None), default=None)
    if since is None:
        return []
    ids = {j.id for j in ended}
    reports = jobs_report(store, user=user, account=account, since=since)
    return [r for r in reports if r.id in ids and r.end is not None and t0 <= r.end < t1]


def _digest(
    reports: list[JobReport], *, period: DigestPeriod, t0: float, t1: float, user: str | None, account: str | None
) -> Digest:
    ended = sorted(
        (r for r in reports if r.end is not None and t0 <= r.end < t1),
        key=lambda r: (r.end or 0.0, r.id),
    )
    weighted = [(r.gpu_hours, r.mean_gpu_util) for r in ended if r.mean_gpu_util is not None]
    weight = sum(w for w, _ in weighted)
    mean = sum(w * u for w, u in weighted) / weight if weight > 0 else None
    return Digest(
        period=period,
        t0=t0,
        t1=t1,
        user=user,
        account=account,
        jobs=tuple(ended),
        gpu_hours=sum(r.gpu_hours for r in ended),
        energy_kwh=sum(r.energy_kwh for r in ended),
        mean_gpu_util=mean,
        idle_gpus=sum(r.idle_gpus for r in ended),
    )
