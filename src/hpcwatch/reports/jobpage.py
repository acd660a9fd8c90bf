"""One job, every question at once: what the web's job page shows (``GET /job/ID``, ``GET /api/job/ID``).

The parts are the reports the CLI already has, called here once so the page computes nothing:

- ``job``      ``reports.jobs.job_report`` (what ``hpcwatch job ID`` prints): per GPU, IB, Lustre, energy
- ``steps``    ``reports.steps.step_report`` over the job's last ``DEFAULT_RECENT_STEPS`` steps
  (what ``hpcwatch steps`` and the player's verdict use): step time, phase medians per rank, straggler
- ``goodput``  ``reports.goodput.goodput_report`` (what ``hpcwatch goodput`` prints)
- ``findings`` the stored findings that concern the job (``concerns_job``)
- ``cost``     ``reports.jobs.job_cost``: GPU-hours × the configured price, energy (``hpcwatch job --json``'s)
- ``timeline`` ``reports.timeline.job_timeline``: the job's story, oldest first (XID → stop → requeue →
  restore), with the steps its failures lost (goodput's ``lost_steps``)
- ``acting``   ``reports.acting.job_acting``: the notices sent and the actions taken (and undone) about the
  job, or on its nodes while it ran
- ``series``   ``reports.jobseries.job_series``: utilisation, power, step time, IB and Lustre over the job's
  life, at most ``MAX_BUCKETS`` points each, from the same samples as ``job``

A part the store cannot answer (no spans, no goodput events) is ``None`` with the reason in
``missing``: "no steps recorded" and "could not compute" are said, not shown as zeros.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from hpcwatch.analysis.attribution import GpuReport, JobReport, report_dict
from hpcwatch.analysis.goodput import GoodputReport, StepTable
from hpcwatch.analysis.steps import WORK_PHASES
from hpcwatch.errors import InputError
from hpcwatch.records import PHASES, Finding, Job
from hpcwatch.reports import jobstretches
from hpcwatch.reports.acting import job_acting
from hpcwatch.reports.goodput import goodput_with_steps
from hpcwatch.reports.jobs import JobCost, check_job_id, cost_dict, first_start, job_cost, job_report
from hpcwatch.reports.jobseries import JobSeries, job_series, series_dict
from hpcwatch.reports.jobstretches import REPORT_ON_DISK, KeptStretches
from hpcwatch.reports.livejob import live_verdicts
from hpcwatch.reports.steps import DEFAULT_RECENT_STEPS, StepReport, recent_step_report
from hpcwatch.reports.timeline import job_timeline

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = [
    "JobOverview",
    "OverviewCache",
    "DEFAULT_CACHED_OVERVIEWS",
    "JobSteps",
    "RankPhases",
    "job_overview",
    "overview_dict",
    "concerns_job",
    "JOB_EVIDENCE_KEYS",
    "SHOWN_ROWS",
    "ShownRows",
    "rows_to_show",
]

#: Evidence keys under which detectors name the job a finding is about (``security/``: ``job``; the
#: dcgm-exporter label ``hpc_job``; Slurm's ``job_id``).
JOB_EVIDENCE_KEYS = ("job", "hpc_job", "job_id", "jobid")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankPhases:
    """One rank's median seconds per phase over the recent steps (``records.PHASES`` order)."""

    rank: int
    node: str | None
    gpu: int | None
    phase_s: tuple[float | None, ...]
    """Median over the steps of each phase of ``records.PHASES``; None where the rank never ran it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSteps:
    """The job's recent steps as ``hpcwatch steps`` judges them."""

    first_step: int
    last_step: int
    steps: int
    """Steps in the window (at most ``DEFAULT_RECENT_STEPS``)."""
    step_time_s: float | None
    """Median step time (the slowest rank's per step)."""
    ranks: tuple[RankPhases, ...]
    straggler: dict[str, Any] | None
    """``rank, node, gpu, phase, excess_s, score``; None when no rank stands out."""
    no_verdict: str | None = None
    """Why no straggler is named when the steps cannot carry a verdict (``StragglerReport.no_verdict``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOverview:
    id: str
    job: JobReport | None
    """None for a workload the store knows only from its spans (a hook's or a trace's job name)."""
    steps: JobSteps | None
    goodput: GoodputReport | None
    findings: tuple[Finding, ...]
    cost: JobCost | None = None
    """None for a workload without a job report."""
    timeline: tuple[dict[str, Any], ...] = ()
    """``reports.timeline.job_timeline``: entries ``t``, ``what``, ``node``, ``gpu``, ``job``, ``detail``."""
    missing: dict[str, str] = field(default_factory=dict)
    """Part (``job``, ``steps``, ``goodput``) -> why it is None (the report's own message)."""
    acting: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """``reports.acting.job_acting``: ``notices`` and ``actions``, newest first."""
    live: tuple[dict[str, Any], ...] = ()
    """``reports.livejob.live_verdicts``: the newest live straggler, hang, dump and trace (``kind``, ``t``,
    ``attrs``), newest first; empty when the job never streamed."""
    series: JobSeries | None = None
    """``reports.jobseries.job_series``: the charts over the job's life; None without a window."""


def concerns_job(finding: Finding, job_id: str, nodes: tuple[str, ...], t0: float | None, t1: float | None) -> bool:
    """A finding is the job's when it names the job (target or evidence), or targets one of its nodes
    while it ran (ours: a node-level finding during the run is what its owner must hear of)."""
    if finding.target == job_id or any(str(finding.evidence.get(k)) == job_id for k in JOB_EVIDENCE_KEYS):
        return True
    if finding.target not in nodes or t0 is None:
        return False
    return finding.t >= t0 and (t1 is None or finding.t <= t1)


def _phase_medians(report: StepReport) -> tuple[RankPhases, ...]:
    """Each rank's median seconds per phase over the steps, as the straggler scores took them (one median per
    rank and phase over its steps that are not NaN; None where it has none), placed as the anatomy places it."""
    anatomy = report.anatomy
    out = []
    for score in report.stragglers.ranks:
        node, gpu = anatomy.placement.get(score.rank, (None, None))
        phase_s = tuple(None if math.isnan(v := score.phases[p]) else v for p in PHASES)
        out.append(RankPhases(rank=score.rank, node=node, gpu=gpu, phase_s=phase_s))
    return tuple(out)


def _steps(report: StepReport) -> JobSteps:
    found = report.straggler
    straggler = (
        None
        if found is None
        else {
            "rank": found.rank,
            "node": found.node,
            "gpu": found.gpu,
            "phase": found.phase,
            "excess_s": found.excess_s,
            "score": found.score,
        }
    )
    steps = report.anatomy.steps
    return JobSteps(
        first_step=steps[0] if steps else 0,
        last_step=steps[-1] if steps else 0,
        steps=len(steps),
        step_time_s=report.step_time_s,
        ranks=_phase_medians(report),
        straggler=straggler,
        no_verdict=report.stragglers.no_verdict,
    )


def job_overview(
    store: Store,
    job_id: str,
    *,
    samples: pa.Table | None = None,
    recent_steps: int = DEFAULT_RECENT_STEPS,
    price_per_gpu_hour: float | None = None,
    currency: str = "",
    summary: bool = False,
    kept: KeptStretches | None = None,
) -> JobOverview:
    """Every part of ``job_id``'s page; a part the store cannot answer only sets ``missing``.
    ``InputError`` (``job_report``'s) when no part answers: the store knows nothing of the job, or
    ``job_id`` is longer than any id (``check_job_id``: refused before any part asks the store).
    ``summary``: only what a job-end report shows (the job, its steps, goodput and findings), without the
    page's cost, timeline, actions, live verdicts and charts: half the queries, for one mail per job end.
    ``kept``: the settled stretches of the job's report a server keeps between pages (``reports.jobstretches``)."""
    check_job_id(job_id)
    missing: dict[str, str] = {}
    price = price_per_gpu_hour
    # The spans' parts in a thread beside the samples' (their queries and numpy work overlap: the store runs
    # each thread's reads on a cursor of its own): at 1,536 GPUs and ranks each side is a few tenths of a
    # second. There the goodput, then the steps, then the story and live verdicts (they need nothing of the
    # report); here the report, then, with the goodput's steps, the charts and the page's smaller parts, while
    # the steps are taken apart (waiting for both before those left each thread idle in turn).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobpage-spans") as pool:
        from_goodput = pool.submit(_goodput_part, store, job_id, kept)
        from_steps = pool.submit(_steps_part, store, job_id, recent_steps, kept, from_goodput)
        from_story = None if summary else pool.submit(_story_part, store, job_id, kept)
        # A window of one stretch is read once for the report and the charts, and with ``kept`` its end is kept
        # (the next page reads on from it); a longer one stretch by stretch (a day of a 1,536-GPU job is more than
        # a server holds at once), from what ``kept`` holds of it on.
        record = store.job(job_id)
        started = first_start(store, record)
        window = None
        if (
            samples is None
            and record is not None
            and started is not None
            and _may_fit_one_read(store, record, started, kept)
        ):
            window = jobstretches.read_short_window(store, record, started)
        # What the report reads in one query after its checkpoint, the charts read again from memory.
        reads = jobstretches.PageReads() if samples is None and window is None and kept is not None else None
        job = _part(
            missing,
            "job",
            lambda: job_report(store, job_id, samples=samples, kept=kept, window=window, reads=reads),
        )
        accounted, missed = from_goodput.result()
        missing |= missed
        goodput, executed = accounted if accounted is not None else (None, StepTable.empty())
        if goodput is not None and goodput.total_s <= 0:
            # A running job without steps has no wall time to split yet: "0 % of 0 s" would read as a verdict.
            missing["goodput"] = f"job {job_id}: no wall time to account yet (no steps, no end)"
            goodput = None
        page_parts = None
        if from_story is not None and (job is not None or goodput is not None):  # else: known from its steps
            page_parts = _page_parts(
                store, job_id, job, executed, started, samples, kept, window, reads, price, currency, from_story
            )
        steps, missed = from_steps.result()
    missing |= missed
    if job is None and steps is None and goodput is None:
        raise InputError(missing["job"])
    nodes = job.nodes if job is not None else tuple(sorted({r.node for r in steps.ranks if r.node})) if steps else ()
    t0 = None if job is None else job.start if job.start is not None else job.observed_start
    t1 = None if job is None else job.end
    findings = tuple(f for f in store.findings() if concerns_job(f, job_id, nodes, t0, t1))
    if summary:
        return JobOverview(id=job_id, job=job, steps=steps, goodput=goodput, findings=findings, missing=missing)
    if page_parts is None:  # a workload known from its steps alone: its nodes are theirs
        assert from_story is not None  # not a summary
        page_parts = _page_parts(
            store,
            job_id,
            job,
            executed,
            started,
            samples,
            kept,
            window,
            reads,
            price,
            currency,
            from_story,
            nodes=nodes,
        )
    return JobOverview(
        id=job_id, job=job, steps=steps, goodput=goodput, findings=findings, missing=missing, **page_parts
    )


def _page_parts(
    store: Store,
    job_id: str,
    job: JobReport | None,
    executed: StepTable,
    started: float | None,
    samples: pa.Table | None,
    kept: KeptStretches | None,
    window: jobstretches.WindowRead | None,
    reads: jobstretches.PageReads | None,
    price_per_gpu_hour: float | None,
    currency: str,
    story: Future[tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]],
    *,
    nodes: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The page's parts beyond a job-end report's (``JobOverview``'s fields of those names): its charts, cost,
    story, notices and actions, live verdicts (``story``: the story and the live verdicts, read beside).
    ``nodes``: the job's (default: its report's)."""
    if nodes is None:
        nodes = job.nodes if job is not None else ()
    t0 = None if job is None else job.start if job.start is not None else job.observed_start
    t1 = None if job is None else job.end
    series = job_series(
        store,
        job_id,
        report=job,
        samples=samples,
        steps=executed,
        first_start=started,
        kept=kept,
        window=window,
        reads=reads,
    )
    acting = job_acting(store, job_id, nodes=nodes, t0=t0, t1=t1)
    timeline, live = story.result()
    return {
        "series": series,
        "cost": None if job is None else job_cost(job, price_per_gpu_hour=price_per_gpu_hour, currency=currency),
        "timeline": timeline,
        "acting": acting,
        "live": live,
    }


#: A job page lists at most this many GPUs, and as many ranks: those to look at first, with a link to every row.
#: A 1,536-GPU job's two tables were 3,000 rows, 800 KB of HTML that nobody reads down, a quarter of the page's
#: time at 1,024 nodes; the API (``GET /api/job/ID``) keeps every row. Ours.
SHOWN_ROWS = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class ShownRows:
    """The rows of a job page's per-GPU and per-rank tables (``rows_to_show``)."""

    gpus: tuple[GpuReport, ...]
    ranks: tuple[RankPhases, ...]
    all_gpus: int
    all_ranks: int


def rows_to_show(overview: JobOverview, limit: int | None = SHOWN_ROWS) -> ShownRows:
    """Every GPU and rank of the job, in their order (host and GPU; rank), when each table holds at most
    ``limit`` rows (None: no limit). A larger table lists its ``limit`` rows to look at first, worst first:
    GPUs with XID errors (most first), then idle while allocated, then by mean utilisation, lowest first;
    the straggler's rank, then by median work per step (load, forward, backward, optimizer), slowest first."""
    gpus = () if overview.job is None else overview.job.per_gpu
    ranks = () if overview.steps is None else overview.steps.ranks
    if limit is not None and len(gpus) > limit:
        gpus = tuple(sorted(gpus, key=_gpu_concern)[:limit])
    if limit is not None and len(ranks) > limit:
        slow = overview.steps.straggler if overview.steps is not None else None
        straggler = slow["rank"] if slow else None
        ranks = tuple(sorted(ranks, key=lambda r: (r.rank != straggler, -_work_s(r), r.rank))[:limit])
    all_gpus = 0 if overview.job is None else len(overview.job.per_gpu)
    all_ranks = 0 if overview.steps is None else len(overview.steps.ranks)
    return ShownRows(gpus=tuple(gpus), ranks=tuple(ranks), all_gpus=all_gpus, all_ranks=all_ranks)


def _gpu_concern(g: GpuReport) -> tuple[int, bool, float, str, int, str]:
    """The key that puts the GPUs to look at first in front (``rows_to_show``); ties by host and GPU."""
    util = g.mean_util_pct if g.mean_util_pct is not None else float("inf")  # no sample: nothing to judge by
    return (-g.xid_errors, not g.idle, util, g.host, _index(g.gpu), g.device)


def _index(gpu: str) -> int:
    return int(gpu) if gpu.isdigit() else -1


def _work_s(r: RankPhases) -> float:
    """A rank's median seconds per step in the phases that are its own work (``analysis.steps.WORK_PHASES``)."""
    return sum(v for p, v in zip(PHASES, r.phase_s) if p in WORK_PHASES and v is not None)


def _goodput_part(
    store: Store, job_id: str, kept: KeptStretches | None
) -> tuple[tuple[GoodputReport, StepTable] | None, dict[str, str]]:
    """The goodput and the executed steps, from every step (grouped in the store: a 1,536-rank job of 15 minutes
    holds 8 million spans; with ``kept``, only those since its checkpoint); why not under ``goodput``."""
    missing: dict[str, str] = {}
    return _part(missing, "goodput", lambda: goodput_with_steps(store, job_id, kept=kept)), missing


def _steps_part(
    store: Store,
    job_id: str,
    recent_steps: int,
    kept: KeptStretches | None,
    from_goodput: Future[tuple[tuple[GoodputReport, StepTable] | None, dict[str, str]]],
) -> tuple[JobSteps | None, dict[str, str]]:
    """The steps of the page, from the spans of the last ``recent_steps``, read from the first start among them
    that the goodput's steps give; why not under ``steps``."""
    accounted, _ = from_goodput.result()
    since = accounted[1].first_start_of_last(recent_steps) if accounted is not None else None
    missing: dict[str, str] = {}
    steps = _part(
        missing,
        "steps",
        lambda: _steps(recent_step_report(store, job_id, recent_steps=recent_steps, since=since, kept=kept)),
    )
    return steps, missing


def _story_part(
    store: Store, job_id: str, kept: KeptStretches | None
) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """The page's story (``job_timeline``) and live verdicts: reads of the store that need nothing the report
    computes, so they run on the spans' thread once the steps are done, while the report's thread draws the
    charts (at 1,536 GPUs the spans' thread was idle ~50 ms at the end of a page, the report's ~40 ms longer
    for these)."""
    return tuple(job_timeline(store, job_id, kept=kept)), _live(store, job_id)


#: Overviews an ``OverviewCache`` keeps: a few jobs' pages (each 1,536 GPUs and ranks at most), not a history.
DEFAULT_CACHED_OVERVIEWS = 8


class OverviewCache:
    """The last ``size`` overviews, each keyed by (job, the store's version, price, currency): a store not
    written since answers the same page at once (a post-mortem's store, a cluster at rest; at 1,024 nodes a
    page is seconds of work), and the next commit makes every entry a miss. Exact: an overview reads the
    store and nothing else (no clock). Safe to share between threads; two misses at once both compute."""

    def __init__(self, size: int = DEFAULT_CACHED_OVERVIEWS, *, on_disk: bool = False) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[Any, ...], JobOverview] = OrderedDict()
        self._lock = threading.Lock()
        self.kept = KeptStretches(on_disk=on_disk)
        """What a miss reads no more: each job's settled stretches (``reports.jobstretches``; ``on_disk``: also
        in the store's folder, for the next process: ``reports.checkpointfiles``)."""

    def overview(
        self,
        store: Store,
        job_id: str,
        *,
        price_per_gpu_hour: float | None = None,
        currency: str = "",
        compute: Callable[[], JobOverview] | None = None,
    ) -> JobOverview:
        """``job_overview(store, job_id, ...)``, from the cache when the store has not changed since; ``compute``:
        how a miss computes it instead (a server's page process, ``web.pageprocess``)."""
        key = (job_id, store.config.path, store.version, price_per_gpu_hour, currency)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        if compute is not None:
            found = compute()
        else:
            found = job_overview(
                store, job_id, price_per_gpu_hour=price_per_gpu_hour, currency=currency, kept=self.kept
            )
        with self._lock:
            self._entries[key] = found
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return found


def _may_fit_one_read(store: Store, record: Job, t0: float, kept: KeptStretches | None) -> bool:
    """Whether ``record``'s window from ``t0`` (its first start) is worth reading at once, for the report and the
    charts (``reports.jobstretches.read_short_window``, which gives it up past one stretch's rows): below a
    stretch, one read costs less than the stretches' and checkpoints' work per GPU. Not for a workload known
    from labels only (its report reads the store's samples whole), nor for a window ``kept`` holds checkpoints
    of (it was longer; the next page reads on from them)."""
    return bool(record.nodes) and not (kept is not None and kept.holds(store, "report", record, t0, REPORT_ON_DISK))


def _live(store: Store, job_id: str) -> tuple[dict[str, Any], ...]:
    found = live_verdicts(store, job_id)
    events = [e for e in (found.straggler, found.hang, found.dump, found.trace) if e is not None]
    return tuple({"kind": e.kind, "t": e.t, "attrs": dict(e.attrs)} for e in sorted(events, key=lambda e: -e.t))


def _part(missing: dict[str, str], name: str, compute: Any) -> Any:
    """``compute()``, or None with its ``InputError`` message noted under ``name``."""
    try:
        return compute()
    except InputError as err:
        missing[name] = str(err)
        return None


def overview_dict(overview: JobOverview) -> dict[str, Any]:
    """The JSON document of ``GET /api/job/ID``: ``job`` is ``hpcwatch job ID --json``, ``goodput`` is
    ``hpcwatch goodput --json``'s report, ``steps`` and ``findings`` as described in the dataclasses."""
    steps = overview.steps
    return {
        "id": overview.id,
        "job": None if overview.job is None else report_dict(overview.job, per_gpu=True),
        "steps": None
        if steps is None
        else {
            "first_step": steps.first_step,
            "last_step": steps.last_step,
            "steps": steps.steps,
            "step_time_s": steps.step_time_s,
            "phases": list(PHASES),
            "straggler": steps.straggler,
            "ranks": [{"rank": r.rank, "node": r.node, "gpu": r.gpu, "phase_s": list(r.phase_s)} for r in steps.ranks],
        },
        "goodput": None if overview.goodput is None else overview.goodput.to_dict(),
        "cost": None if overview.cost is None else cost_dict(overview.cost),
        "timeline": [dict(e) for e in overview.timeline],
        "findings": [
            {
                "vector": f.vector,
                "severity": f.severity,
                "target": f.target,
                "title": f.title,
                "rule": f.rule,
                "t": f.t,
                "evidence": dict(f.evidence),
            }
            for f in overview.findings
        ],
        "missing": dict(overview.missing),
        "acting": {k: list(v) for k, v in overview.acting.items()},
        "live": [dict(e) for e in overview.live],
        "series": series_dict(overview.series),
    }
