"""`hpcwatch steps`: step anatomy per rank, stragglers and MFU, from Kineto traces or stored spans."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcwatch.cli.common import (
    PATH,
    Number,
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

if TYPE_CHECKING:  # the heavy modules are imported when the command runs (hpcwatch --help stays fast)
    from hpcwatch.distributed import DaskConfig
    from hpcwatch.reports.steps import GpuClock, RankGpu, RankReduction
    from hpcwatch.sources.registry import Input

__all__ = ["steps", "trace_files"]

#: The registry formats this command reads.
_STEP_FORMATS = ("kineto", "hook-jsonl")
#: How many slow steps the human report lists.
_SLOW_STEPS_SHOWN = 5


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
@click.option("--params", type=Number(min=0.0, min_open=True), help="MFU: non-embedding parameters N.")
@click.option("--layers", type=int, help="MFU: transformer layers L.")
@click.option("--d-model", type=int, help="MFU: model width d.")
@click.option("--seq", type=int, help="MFU: sequence length T.")
@click.option("--tokens-per-step", type=Number(min=0.0, min_open=True), help="MFU: tokens per step, all ranks.")
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
    "--dask-timeout",
    type=Number(min=0.0, min_open=True),
    default=DASK_START_TIMEOUT_S,
    help="Seconds to wait for the workers to connect.",
)
@click.option("--slurm-partition", help="--dask slurm: partition of the worker jobs.")
@click.option("--slurm-account", help="--dask slurm: account.")
@click.option("--slurm-python", help="--dask slurm: the interpreter a worker job runs (default: this one).")
@click.option("--slurm-interface", help="--dask slurm: network interface of the scheduler and workers (lo, ib0...).")
@click.option(
    "--critical-path",
    "critical",
    is_flag=True,
    help="The critical path of one rank's step (HTA's critical_path_analysis): give one TRACE.",
)
@click.option(
    "--annotation",
    default="ProfilerStep",
    show_default=True,
    help="--critical-path: the window is the events named like this (substring; '' = the whole trace).",
)
@click.option(
    "--instance",
    default="0",
    show_default=True,
    help="--critical-path: which of them (0 = the first, in file order), or FIRST-LAST.",
)
@click.option(
    "--counters",
    is_flag=True,
    help="CUPTI counters of each kernel with the ops that launched it (HTA's counter analysis): give one TRACE "
    "taken in Kineto's CUPTI range-profiler mode.",
)
@click.option(
    "--compare",
    type=PATH,
    help="Trace diff (HTA's TraceDiff): which ops and kernels got slower or faster from TRACE to this trace "
    "(give TRACE itself to compare two step ranges of one run).",
)
@click.option("--step", "control_steps", help="--compare: TRACE's iterations, N or FIRST-LAST (default: its first).")
@click.option("--compare-step", "test_steps", help="--compare: the other trace's iterations (default: its first).")
@click.option(
    "--device",
    type=click.Choice(["all", "cpu", "gpu"]),
    default="all",
    show_default=True,
    help="--compare: host ops, GPU kernels or both.",
)
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
    critical: bool,
    annotation: str,
    instance: str,
    counters: bool,
    compare: Path | None,
    control_steps: str | None,
    test_steps: str | None,
    device: str,
) -> None:
    """Step anatomy per rank (load, forward, backward, allreduce, optimizer, barrier wait), stragglers, MFU;
    with --critical-path, the critical path of one rank's step."""
    if counters:
        if critical or compare is not None:
            raise ConfigError("steps: --counters, --critical-path and --compare are separate commands; give one")
        _counters(paths, as_json=as_json, job=job)
        return
    if compare is not None:
        if critical:
            raise ConfigError("steps: --compare and --critical-path are two commands; give one")
        _compare(paths, compare, as_json=as_json, control=control_steps, test=test_steps, device=device, job=job)
        return
    if control_steps or test_steps:
        raise ConfigError("steps: --step and --compare-step go with --compare")
    if critical:
        _critical_path(paths, as_json=as_json, annotation=annotation, instance=instance, job=job)
        return
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
    from hpcwatch.reports.steps import (
        hook_report,
        is_reduced_set,
        mfu_document,
        read_reduced,
        reduce_trace_files,
        reduced_report,
        step_report,
        steps_document,
        write_reduced,
    )

    reductions: list[RankReduction] = []
    clock: GpuClock | None = None
    per_rank: tuple[RankGpu, ...] = ()
    if job:
        with open_store(db) as store:
            report = step_report(store, job)
    elif is_reduced_set(paths):  # tables a previous run kept with --reduced: the cross-rank half only
        if cluster is not None or reduced is not None:
            raise ConfigError("steps: reduced tables are already reduced (no --dask, no --reduced)")
        reductions = read_reduced(paths)
        report, clock, per_rank = reduced_report(reductions)
    else:
        files = trace_files(list(paths))
        hook = [i for i in files if _format_name(i) == "hook-jsonl"]
        if hook and len(hook) != len(files):
            raise ConfigError("steps: give Kineto traces or the hook's .jsonl files, not both")
        if hook and cluster is not None:
            raise ConfigError("steps: --dask reduces Kineto traces; the hook's .jsonl files are read here")
        if hook:
            report = hook_report(hook)
        else:
            if cluster is None:
                reductions, warned = reduce_trace_files([i.path for i in files])
                _warn(warned)
            else:
                reductions = _reduce_on_dask(files, cluster)
            if reduced is not None:
                write_reduced(reductions, reduced)
            report, clock, per_rank = reduced_report(reductions)
    shape = _model_shape(params=params, layers=layers, d_model=d_model, seq=seq, tokens_per_step=tokens_per_step)
    mfu = None if shape is None else mfu_document(report, **shape, gpu=gpu)
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


def _instances(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        lo = int(first)
        hi = int(last) if last else lo
    except ValueError:
        raise ConfigError(f"steps: --instance takes N or FIRST-LAST, not {safe_text(text)!r}") from None
    if lo < 0 or hi < lo:
        raise ConfigError(f"steps: --instance {safe_text(text)}: need 0 <= FIRST <= LAST")
    return lo, hi


def _critical_path(paths: list[Path], *, as_json: bool, annotation: str, instance: str, job: str | None) -> None:
    if job or len(paths) != 1:
        raise ConfigError("steps --critical-path: give one TRACE (one rank's Kineto trace)")
    instances = _instances(instance)
    from hpcwatch.reports.deepdive import critical_path_document, read_trace

    trace, warned = read_trace(paths[0])
    _warn(list(warned))
    doc = critical_path_document(trace, annotation=annotation, instances=instances)
    if as_json:
        emit_json(doc)
        return
    _print_critical_path(doc)


def _print_critical_path(doc: dict) -> None:
    from rich.table import Table

    console.print(
        f"Critical path of rank {doc['rank']}, {safe_text(doc['annotation']) or 'whole trace'} "
        f"#{doc['instances'][0]}"
        + (f"-{doc['instances'][1]}" if doc["instances"][1] != doc["instances"][0] else "")
        + f": {doc['length_us'] / 1e3:.3f} ms ({doc['events_on_path']} ops and kernels on it; trace clock, µs)"
    )
    for s in doc["shorten"]:
        console.print(f"  {s['share']:6.1%}  {s['bound_by']:<27} {safe_text(s['what'])}")
        for e in s["first"]:
            console.print(
                f"            {safe_text(e['name'])[:60]}: {e['on_path_us']} µs on the path "
                "(faster, it saves at most that)"
            )
    table = Table(title="Most time on the path, by name (--json: each event and every edge)")
    for col in ("op / kernel", "where", "events", "on path µs", "share"):
        table.add_column(col, justify="left" if col in ("op / kernel", "where") else "right")
    for e in doc["by_name"]:
        table.add_row(
            safe_text(e["name"])[:80],
            "GPU" if e["on_gpu"] else "CPU",
            str(e["events"]),
            str(e["on_path_us"]),
            "" if e["share"] is None else f"{e['share']:.1%}",
        )
    console.print(table)
    for w in doc["warnings"]:
        print(warning_line(w), file=sys.stderr)


def _iterations(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise ConfigError(f"steps: {option} takes N or FIRST-LAST, not {safe_text(text)!r}") from None
    if hi < lo or hi - lo > 100_000:
        raise ConfigError(f"steps: {option} {safe_text(text)}: need FIRST <= LAST")
    return list(range(lo, hi + 1))


def _compare(
    paths: list[Path],
    other: Path,
    *,
    as_json: bool,
    control: str | None,
    test: str | None,
    device: str,
    job: str | None,
) -> None:
    if job or len(paths) != 1:
        raise ConfigError("steps A --compare B: give one TRACE A (one rank's Kineto trace)")
    control_its, test_its = _iterations(control, "--step"), _iterations(test, "--compare-step")
    from hpcwatch.reports.deepdive import diff_document, read_trace

    a, warned = read_trace(paths[0])
    _warn(list(warned))
    if Path(other).resolve() == Path(paths[0]).resolve():
        b = a
    else:
        b, warned = read_trace(other)
        _warn(list(warned))
    doc = diff_document(a, b, control_iterations=control_its, test_iterations=test_its, device=device)
    if as_json:
        emit_json(doc)
        return
    _print_diff(doc)


def _counters(paths: list[Path], *, as_json: bool, job: str | None) -> None:
    if job or len(paths) != 1:
        raise ConfigError("steps --counters: give one TRACE (one rank's Kineto trace)")
    from hpcwatch.reports.deepdive import counters_document, read_trace

    trace, warned = read_trace(paths[0])
    _warn(list(warned))
    doc = counters_document(trace)
    if as_json:
        emit_json(doc)
        return
    from rich.table import Table

    console.print(
        f"CUPTI counters of {len(doc['kernels'])} kernels of rank {doc['rank']} "
        f"({len(doc['counter_names'])} counters; FLOPs from the SASS instruction counters)"
    )
    table = Table(title="By top-level op")
    for col in ("op", "kernels", "GFLOP"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for o in doc["by_top_level_op"][:_DIFF_ROWS]:
        table.add_row(
            safe_text(o["op"])[:60], str(o["kernels"]), "" if o["flops"] is None else f"{o['flops'] / 1e9:.3f}"
        )
    console.print(table)
    table = Table(title="Kernels with the most FLOPs")
    for col in ("kernel", "bottom op", "GFLOP"):
        table.add_column(col, justify="left" if col != "GFLOP" else "right")
    ranked = sorted(doc["kernels"], key=lambda k: -(k["flops"] or 0.0))
    for k in ranked[:_DIFF_ROWS]:
        table.add_row(
            safe_text(k["name"])[:60],
            safe_text(k["bottom_level_op"])[:30],
            "" if k["flops"] is None else f"{k['flops'] / 1e9:.3f}",
        )
    console.print(table)
    for w in doc["warnings"]:
        print(warning_line(w), file=sys.stderr)


#: Rows of each list the human diff shows.
_DIFF_ROWS = 15


def _print_diff(doc: dict) -> None:
    from rich.table import Table

    c, t = doc["control"], doc["test"]

    def side(s: dict) -> str:
        its = s["iterations"]
        gpu = "" if s["gpu_step_us"] is None else f", GPU {s['gpu_step_us'] / 1e3:.3f} ms"
        return (
            f"{safe_text(s['path'])} step {its[0]}"
            + (f"-{its[-1]}" if len(its) > 1 else "")
            + (f" (host {s['host_step_us'] / 1e3:.3f} ms{gpu})")
        )

    console.print(f"Trace diff ({doc['device']}): {side(c)} → {side(t)}")
    for title, rows in (("Slower", doc["slower"]), ("Faster", doc["faster"])):
        if not rows:
            continue
        table = Table(title=f"{title} (test − control, µs; share of the control's step)")
        for col in ("op / kernel", "where", "calls", "control µs", "test µs", "Δ µs", "of step"):
            table.add_column(col, justify="left" if col in ("op / kernel", "where") else "right")
        for r in rows[:_DIFF_ROWS]:
            share = "" if r["share_of_step"] is None else f"{r['share_of_step']:+.1%}"
            table.add_row(
                safe_text(r["name"])[:70],
                "GPU" if r["on_gpu"] else "CPU",
                f"{r['control_counts']}→{r['test_counts']}",
                str(r["control_total_us"]),
                str(r["test_total_us"]),
                f"{r['diff_us']:+d}",
                share,
            )
        console.print(table)
        if len(rows) > _DIFF_ROWS:
            console.print(f"… and {len(rows) - _DIFF_ROWS} more (--json lists them)")
    for label, names in (("new", doc["new"]), ("gone", doc["gone"])):
        if names:
            shown = ", ".join(safe_text(n)[:60] for n in names[:8])
            more = f" … and {len(names) - 8} more" if len(names) > 8 else ""
            console.print(f"{label} ({len(names)}): {shown}{more}")


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


def _model_shape(**shape: Any) -> dict[str, Any] | None:
    """The model's --params ... --tokens-per-step, all of them or none (no MFU)."""
    if all(v is None for v in shape.values()):
        return None
    missing = [k for k, v in shape.items() if v is None]
    if missing:
        raise ConfigError(f"steps: MFU needs --{' --'.join(m.replace('_', '-') for m in missing)} too")
    return shape


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

    from hpcwatch.records import PHASES  # here: creating records' dataclasses costs the other modes ~5 ms

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
