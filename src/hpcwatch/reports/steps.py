"""Step reports: a job's step anatomy, step time and stragglers, and the one step the web's player shows.

One step time (``analysis.steps.step_times_s``: the slowest rank's) and one
straggler rule (``analysis.stragglers.find_stragglers``) for every view: the
CLI's ``steps``, the exporter's ``hpcwatch_job_step_seconds`` /
``hpcwatch_job_stragglers``, the web's player (which only draws the verdict it
is given) and the live card.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hpcwatch.analysis.reduce import RankGpu, RankReduction, reduce_trace
from hpcwatch.analysis.steps import (
    Anatomy,
    anatomy_from_spans,
    anatomy_from_timelines,
    median_step_time_s,
    step_times_s,
)
from hpcwatch.analysis.stragglers import Straggler, StragglerConfig, StragglerReport, find_stragglers
from hpcwatch.errors import InputError
from hpcwatch.records import PHASES, Job, Span
from hpcwatch.traces import KinetoTrace

if TYPE_CHECKING:
    from hpcwatch.analysis.whatif import WhatIf  # imported when a trace set's report is built
    from hpcwatch.store import Store  # only the store-reading reports need it; ``steps TRACE`` never opens a store

__all__ = [
    "StepReport",
    "PlayerPhase",
    "PlayerRank",
    "PlayerVerdict",
    "PlayerStep",
    "LiveTraining",
    "step_report",
    "step_report_of",
    "RankGpu",
    "GpuClock",
    "trace_report",
    "reduced_report",
    "reduce_trace_file",
    "GPU_BOUND_LAG_FRACTION",
    "player_step",
    "player_jobs",
    "jobs_with_spans",
    "live_training",
    "placement_from_job",
    "DEFAULT_RECENT_STEPS",
    "PLAYER_JOBS_LISTED",
]

DEFAULT_RECENT_STEPS = 50
"""Training reports of a running job look at its last N steps: recent enough to move, long enough for a median."""
PLAYER_JOBS_LISTED = 8
"""Jobs the player offers when no pair is configured: the most recent ones."""

Placement = Mapping[int, tuple[str | None, int | None]]


# ``hpcwatch.store.queries`` is imported by the functions that use it: it loads pyarrow and duckdb (0.17 s),
# which the reports on traces given as files never need.


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    """A job's (or a trace set's) steps: anatomy, each step's time, the median, the straggler report."""

    anatomy: Anatomy
    stragglers: StragglerReport
    step_times_s: tuple[float, ...]
    """Per step of ``anatomy.steps``: the slowest rank's step time (``analysis.steps.step_times_s``)."""
    step_time_s: float | None
    """Median of ``step_times_s``; ``None`` without complete steps."""
    whatif: WhatIf | None = None
    """The what-if slowdown of a trace set's steps (``analysis.whatif.whatif_anatomy``); ``None`` for a job's
    spans from the store (``hpcwatch whatif --job`` has it) or when no step has every rank."""

    @property
    def straggler(self) -> Straggler | None:
        """The most severe straggler, if any."""
        return self.stragglers.stragglers[0] if self.stragglers.stragglers else None


#: The GPU is "GPU-bound" (kernels queue up behind the host) when its work ends this fraction of a step
#: or more after the host's step ends; under it the GPU keeps up and waits for launches ("launch-bound").
#: Ours: 5 % is above the launch latency of a step's last kernel (~10 µs) on any step over 0.2 ms.
GPU_BOUND_LAG_FRACTION = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuClock:
    """The step on the GPU's clock against the host's, and what the gap says."""

    gpu_step_s: float
    """Median GPU step period (``RankStep.gpu_period_s``, slowest rank per step)."""
    host_step_s: float
    """Median host step (``ProfilerStep#N``), labelled as the host's."""
    gpu_lag_s: float
    """Median over ranks and steps of (end of the step's GPU work − end of its host step)."""
    queue_depth_steps: float
    """``gpu_lag_s`` / ``gpu_step_s``: how many steps the host runs ahead."""
    bound: str
    """``gpu`` (kernels queue behind the host) or ``launch`` (the GPU waits for the host's launches)."""


def _gpu_clock(anatomy: Anatomy) -> GpuClock | None:
    if not anatomy.has_gpu:
        return None
    gpu_step = float(np.median(step_times_s(anatomy)))
    host = float(np.nanmedian(np.nanmax(anatomy.matrix("host_dur_s"), axis=0)))
    lag = float(np.nanmedian(anatomy.matrix("gpu_lag_s")))
    depth = lag / gpu_step if gpu_step > 0 else 0.0
    return GpuClock(
        gpu_step_s=gpu_step,
        host_step_s=host,
        gpu_lag_s=lag,
        queue_depth_steps=max(depth, 0.0),
        bound="gpu" if lag >= GPU_BOUND_LAG_FRACTION * gpu_step else "launch",
    )


def trace_report(
    traces: Sequence[KinetoTrace], *, config: StragglerConfig | None = None
) -> tuple[StepReport, GpuClock | None, tuple[RankGpu, ...]]:
    """A trace set's steps (GPU-first), its GPU clock against the host's, and each rank's GPU breakdowns."""
    return reduced_report([reduce_trace(t) for t in traces], config=config)


def reduced_report(
    reductions: Sequence[RankReduction], *, config: StragglerConfig | None = None
) -> tuple[StepReport, GpuClock | None, tuple[RankGpu, ...]]:
    """``trace_report`` of traces already reduced (``analysis.reduce.reduce_trace``, here or on Dask workers):
    the cross-rank half, the one every path of ``hpcwatch steps`` ends in."""
    report = step_report_of(anatomy_from_timelines([r.timeline for r in reductions]), config=config)
    report = replace(report, whatif=_whatif(report.anatomy))
    per_rank = tuple(r.gpu for r in sorted(reductions, key=lambda r: r.rank) if r.gpu is not None)
    return report, _gpu_clock(report.anatomy), per_rank


def _whatif(anatomy: Anatomy) -> WhatIf | None:
    from hpcwatch.analysis.whatif import whatif_anatomy

    try:
        return whatif_anatomy(anatomy)
    except InputError:
        return None  # no step that every rank finished: nothing to replay (the report's steps say so)


def reduce_trace_file(path: str | os.PathLike[str]) -> tuple[RankReduction, tuple[str, ...]]:
    """Read one rank's Kineto trace and reduce it, with the warnings its reader gave.

    The one per-rank task of ``hpcwatch steps``, whoever runs it: this process, a forked reader
    or a Dask worker. Only this rank's trace is in memory while it runs.
    """
    from hpcwatch.sources.registry import ReadContext, format_named

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = format_named("kineto").read(Path(path), ReadContext())
    return reduce_trace(trace), tuple(str(w.message) for w in caught)


def placement_from_job(job: Job, ranks: Sequence[int]) -> dict[int, tuple[str | None, int | None]] | None:
    """rank → (node, GPU) assuming the launcher's default order: nodes in order, GPUs in order on each."""
    slots = [(node, g) for node in job.nodes for g in job.gpus_by_node.get(node, ())]
    if len(slots) < len(ranks):
        return None
    return {r: slots[i] for i, r in enumerate(sorted(ranks))}


def step_report_of(
    anatomy: Anatomy, *, placement: Placement | None = None, config: StragglerConfig | None = None
) -> StepReport:
    """The report of an anatomy already built (from traces, hook files, or spans)."""
    report = find_stragglers(anatomy, config, placement=placement)
    return StepReport(
        anatomy=anatomy,
        stragglers=report,
        step_times_s=tuple(float(x) for x in step_times_s(anatomy)),
        step_time_s=median_step_time_s(anatomy),
    )


def step_report(
    store: Store, job_id: str, *, recent_steps: int | None = None, config: StragglerConfig | None = None
) -> StepReport:
    """``job_id``'s steps from its stored spans (its last ``recent_steps`` only, when given).

    Ranks the spans do not place are placed from the job record (launcher order).
    ``InputError`` when the job has no spans of a training phase.
    """
    from hpcwatch.store import queries

    spans = store.spans(job_id) if recent_steps is None else queries.recent_spans(store, job_id, steps=recent_steps)
    if not spans:
        raise InputError(f"job {job_id}: no step spans in the store")
    anatomy = anatomy_from_spans(spans)
    job = store.job(job_id)
    placement = None if anatomy.placement or job is None else placement_from_job(job, anatomy.ranks)
    return step_report_of(anatomy, placement=placement, config=config)


# -- the web's step player -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PlayerPhase:
    phase: str
    start_s: float
    """Seconds from the start of the step (the earliest span of any rank)."""
    dur_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PlayerRank:
    rank: int
    node: str | None
    gpu: int | None
    phases: tuple[PlayerPhase, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlayerVerdict:
    """The straggler the player marks, decided here from the job's recent steps, and why."""

    rank: int
    node: str | None
    gpu: int | None
    phase: str
    """The work phase in which it is slow."""
    phase_s: float
    """Its duration of that phase in the shown step."""
    excess_s: float
    """Median extra work per step over the median rank (recent steps)."""
    score: float
    """Relative score (fastest rank's work / its work)."""
    others_wait_s: float
    """Mean barrier wait of the other ranks in the shown step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlayerStep:
    job: str
    step: int
    steps: tuple[int, int]
    """[first, last] step numbers with spans for this job."""
    step_time_s: float
    """The shown step's time (``analysis.steps.step_times_s``)."""
    ranks: tuple[PlayerRank, ...]
    straggler: PlayerVerdict | None
    max_wait_s: float
    """The longest barrier wait of the shown step (over the ranks other than the straggler)."""
    reference_rank: int
    """A rank that is not the straggler, whose phase the player's readout follows."""


def _shown_step(store: Store, job: str, step: int | None) -> tuple[int, int, int]:
    from hpcwatch.store import queries

    first, last = queries.step_range(store, job)
    if first is None or last is None:  # None together: the job has no spans
        raise InputError(f"no spans for job {job!r}")
    if step is None:
        # The newest step may still be arriving rank by rank; take the newest step every rank has finished.
        done = queries.last_step_every_rank_finished(store, job)
        step = done if done is not None else last
    return first, last, step


def _player_ranks(spans: list[Span], t0: float) -> tuple[PlayerRank, ...]:
    by_rank: dict[int, list[Span]] = {}
    for s in spans:
        by_rank.setdefault(s.rank, []).append(s)
    return tuple(
        PlayerRank(
            rank=r,
            node=_opt_str(mine[0].attrs.get("node")),
            gpu=_opt_int(mine[0].attrs.get("gpu")),
            phases=tuple(PlayerPhase(phase=s.phase, start_s=s.start - t0, dur_s=s.dur) for s in mine),
        )
        for r, mine in sorted(by_rank.items())
    )


def _phase_s(rank: PlayerRank, phase: str) -> float:
    return sum(p.dur_s for p in rank.phases if p.phase == phase)


def _verdict(job_report: StepReport | None, ranks: tuple[PlayerRank, ...]) -> PlayerVerdict | None:
    found = job_report.straggler if job_report is not None else None
    mine = next((r for r in ranks if found is not None and r.rank == found.rank), None)
    if found is None or mine is None:
        return None
    waits = [_phase_s(r, "barrier_wait") for r in ranks if r.rank != found.rank]
    return PlayerVerdict(
        rank=found.rank,
        node=mine.node if mine.node is not None else found.node,
        gpu=mine.gpu if mine.gpu is not None else found.gpu,
        phase=found.phase,
        phase_s=_phase_s(mine, found.phase),
        excess_s=found.excess_s,
        score=found.score,
        others_wait_s=sum(waits) / len(waits) if waits else 0.0,
    )


def player_step(
    store: Store, job: str, step: int | None = None, *, recent_steps: int = DEFAULT_RECENT_STEPS
) -> PlayerStep:
    """One step of ``job`` per rank and phase (``records.PHASES`` only), with the straggler verdict of the
    job's last ``recent_steps`` steps (the exporter's). ``step`` defaults to the newest step every rank
    finished. ``InputError`` when the job or the step has no spans."""
    first, last, step = _shown_step(store, job, step)
    spans = [s for s in store.spans(job, step=step) if s.phase in PHASES]
    if not spans:
        raise InputError(f"no spans for job {job!r} step {step}")
    ranks = _player_ranks(spans, min(s.start for s in spans))
    shown = step_report_of(anatomy_from_spans(spans))
    try:
        recent = step_report(store, job, recent_steps=recent_steps)
    except InputError:
        recent = None
    verdict = _verdict(recent, ranks)
    others = [r for r in ranks if verdict is None or r.rank != verdict.rank]
    step_time = (
        shown.step_times_s[0]
        if shown.step_times_s
        else max(s.start + s.dur for s in spans) - min(s.start for s in spans)
    )
    return PlayerStep(
        job=job,
        step=step,
        steps=(first, last),
        step_time_s=step_time,
        ranks=ranks,
        straggler=verdict,
        max_wait_s=max([_phase_s(r, "barrier_wait") for r in others], default=0.0),
        reference_rank=(others or ranks)[0].rank,
    )


def jobs_with_spans(store: Store) -> list[str]:
    """Every job that has spans, sorted (the exporter reports each one's recent steps)."""
    from hpcwatch.store import queries

    return queries.span_jobs(store)


def player_jobs(store: Store, *, limit: int = PLAYER_JOBS_LISTED) -> list[str]:
    """Jobs with spans the player can play, the most recent first."""
    from hpcwatch.store import queries

    return queries.span_jobs_by_recency(store, limit=limit)


# -- the live card -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveTraining:
    job: str
    step: int
    """The newest complete step."""
    step_time_s: float | None


def live_training(store: Store, *, exclude_jobs: Sequence[str] = ()) -> LiveTraining | None:
    """The job training most recently (spans ending last) and its newest complete step's time."""
    from hpcwatch.store import queries

    newest = queries.newest_span_job(store, exclude=exclude_jobs)
    if newest is None:
        return None
    job, last = newest
    try:
        # The last two step numbers: the newest may still be arriving rank by rank.
        anatomy = anatomy_from_spans(queries.recent_spans(store, job, steps=2))
    except InputError:
        return LiveTraining(job=job, step=last, step_time_s=None)
    if not anatomy.steps:
        return LiveTraining(job=job, step=last, step_time_s=None)
    return LiveTraining(job=job, step=anatomy.steps[-1], step_time_s=float(step_times_s(anatomy)[-1]))


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: object) -> int | None:
    try:
        return None if value is None else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
