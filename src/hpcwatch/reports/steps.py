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
from typing import TYPE_CHECKING, Any

import numpy as np

from hpcwatch.analysis.reduce import RankGpu, RankReduction, reduce_trace
from hpcwatch.analysis.steps import (
    Anatomy,
    StepPiece,
    anatomy_from_span_table,
    anatomy_from_spans,
    anatomy_from_timelines,
    anatomy_of_pieces,
    median_step_time_s,
    step_pieces,
    step_times_s,
)
from hpcwatch.analysis.stragglers import Straggler, StragglerConfig, StragglerReport, find_stragglers
from hpcwatch.errors import InputError
from hpcwatch.records import PHASES, Job, Span
from hpcwatch.traces import KinetoTrace

if TYPE_CHECKING:
    from hpcwatch.analysis.steps import RankStep, TemporalBreakdown
    from hpcwatch.analysis.whatif import WhatIf  # imported when a trace set's report is built
    from hpcwatch.reports.jobstretches import KeptStretches  # a server's; the CLI's reports keep nothing
    from hpcwatch.sources.registry import Input
    from hpcwatch.store import Store  # only the store-reading reports need it; ``steps TRACE`` never opens a store

__all__ = [
    "StepReport",
    "PlayerPhase",
    "PlayerRank",
    "PlayerVerdict",
    "PlayerStep",
    "step_report",
    "recent_step_report",
    "step_report_of",
    "RankGpu",
    "RankReduction",
    "GpuClock",
    "trace_report",
    "reduced_report",
    "reduce_trace_file",
    "reduce_trace_files",
    "reader_processes",
    "PARALLEL_READ_MIN_JSON_BYTES",
    "JSON_BYTES_PER_READER",
    "hook_report",
    "is_reduced_set",
    "read_reduced",
    "write_reduced",
    "mfu_document",
    "steps_document",
    "GPU_BOUND_LAG_FRACTION",
    "player_step",
    "player_jobs",
    "placement_from_job",
    "DEFAULT_RECENT_STEPS",
    "PLAYER_JOBS_LISTED",
]

DEFAULT_RECENT_STEPS = 50
"""Training reports of a running job look at its last N steps: recent enough to move, long enough for a median."""
PLAYER_JOBS_LISTED = 8
"""Jobs the player offers when no pair is configured: the most recent ones."""
#: The player draws at most this many ranks of a step: the ones that worked longest (those the others wait for),
#: the straggler and the reference rank among them. Ours: 32 rows are one screen of Gantt chart and a ring that
#: still reads; a 1,536-rank step drawn whole was a 32,000 px chart and 45,000 elements in the page.
PLAYER_RANKS = 32

Placement = Mapping[int, tuple[str | None, int | None]]


# ``hpcwatch.store.queries`` is imported by the functions that use it: it loads pyarrow and duckdb (a
# noticeable start-up cost: benchmarks/RESULTS.md, "CLI start-up"), which the reports on traces given as files never need.


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


# -- a trace set read from files (``hpcwatch steps TRACE...``) ---------------------------------------

#: The traces the forked reader processes read (by index), and the (front, back) of the indices no process
#: has taken yet, in shared memory (see ``_reduce_in_processes``).
_TO_READ: list[Path] = []
_UNTAKEN: Any = None


def _take(from_front: bool) -> int | None:
    """The next index of ``_TO_READ`` nobody has taken, from the front (readers) or the back (this process)."""
    with _UNTAKEN.get_lock():
        front, back = _UNTAKEN[0], _UNTAKEN[1]
        if front > back:
            return None
        if from_front:
            _UNTAKEN[0] = front + 1
            return int(front)
        _UNTAKEN[1] = back - 1
        return int(back)


def _reduce_share(from_front: bool = True) -> list[tuple[int, tuple[RankReduction, tuple[str, ...]]]]:
    """(index, reduced trace) of each file this process takes, until none is left."""
    done = []
    while (index := _take(from_front)) is not None:
        done.append((index, reduce_trace_file(_TO_READ[index])))
    return done


#: Traces are read in several processes only past this much JSON in all (decoded bytes): a fork and the
#: reader's start cost about what ~10 MiB of JSON takes to read, so from there it is even and from 16 MiB it
#: pays (benchmarks/RESULTS.md, "Steps: traces read in several processes"). Each process holds one rank's
#: trace at a time, so memory grows with the processes, not with the set.
PARALLEL_READ_MIN_JSON_BYTES = 16 * 2**20
#: ... and each process gets at least this much JSON to decode (fewer, larger shares copy less).
JSON_BYTES_PER_READER = 8 * 2**20


def _json_bytes(path: Path) -> int:
    """The decoded size of a trace: a gzip file's ISIZE trailer (RFC 1952 §2.3.1, the size mod 2^32,
    exact below 4 GiB), else the file's size."""
    size = path.stat().st_size
    if path.suffix != ".gz" or size < 18:
        return size
    with path.open("rb") as f:
        f.seek(-4, os.SEEK_END)
        return max(int.from_bytes(f.read(4), "little"), size)


def reader_processes(paths: Sequence[Path], cpus: int | None = None) -> int:
    """How many processes read ``paths``: 1 (this one) unless there is enough JSON to share out."""
    total = sum(_json_bytes(Path(p)) for p in paths)
    if len(paths) < 2 or total < PARALLEL_READ_MIN_JSON_BYTES:
        return 1
    return max(1, min(len(paths), cpus or os.cpu_count() or 1, total // JSON_BYTES_PER_READER))


def reduce_trace_files(paths: Sequence[Path]) -> tuple[list[RankReduction], list[str]]:
    """Every rank's reduced trace, in ``paths`` order, and the warnings of the reading, read and reduced one
    rank at a time (a rank's trace is dropped once reduced), in parallel processes when the set is large
    enough (``reader_processes``): decoding JSON holds the GIL, so threads would not help."""
    processes = reader_processes(paths)
    stopped: list[str] = []
    if processes > 1:
        done = _reduce_in_processes(list(paths), processes, stopped)
    else:
        done = [reduce_trace_file(p) for p in paths]
    return [reduction for reduction, _ in done], stopped + [m for _, messages in done for m in messages]


def _reduce_in_processes(
    paths: list[Path], processes: int, stopped: list[str]
) -> list[tuple[RankReduction, tuple[str, ...]]]:
    """``reduce_trace_file`` of every file, by this process and ``processes - 1`` forked readers; a reader
    that stopped is told in ``stopped``.

    The readers take files from the front of the list and this process from the back, one at a time,
    so the shares balance whatever the ranks' sizes. Reading here too saves a process: one fork fewer,
    whose copy of the interpreter and numpy would count again in the command's memory.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    global _UNTAKEN
    fork = multiprocessing.get_context("fork")
    _TO_READ[:], _UNTAKEN = paths, fork.Array("q", [0, len(paths) - 1])
    try:
        with ProcessPoolExecutor(processes - 1, mp_context=fork) as pool:
            readers = [pool.submit(_reduce_share) for _ in range(processes - 1)]
            try:
                done = dict(_reduce_share(from_front=False))
                for reader in readers:
                    try:
                        done.update(reader.result())
                    except BrokenProcessPool as err:  # a reader was killed (out of memory?): its ranks are read here
                        stopped.append(f"a reader process stopped ({err}); its ranks are read in this process")
            except BaseException:  # a broken rank, here or in a reader: the others stop after the rank they read
                with _UNTAKEN.get_lock():
                    _UNTAKEN[0] = len(paths)
                raise
        return [done[i] if i in done else reduce_trace_file(paths[i]) for i in range(len(paths))]
    finally:
        _TO_READ.clear()
        _UNTAKEN = None


def hook_report(files: Sequence[Input]) -> StepReport:
    """The report of the hook's JSON-lines files (``rank-N.jsonl``): their step spans, one anatomy."""
    return step_report_of(
        anatomy_from_spans(
            r for i in files if i.format is not None for r in i.format.read(i.path, i.context) if isinstance(r, Span)
        )
    )


def is_reduced_set(paths: Sequence[Path]) -> bool:
    """Whether every path is a reduced table (``hpcwatch steps --reduced FILE`` of an earlier run)."""
    if not all(Path(p).is_file() and Path(p).suffix == ".parquet" for p in paths):
        return False
    from hpcwatch.analysis.reduce import is_reduced_parquet

    return all(is_reduced_parquet(p) for p in paths)


def read_reduced(paths: Sequence[Path]) -> list[RankReduction]:
    """The reductions of the tables ``write_reduced`` wrote, in order."""
    from hpcwatch.analysis.reduce import read_parquet

    return [r for path in paths for r in read_parquet(path)]


def write_reduced(reductions: Sequence[RankReduction], path: Path) -> None:
    """The reduced set as one Parquet file (one row per rank), which ``read_reduced`` reads back."""
    from hpcwatch.analysis.reduce import to_table, write_parquet

    write_parquet(to_table(reductions), path)


# -- the ``hpcwatch steps --json`` document -------------------------------------------------------

#: Kernels listed per rank in the JSON document.
_TOP_KERNELS_LISTED = 5


def mfu_document(
    report: StepReport,
    *,
    params: float,
    layers: int,
    d_model: int,
    seq: int,
    tokens_per_step: float,
    gpu: str | None = None,
) -> dict[str, Any]:
    """The ``mfu`` of ``steps --json``: the model's FLOPs over the report's median step, on its world size."""
    from hpcwatch.analysis.mfu import DEFAULT_GPU, compute_mfu

    step_s = report.step_time_s
    if step_s is None:
        raise InputError("steps: MFU needs at least one complete step")
    result = compute_mfu(
        params=params,
        layers=layers,
        d_model=d_model,
        seq=seq,
        tokens_per_step=tokens_per_step,
        step_time_s=step_s,
        gpus=report.anatomy.world_size,
        gpu=gpu or DEFAULT_GPU,
    )
    return {
        "mfu": result.mfu,
        "tokens_per_s": result.tokens_per_s,
        "achieved_flops": result.achieved_flops,
        "peak_flops": result.peak_flops,
        "gpu": result.gpu,
        "step_time_s": step_s,
    }


def steps_document(
    step: StepReport,
    *,
    breakdowns: Sequence[TemporalBreakdown] = (),
    mfu: dict[str, Any] | None = None,
    clock: GpuClock | None = None,
    per_rank: tuple[RankGpu, ...] = (),
) -> dict[str, Any]:
    """The ``hpcwatch steps --json`` document (seconds; bandwidths in bytes/s), which its text view prints."""
    from hpcwatch.reports.whatif import whatif_document

    anatomy, report, times = step.anatomy, step.stragglers, step.step_times_s
    step_m = anatomy.matrix("step")
    gpu = _gpu_by_rank(anatomy)
    ranks = [
        {
            "rank": r.rank,
            "node": r.node,
            "gpu": r.gpu,
            "phases": dict(r.phases),
            "work_s": r.work_s,
            "step_s": r.step_s,
            "score": r.score,
            "individual_score": r.individual_score,
            "phase_scores": dict(r.phase_scores),
            "z": r.z,
            "outlier_steps": r.outlier_steps,
            "clock_offset_s": anatomy.clock_offset_s.get(r.rank),
            **gpu.get(r.rank, {}),
            **(
                {
                    "gpu_compute_s": r.gpu_compute_s,
                    "gpu_score": r.gpu_score,
                    "gpu_individual_score": r.gpu_individual_score,
                    "gpu_z": r.gpu_z,
                    "late_s": r.late_s,
                    "last_fraction": r.last_fraction,
                }
                if r.gpu_compute_s is not None
                else {}
            ),
        }
        for r in report.ranks
    ]
    host_m = anatomy.matrix("host_dur_s")
    return {
        "world_size": anatomy.world_size,
        "source": anatomy.source,
        "job": anatomy.job,
        "step_time_s": step.step_time_s,
        "clock": "gpu" if anatomy.has_gpu else "host",
        "gpu_clock": None
        if clock is None
        else {
            "gpu_step_s": clock.gpu_step_s,
            "host_step_s": clock.host_step_s,
            "gpu_lag_s": clock.gpu_lag_s,
            "queue_depth_steps": clock.queue_depth_steps,
            "bound": clock.bound,
        },
        "steps": [
            {
                "step": s,
                "time_s": times[j],
                "slowest_rank": int(anatomy.ranks[int(np.nanargmax(step_m[:, j]))]),
                "host_time_s": float(np.nanmax(host_m[:, j])) if np.isfinite(host_m[:, j]).any() else None,
            }
            for j, s in enumerate(anatomy.steps)
        ],
        "ranks": ranks,
        "stragglers": [
            {
                "rank": s.rank,
                "node": s.node,
                "gpu": s.gpu,
                "phase": s.phase,
                "score": s.score,
                "individual_score": s.individual_score,
                "z": s.z,
                "excess_s": s.excess_s,
                "steps_flagged": s.steps_flagged,
                "signature": s.signature,
                "others_wait_s": s.others_wait_s,
                "evidence": list(s.evidence),
                "host_only": s.host_only,
                "others_lost_s": s.others_lost_s,
                "gpu_excess_s": s.gpu_excess_s,
                "late_s": s.late_s,
                "last_fraction": s.last_fraction,
                "impact": s.impact,
            }
            for s in report.stragglers
        ],
        "no_verdict": report.no_verdict,
        "slow_steps": [
            {"rank": s.rank, "step": s.step, "work_s": s.work_s, "median_work_s": s.median_work_s, "z": s.z}
            for s in report.slow_steps
        ],
        "ranks_missing": sorted(set(range(anatomy.world_size)) - set(anatomy.ranks)),
        "temporal_breakdown": [_breakdown(b) for b in breakdowns],
        "gpu": [_rank_gpu(g) for g in per_rank],
        "mfu": mfu,
        "whatif": None if step.whatif is None else whatif_document(step.whatif),
    }


def _rank_gpu(g: RankGpu) -> dict[str, Any]:
    return {
        "rank": g.rank,
        "kinds_s": {k: v / 1e6 for k, v in g.kernels.kind_us.items()},
        "top_kernels": [
            {"name": k.name, "kind": k.kind, "count": k.count, "total_s": k.total_us / 1e6, "mean_s": k.mean_us / 1e6}
            for k in g.kernels.top[:_TOP_KERNELS_LISTED]
        ],
        "idle_by_stream": [
            {
                "stream": i.stream,
                "host_wait_s": i.host_wait_us / 1e6,
                "kernel_wait_s": i.kernel_wait_us / 1e6,
                "other_s": i.other_us / 1e6,
            }
            for i in g.idle
        ],
        "comm_compute_overlap": g.overlap,
        "launches": {
            "count": g.launches.launches,
            "short_kernels": g.launches.short_kernels,
            "runtime_outliers": g.launches.runtime_outliers,
            "launch_delay_outliers": g.launches.launch_delay_outliers,
            "launch_delay_s": {k: v / 1e6 for k, v in g.launches.launch_delay_us.items()},
        },
        "collectives": [
            {
                "collective": c.collective,
                "count": c.count,
                "msg_bytes": c.msg_bytes,
                "group_size": c.group_size,
                "algbw_bytes_s_max": c.algbw_bytes_s_max,
                "busbw_bytes_s_max": c.busbw_bytes_s_max,
                "busbw_bytes_s_median": c.busbw_bytes_s_median,
            }
            for c in g.collectives
        ],
    }


def _gpu_by_rank(anatomy: Anatomy) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    by_rank: dict[int, list[RankStep]] = {}
    for rs in anatomy.rank_steps:
        if rs.gpu_busy_s is not None:
            by_rank.setdefault(rs.rank, []).append(rs)
    for rank in anatomy.ranks:
        rows = by_rank.get(rank)
        if rows:
            out[rank] = {
                "gpu_busy_s": float(np.median([rs.gpu_busy_s for rs in rows])),
                "gpu_idle_s": float(np.median([rs.gpu_idle_s for rs in rows])),
                "overlap_s": float(np.median([rs.overlap_s for rs in rows])),
            }
    return out


def _breakdown(b: TemporalBreakdown) -> dict[str, Any]:
    return {
        "rank": b.rank,
        "idle_s": b.idle_us / 1e6,
        "compute_s": b.compute_us / 1e6,
        "non_compute_s": b.non_compute_us / 1e6,
        "kernel_s": b.kernel_us / 1e6,
        "pct": b.pct(),
    }


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
    store: Store,
    job_id: str,
    *,
    recent_steps: int | None = None,
    since: float | None = None,
    config: StragglerConfig | None = None,
) -> StepReport:
    """``job_id``'s steps from its stored spans (its last ``recent_steps`` only, when given; ``since``: no span
    of those started before it, ``StepTable.first_start_of_last``). The spans stay columns
    (``analysis.steps.anatomy_from_span_table``): a 1,536-rank job's 50 steps are 460,000 of them.

    Ranks the spans do not place are placed from the job record (launcher order).
    ``InputError`` when the job has no spans of a training phase.
    """
    from hpcwatch.store import queries

    if recent_steps is None:
        spans = queries.job_span_table(store, job_id)
    else:
        spans = queries.recent_span_table(store, job_id, steps=recent_steps, since=since)
    if not spans.num_rows:
        raise InputError(f"job {job_id}: no step spans in the store")
    anatomy = anatomy_from_span_table(spans)
    job = store.job(job_id)
    placement = None if anatomy.placement or job is None else placement_from_job(job, anatomy.ranks)
    return step_report_of(anatomy, placement=placement, config=config)


@dataclass(frozen=True, slots=True)
class _KeptSteps:
    """What ``recent_step_report`` keeps of a job's recent steps between pages."""

    recent_steps: int
    since: float | None
    config: StragglerConfig | None
    pieces: tuple[StepPiece, ...]
    report: StepReport


def recent_step_report(
    store: Store,
    job_id: str,
    *,
    recent_steps: int,
    since: float | None,
    kept: KeptStretches | None,
    config: StragglerConfig | None = None,
) -> StepReport:
    """``step_report(store, job_id, recent_steps=, since=)``; with ``kept`` (a server's, between pages), from
    the pieces of the steps the last page took apart (``analysis.steps.step_pieces``): only the steps with a
    span landed since, or new among the last ``recent_steps``, are read and taken apart (a 1,536-rank job's 50
    steps are 460,000 spans; a page seconds after the last finds one or two new steps), and with no span
    landed, the last page's report."""
    from hpcwatch.store import queries

    record = store.job(job_id)
    if kept is None or record is None or record.start is None:
        return step_report(store, job_id, recent_steps=recent_steps, since=since, config=config)
    version = store.version  # before any read: a span committed during them is checked next time
    recalled = kept.recall(store, "recent", record, record.start)
    last = recalled[1] if recalled is not None and recalled[1].recent_steps == recent_steps else None
    landed = queries.job_span_steps_written(store, recalled[0], job_id) if recalled is not None else None
    if last is not None and landed is None and last.since == since and last.config == config:
        report: StepReport = last.report
    else:
        pieces = _recent_pieces(store, job_id, recent_steps, since, last, landed)
        if not pieces:
            raise InputError(f"job {job_id}: no step spans in the store")
        anatomy = anatomy_of_pieces(pieces)
        placement = None if anatomy.placement else placement_from_job(record, anatomy.ranks)
        report = step_report_of(anatomy, placement=placement, config=config)
        kept.remember(
            store,
            "recent",
            record,
            t0=record.start,
            version=version,
            state=_KeptSteps(recent_steps, since, config, tuple(pieces), report),
        )
    return report


def _recent_pieces(
    store: Store, job_id: str, recent_steps: int, since: float | None, last: _KeptSteps | None, landed: int | None
) -> list[StepPiece]:
    """The pieces of the job's last ``recent_steps`` steps (spans from ``since``): the ``last`` page's of a step
    below ``landed`` (no span of it came since) that it read whole (every span of it from a ``since`` no later
    than this one, none of them before this one's), the others read."""
    from hpcwatch.store import queries

    steps = queries.recent_steps(store, job_id, steps=recent_steps, since=since)
    reusable = {}
    if last is not None and (last.since is None or (since is not None and since >= last.since)):
        reusable = {
            p.step: p
            for p in last.pieces
            if (landed is None or p.step < landed) and (since is None or p.first_start >= since)
        }
    read = [s for s in steps if s not in reusable]
    found = {p.step: p for p in step_pieces(queries.step_span_table(store, job_id, read, since=since))} if read else {}
    return [found[s] if s in found else reusable[s] for s in steps if s in found or s in reusable]


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
    ranks_total: int = 0
    """The ranks of the step; ``ranks`` may hold fewer (``player_step``'s ``ranks_shown``)."""


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
    store: Store,
    job: str,
    step: int | None = None,
    *,
    recent_steps: int = DEFAULT_RECENT_STEPS,
    ranks_shown: int = PLAYER_RANKS,
) -> PlayerStep:
    """One step of ``job`` per rank and phase (``records.PHASES`` only), with the straggler verdict of the
    job's last ``recent_steps`` steps (the exporter's). ``step`` defaults to the newest step every rank
    finished. At most ``ranks_shown`` ranks (0: all; ``_ranks_shown``); ``max_wait_s`` and the verdict are
    over all of them. ``InputError`` when the job or the step has no spans."""
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
    reference = (others or ranks)[0].rank
    keep = {reference} | ({verdict.rank} if verdict is not None else set())
    return PlayerStep(
        job=job,
        step=step,
        steps=(first, last),
        step_time_s=step_time,
        ranks=_ranks_shown(ranks, ranks_shown, keep=keep),
        straggler=verdict,
        max_wait_s=max([_phase_s(r, "barrier_wait") for r in others], default=0.0),
        reference_rank=reference,
        ranks_total=len(ranks),
    )


def _ranks_shown(ranks: tuple[PlayerRank, ...], limit: int, *, keep: set[int]) -> tuple[PlayerRank, ...]:
    """``ranks`` when they are ``limit`` or fewer (or ``limit`` is 0); else ``keep`` and the ranks that worked
    longest (the step less their barrier wait: those the others wait for), in rank order."""
    if not limit or len(ranks) <= limit:
        return ranks
    work = {r.rank: sum(p.dur_s for p in r.phases if p.phase != "barrier_wait") for r in ranks}
    longest = sorted((r for r in work if r not in keep), key=lambda r: (-work[r], r))
    chosen = keep | set(longest[: max(0, limit - len(keep))])
    return tuple(r for r in ranks if r.rank in chosen)


def player_jobs(store: Store, *, limit: int = PLAYER_JOBS_LISTED) -> list[str]:
    """Jobs with spans the player can play, the most recent first."""
    from hpcwatch.store import queries

    return queries.span_jobs_by_recency(store, limit=limit)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: object) -> int | None:
    try:
        return None if value is None else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
