"""`hpcwatch steps`: step anatomy per rank, stragglers and MFU, from Kineto traces or stored spans."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcwatch.cli.common import (
    PATH,
    app,
    argument,
    console,
    db_option,
    emit_json,
    json_option,
    open_store,
    repeatable,
    safe_text,
    warning_line,
)
from hpcwatch.cli.defaults import DASK_SLURM_MEMORY, DASK_SLURM_WALLTIME, DASK_START_TIMEOUT_S
from hpcwatch.errors import ConfigError, InputError
from hpcwatch.records import PHASES

if TYPE_CHECKING:  # the heavy modules are imported when the command runs (hpcwatch --help stays fast)
    from hpcwatch.analysis.reduce import RankGpu, RankReduction
    from hpcwatch.analysis.steps import Anatomy, TemporalBreakdown
    from hpcwatch.distributed import DaskConfig
    from hpcwatch.reports.steps import GpuClock, StepReport
    from hpcwatch.sources.registry import Input

__all__ = [
    "steps",
    "trace_files",
    "steps_document",
    "reader_processes",
    "PARALLEL_READ_MIN_JSON_BYTES",
    "JSON_BYTES_PER_READER",
]

#: The registry formats this command reads.
_STEP_FORMATS = ("kineto", "hook-jsonl")
#: How many slow steps the human report lists.
_SLOW_STEPS_SHOWN = 5
#: Kernels listed per rank in the JSON document.
_TOP_KERNELS_LISTED = 5


def _format_name(item: Input) -> str | None:
    """The name of an input's format (``trace_files`` keeps only inputs that have one)."""
    return item.format.name if item.format is not None else None


def trace_files(paths: list[Path]) -> list[Input]:
    """Kineto traces and hook files under ``paths``, recognised by the format registry (not by their names).

    A file named on the command line must be one of the two; a folder's other files are passed over, and
    a folder holding both (a profiled run with the hook on) gives its traces: the GPU's own timeline.
    """
    from hpcwatch.sources.registry import Input, plan_inputs

    named = {Path(p) for p in paths}
    found: list[Input] = []
    for item in plan_inputs(paths):
        if isinstance(item, Input) and item.format is not None and item.format.name in _STEP_FORMATS:
            found.append(item)
        elif isinstance(item, Input) and item.path in named:
            what = item.format.name if item.format else "empty"
            raise InputError(f"{item.path}: steps reads Kineto traces or the hook's JSON lines, not {what}")
    if not found:
        raise InputError(f"{', '.join(map(str, paths))}: no Kineto trace or hook JSON lines found")
    if any(_format_name(i) == "kineto" for i in found):
        found = [i for i in found if _format_name(i) == "kineto" or i.path in named]
    return found


@app.command()
@argument(
    "paths",
    nargs=-1,
    type=PATH,
    help="Kineto traces (.json/.json.gz), one per rank, or the hook's "
    "rank-N.jsonl files, or folders; or the reduced tables an earlier "
    "--reduced FILE kept.",
)
@json_option()
@db_option()
@click.option("--job", help="Read this job's step spans from the store instead.")
@click.option("--params", type=float, help="MFU: non-embedding parameters N.")
@click.option("--layers", type=int, help="MFU: transformer layers L.")
@click.option("--d-model", type=int, help="MFU: model width d.")
@click.option("--seq", type=int, help="MFU: sequence length T.")
@click.option("--tokens-per-step", type=float, help="MFU: tokens per step, all ranks.")
@click.option("--gpu", help="MFU: GPU type (catalog key or model name).")
@click.option(
    "--reduced", type=PATH, help="Also write the per-rank reduced tables (one row per rank) to this Parquet file."
)
@click.option(
    "--dask",
    help="Reduce each rank's trace on Dask workers: local (a LocalCluster here), slurm (workers "
    "as Slurm jobs) or tcp://HOST:PORT (a running scheduler). Needs the dask extra.",
)
@click.option(
    "--workers", type=int, help="Dask workers to start (local: default one per core; slurm: jobs, default 2)."
)
@click.option(
    "--dask-timeout", type=float, default=DASK_START_TIMEOUT_S, help="Seconds to wait for the workers to connect."
)
@click.option("--slurm-partition", help="--dask slurm: partition of the worker jobs.")
@click.option("--slurm-account", help="--dask slurm: account.")
@click.option("--slurm-python", help="--dask slurm: the interpreter a worker job runs (default: this one).")
@click.option("--slurm-interface", help="--dask slurm: network interface of the scheduler and workers (lo, ib0...).")
@click.option("--slurm-memory", default=DASK_SLURM_MEMORY, help="--dask slurm: memory per worker job.")
@click.option("--slurm-walltime", default=DASK_SLURM_WALLTIME, help="--dask slurm: time limit of a worker job.")
@click.option("--slurm-local-dir", help="--dask slurm: worker scratch folder on the node.")
@click.option("--slurm-log-dir", help="--dask slurm: folder for the jobs' output.")
@repeatable("--slurm-job-extra", help="--dask slurm: another #SBATCH option (repeatable), e.g. --exclusive.")
def steps(
    paths: list[Path],
    as_json: bool,
    db: str | None,
    job: str | None,
    params: float | None,
    layers: int | None,
    d_model: int | None,
    seq: int | None,
    tokens_per_step: float | None,
    gpu: str | None,
    reduced: Path | None,
    dask: str | None,
    workers: int | None,
    dask_timeout: float,
    slurm_partition: str | None,
    slurm_account: str | None,
    slurm_python: str | None,
    slurm_interface: str | None,
    slurm_memory: str,
    slurm_walltime: str,
    slurm_local_dir: str | None,
    slurm_log_dir: str | None,
    slurm_job_extra: list[str],
) -> None:
    """Step anatomy per rank (load, forward, backward, allreduce, optimizer, barrier wait), stragglers, MFU."""
    if bool(paths) == bool(job):
        raise ConfigError("steps: give TRACE files or --job ID with --db (one of them)")
    if dask is None and workers is not None:
        raise ConfigError("steps: --workers goes with --dask")
    if reduced is not None and job:
        raise ConfigError("steps: --reduced writes the reduced traces; --job reads spans")
    cluster = (
        None
        if dask is None
        else _dask_config(
            dask,
            workers=workers,
            timeout_s=dask_timeout,
            slurm=dict(
                partition=slurm_partition,
                account=slurm_account,
                python=slurm_python,
                interface=slurm_interface,
                memory=slurm_memory,
                walltime=slurm_walltime,
                local_directory=slurm_local_dir,
                log_directory=slurm_log_dir,
                job_extra=tuple(slurm_job_extra),
            ),
        )
    )
    from hpcwatch.analysis.steps import anatomy_from_spans
    from hpcwatch.records import Span
    from hpcwatch.reports.steps import reduced_report, step_report, step_report_of

    reductions: list[RankReduction] = []
    clock: GpuClock | None = None
    per_rank: tuple[RankGpu, ...] = ()
    if job:
        with open_store(db) as store:
            report = step_report(store, job)
    elif _reduced_files(paths):  # tables a previous run kept with --reduced: the cross-rank half only
        from hpcwatch.analysis.reduce import read_parquet

        if cluster is not None or reduced is not None:
            raise ConfigError("steps: reduced tables are already reduced (no --dask, no --reduced)")
        reductions = [r for path in paths for r in read_parquet(path)]
        report, clock, per_rank = reduced_report(reductions)
    else:
        files = trace_files(list(paths))
        hook = [i for i in files if _format_name(i) == "hook-jsonl"]
        if hook and len(hook) != len(files):
            raise ConfigError("steps: give Kineto traces or the hook's .jsonl files, not both")
        if hook and cluster is not None:
            raise ConfigError("steps: --dask reduces Kineto traces; the hook's .jsonl files are read here")
        if hook:
            anatomy = anatomy_from_spans(
                r for i in hook if i.format is not None for r in i.format.read(i.path, i.context) if isinstance(r, Span)
            )
        else:
            reductions = _reduce_traces(files) if cluster is None else _reduce_on_dask(files, cluster)
            if reduced is not None:
                from hpcwatch.analysis.reduce import to_table, write_parquet

                write_parquet(to_table(reductions), reduced)
        report, clock, per_rank = reduced_report(reductions) if reductions else (step_report_of(anatomy), None, ())
    mfu = _mfu(report, params=params, layers=layers, d_model=d_model, seq=seq, tokens_per_step=tokens_per_step, gpu=gpu)
    doc = steps_document(
        report,
        breakdowns=[r.breakdown for r in reductions if r.breakdown is not None],
        mfu=mfu,
        clock=clock,
        per_rank=per_rank,
    )
    if as_json:
        emit_json(doc)
    else:
        _print(doc)


def _reduced_files(paths: Sequence[Path]) -> bool:
    """Whether every path is a reduced table (``--reduced FILE`` of an earlier run)."""
    if not all(Path(p).is_file() and Path(p).suffix == ".parquet" for p in paths):
        return False
    from hpcwatch.analysis.reduce import is_reduced_parquet

    return all(is_reduced_parquet(p) for p in paths)


#: The inputs the forked reader processes read (by index: a format's reader is not picklable), and the
#: (front, back) of the indices no process has taken yet, in shared memory (see ``_reduce_in_processes``).
_TO_READ: list = []
_UNTAKEN: Any = None


def _take(from_front: bool) -> int | None:
    """The next index of ``_TO_READ`` nobody has taken, from the front (readers) or the back (this process)."""
    with _UNTAKEN.get_lock():
        front, back = _UNTAKEN[0], _UNTAKEN[1]
        if front > back:
            return None
        if from_front:
            _UNTAKEN[0] = front + 1
            return front
        _UNTAKEN[1] = back - 1
        return back


def _reduce_share(from_front: bool = True) -> list[tuple[int, tuple[RankReduction, tuple[str, ...]]]]:
    """(index, reduced trace) of each file this process takes, until none is left."""
    from hpcwatch.reports.steps import reduce_trace_file

    done = []
    while (index := _take(from_front)) is not None:
        done.append((index, reduce_trace_file(_TO_READ[index].path)))
    return done


#: Traces are read in several processes only past this much JSON in all (decoded bytes). Measured with
#: this process reading too and one forked reader (each sends back its ranks' reductions, ~10 kB a rank),
#: whole process as typed, bytecode cached, best of 5, 2-core VM, twin sets (gpu_straggler traces):
#:
#:   set, JSON           one process     two processes   peak PSS (RSS summed), two    HTA, same run
#:   8 x 20,   13 MiB    0.28 s          0.26-0.28 s     --                            --
#:   8 x 60,   39.5 MiB  0.51-0.54 s     0.39 s          57 MiB (80)                   190 MiB
#:   8 x 120,  79 MiB    0.84-0.90 s     0.57-0.59 s     64 MiB (88)                   --
#:   8 x 360,  240 MiB   2.38-2.50 s     1.45 s          101 MiB (126)                 423 MiB (427), 9.5 s
#:
#: A fork and the reader's start cost ~25 ms (the 2 real HTA ranks, 3.3 MiB, take 0.18 s alone and 0.21 s
#: in two), so from ~10 MiB it is even and from 16 MiB it pays. Each process holds one rank's trace at a
#: time, so memory grows with the processes, not with the set.
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


def reader_processes(files: list[Input], cpus: int | None = None) -> int:
    """How many processes read ``files``: 1 (this one) unless there is enough JSON to share out."""
    total = sum(_json_bytes(i.path) for i in files)
    if len(files) < 2 or total < PARALLEL_READ_MIN_JSON_BYTES:
        return 1
    return max(1, min(len(files), cpus or os.cpu_count() or 1, total // JSON_BYTES_PER_READER))


def _reduce_traces(files: list[Input]) -> list[RankReduction]:
    """Every rank's reduced trace, in ``files`` order, read and reduced one rank at a time (a rank's trace is
    dropped once reduced), in parallel processes when the set is large enough (``reader_processes``):
    decoding JSON holds the GIL, so threads would not help."""
    from hpcwatch.reports.steps import reduce_trace_file

    processes = reader_processes(files)
    if processes > 1:
        done = _reduce_in_processes(files, processes)
    else:
        done = [reduce_trace_file(i.path) for i in files]
    _warn([message for _, messages in done for message in messages])
    return [reduction for reduction, _ in done]


def _reduce_in_processes(files: list[Input], processes: int) -> list[tuple[RankReduction, tuple[str, ...]]]:
    """``reduce_trace_file`` of every file, by this process and ``processes - 1`` forked readers.

    The readers take files from the front of the list and this process from the back, one at a time,
    so the shares balance whatever the ranks' sizes. Reading here too saves a process: one fork fewer,
    whose copy of the interpreter and numpy would count again in the command's memory.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    global _UNTAKEN
    fork = multiprocessing.get_context("fork")
    _TO_READ[:], _UNTAKEN = files, fork.Array("q", [0, len(files) - 1])
    try:
        with ProcessPoolExecutor(processes - 1, mp_context=fork) as pool:
            readers = [pool.submit(_reduce_share) for _ in range(processes - 1)]
            try:
                done = dict(_reduce_share(from_front=False))
                for reader in readers:
                    try:
                        done.update(reader.result())
                    except BrokenProcessPool as err:  # a reader was killed (out of memory?): its ranks are read here
                        _warn([f"a reader process stopped ({err}); its ranks are read in this process"])
            except BaseException:  # a broken rank, here or in a reader: the others stop after the rank they read
                with _UNTAKEN.get_lock():
                    _UNTAKEN[0] = len(files)
                raise
        from hpcwatch.reports.steps import reduce_trace_file

        return [done[i] if i in done else reduce_trace_file(files[i].path) for i in range(len(files))]
    finally:
        _TO_READ.clear()
        _UNTAKEN = None


def _warn(messages: list[str]) -> None:
    for message in messages:
        print(warning_line(message), file=sys.stderr)


def _dask_config(target: str, *, workers: int | None, timeout_s: float, slurm: dict) -> DaskConfig:
    from hpcwatch.distributed import DaskConfig, SlurmWorkers

    return DaskConfig(target=target, workers=workers, start_timeout_s=timeout_s, slurm=SlurmWorkers(**slurm))


def _reduce_on_dask(files: list[Input], config: DaskConfig) -> list[RankReduction]:
    """Every rank's reduced trace, each reduced on a Dask worker; where they ran goes to stderr."""
    from rich.console import Console

    from hpcwatch.distributed import reduce_on_dask

    reductions, warned, run = reduce_on_dask([str(i.path) for i in files], config)
    _warn(warned)
    jobs = f", Slurm jobs {safe_text(' '.join(run.slurm_job_ids))}" if run.slurm_job_ids else ""
    Console(stderr=True, emoji=False).print(
        f"dask {safe_text(run.target)}: {len(reductions)} ranks reduced on {run.workers} workers "
        f"({safe_text(', '.join(sorted(set(run.worker_hosts))))}){jobs}",
        highlight=False,
    )
    return reductions


def _mfu(report: StepReport, **shape: Any) -> dict | None:
    given = {k: v for k, v in shape.items() if v is not None and k != "gpu"}
    if not given:
        return None
    missing = [k for k in ("params", "layers", "d_model", "seq", "tokens_per_step") if shape.get(k) is None]
    if missing:
        raise ConfigError(f"steps: MFU needs --{' --'.join(m.replace('_', '-') for m in missing)} too")
    from hpcwatch.analysis.mfu import DEFAULT_GPU, compute_mfu

    step_s = report.step_time_s
    if step_s is None:
        raise InputError("steps: MFU needs at least one complete step")
    result = compute_mfu(
        params=shape["params"],
        layers=shape["layers"],
        d_model=shape["d_model"],
        seq=shape["seq"],
        tokens_per_step=shape["tokens_per_step"],
        step_time_s=step_s,
        gpus=report.anatomy.world_size,
        gpu=shape.get("gpu") or DEFAULT_GPU,
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
    mfu: dict | None = None,
    clock: GpuClock | None = None,
    per_rank: tuple[RankGpu, ...] = (),
) -> dict:
    """The ``--json`` document (seconds; bandwidths in bytes/s)."""
    import numpy as np

    from hpcwatch.cli.whatif import whatif_document

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


def _rank_gpu(g: RankGpu) -> dict:
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
    import numpy as np

    out: dict[int, dict[str, float]] = {}
    by_rank: dict[int, list] = {}
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


def _breakdown(b: TemporalBreakdown) -> dict:
    return {
        "rank": b.rank,
        "idle_s": b.idle_us / 1e6,
        "compute_s": b.compute_us / 1e6,
        "non_compute_s": b.non_compute_us / 1e6,
        "kernel_s": b.kernel_us / 1e6,
        "pct": b.pct(),
    }


_EVIDENCE_SHOWN = {
    "gpu_compute": "GPU compute excess",
    "late_arrival": "late arrival at the collectives",
    "host": "host timeline",
}
# Column headers short enough for an 80-column terminal.
_SHORT = {
    "load": "load",
    "forward": "fwd",
    "backward": "bwd",
    "allreduce": "comm",
    "optimizer": "opt",
    "barrier_wait": "wait",
}


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.1f}"


def _print(doc: dict) -> None:
    from rich.table import Table

    flagged = {s["rank"] for s in doc["stragglers"]}
    title = (
        f"Step anatomy: {doc['world_size']} ranks, {len(doc['steps'])} steps, "
        f"median step {_ms(doc['step_time_s'])} ms (medians per rank, ms)"
    )
    table = Table(title=title)
    for col in ("rank", "node", "gpu", *(_SHORT[p] for p in PHASES), "score"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for r in doc["ranks"]:
        style = "bold red" if r["rank"] in flagged else None
        table.add_row(
            str(r["rank"]),
            safe_text(r["node"], ""),
            "" if r["gpu"] is None else str(r["gpu"]),
            *(_ms(r["phases"][p]) for p in PHASES),
            f"{r['score']:.2f}",
            style=style,
        )
    console.print(table)
    for s in doc["stragglers"]:
        where = " ".join(
            x
            for x in (
                f"node {safe_text(s['node'])}" if s["node"] else "",
                f"GPU {s['gpu']}" if s["gpu"] is not None else "",
            )
            if x
        )
        named = ", ".join(_EVIDENCE_SHOWN[e] for e in s["evidence"]) + (" (host-side only)" if s["host_only"] else "")
        extra = s["gpu_excess_s"] if s["gpu_excess_s"] is not None and "gpu_compute" in s["evidence"] else s["excess_s"]
        console.print(
            f"[bold red]straggler:[/bold red] rank {s['rank']} {where} — named by {named}; slow in "
            f"{s['phase']}, score {s['score']:.2f}, +{_ms(extra)} ms/step ({s['impact']:.0%} of the step); the others lose "
            f"{_ms(s['others_lost_s'])} ms/step together"
        )
    if not doc["stragglers"]:
        console.print(f"no straggler: {safe_text(doc['no_verdict'])}" if doc["no_verdict"] else "no straggler")
    if doc["whatif"] is not None:
        w = doc["whatif"]
        console.print(safe_text(w["verdict"]))
    slow = sorted(doc["slow_steps"], key=lambda s: -s["z"])
    for s in slow[:_SLOW_STEPS_SHOWN]:
        console.print(
            f"slow step: rank {s['rank']} step {s['step']} worked {_ms(s['work_s'])} ms "
            f"(its median {_ms(s['median_work_s'])} ms)"
        )
    if len(slow) > _SLOW_STEPS_SHOWN:
        console.print(f"… and {len(slow) - _SLOW_STEPS_SHOWN} more slow steps (--json lists them)")
    if doc["ranks_missing"]:
        console.print(
            f"[yellow]only {len(doc['ranks'])} of {doc['world_size']} ranks' traces given[/yellow]: "
            "barrier wait needs every rank of the collective"
        )
    clock = doc.get("gpu_clock")
    if clock:
        console.print(
            f"GPU step {_ms(clock['gpu_step_s'])} ms (host step {_ms(clock['host_step_s'])} ms); the GPU ends "
            f"{_ms(clock['gpu_lag_s'])} ms after the host ({clock['queue_depth_steps']:.1f} steps queued): "
            f"{clock['bound']}-bound"
        )
    for b in doc["temporal_breakdown"]:
        pct = b["pct"]
        console.print(
            f"rank {b['rank']} GPU: idle {pct['idle']:.1f} %, compute {pct['compute']:.1f} %, "
            f"non-compute {pct['non_compute']:.1f} % of {_ms(b['kernel_s'])} ms"
        )
    if doc["mfu"]:
        console.print(f"MFU {doc['mfu']['mfu']:.1%} ({doc['mfu']['gpu']}, {doc['mfu']['tokens_per_s']:.0f} tokens/s)")
