"""``hpcwatch twin run``: run the twin and write the real-format files a cluster's collectors would leave.

(``hpcwatch twin serve`` lives in cli/twinserve.py.)
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import click

from hpcwatch.cli.common import PATH, Number, console, emit_json, json_option, repeatable, twin_app
from hpcwatch.cli.defaults import TWIN_STEP_S
from hpcwatch.errors import ConfigError

__all__ = ["twin_run", "twin_traces", "DEFAULT_DURATION_S", "MAX_AUTO_WORKERS"]

#: Ten minutes of simulated time: enough for checkpoints, job churn and a few hundred samples per GPU.
DEFAULT_DURATION_S = 600.0
#: Writer processes chosen by default: beyond four the disk, not the formatting, sets the pace.
MAX_AUTO_WORKERS = 4


@twin_app.command("run")
@click.option("--out", type=PATH, required=True, help="Folder to write (created; files inside are replaced).")
@click.option("--duration", type=Number(min=0.0), default=DEFAULT_DURATION_S, help="Simulated seconds.")
@click.option(
    "--model",
    default="reference",
    show_default=True,
    help="Cluster model: reference (2 x 8 H100 SXM), mi300x (2 x 8 AMD MI300X: AMD device-metrics-exporter "
    "text instead of dcgm-exporter's), or a cluster YAML file.",
)
@click.option("--nodes", type=int, help="Nodes of the model's first node group (default: the model's count).")
@click.option("--seed", type=int, default=0, help="Random seed: the same seed writes the same files.")
@repeatable("--scenario", help="Scenario to play (repeatable).")
@click.option(
    "--step", type=Number(min=0.0, min_open=True), default=TWIN_STEP_S, help="Resolution: seconds between scrapes."
)
@click.option("--spans", is_flag=True, default=False, help="Also write spans.jsonl (the training job's steps).")
@click.option(
    "--traces",
    type=PATH,
    help="Also write the training job's steps as Kineto traces (rank-N.json) in this folder, for hpcwatch steps.",
)
@click.option(
    "--workers",
    type=int,
    default=0,
    help="Processes writing the scrape files (0: one per core, at most 4, for clusters over 32 nodes).",
)
@json_option("json_out")
def twin_run(
    out: Path,
    duration: float,
    model: str,
    nodes: int | None,
    seed: int,
    scenario: list[str],
    step: float,
    spans: bool,
    traces: Path | None,
    workers: int,
    json_out: bool,
) -> None:
    """Write the twin's dcgm-exporter, node-exporter, Slurm, Lustre and perfquery files; read them back
    with ``hpcwatch ingest OUT``."""
    from rich.progress import Progress

    from hpcwatch.twin import Twin, scenario_names
    from hpcwatch.twin.run import SNAPSHOT_MAX_NODES, sized_model, write_run

    if duration <= 0 or step <= 0:
        raise ConfigError(f"--duration and --step must be > 0, got {duration} and {step}")
    if step > duration:
        raise ConfigError(f"--step ({step}) is longer than --duration ({duration})")
    twin = Twin(sized_model(model, nodes), seed=seed, scenarios=scenario)
    if workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {workers}")
    if workers == 0:
        workers = min(os.cpu_count() or 1, MAX_AUTO_WORKERS) if len(twin.node_names) > SNAPSHOT_MAX_NODES else 1
    if json_out:
        summary = write_run(
            twin, out, duration_s=duration, step_s=step, spans=spans, traces_dir=traces, workers=workers
        )
        emit_json(
            {
                **asdict(summary),
                "nodes": len(twin.node_names),
                "gpus": twin.n_gpus,
                "scenarios": [s.name for s in twin.scenarios],
            }
        )
        return
    with Progress(console=console.real, transient=True) as progress:
        task = progress.add_task("simulating", total=round(duration / step))
        summary = write_run(
            twin,
            out,
            duration_s=duration,
            step_s=step,
            spans=spans,
            traces_dir=traces,
            workers=workers,
            progress=lambda done, total: progress.update(task, completed=done),
        )
    console.print(
        f"[bold]{summary.out}[/]: {summary.ticks} scrapes of {len(twin.node_names)} nodes "
        f"({twin.n_gpus} GPUs), {summary.files} files, {summary.jobs} jobs"
        + (f", scenarios: {', '.join(s.name for s in twin.scenarios)}" if twin.scenarios else "")
        + f". Known scenarios: {', '.join(scenario_names())}."
    )
    console.print(f"Read it back: hpcwatch ingest {summary.out} --db FILE; then hpcwatch jobs --db FILE")


@twin_app.command("traces")
@click.option("--out", type=PATH, required=True, help="Folder to write rank-<r>.json into (created; files replaced).")
@click.option("--ranks", type=int, default=16, help="Ranks of the data-parallel job (one trace each).")
@click.option("--steps", type=int, default=10, help="Profiled steps per trace.")
@click.option("--kernels", type=int, default=28, help="Compute kernels per step (the step's GPU time is kept).")
@click.option(
    "--slow-rank", type=int, help="This rank's GPU runs its backward slower (the gpu_straggler scenario's factor)."
)
@click.option("--gpus-per-node", type=int, default=8, help="Ranks per node (rank r on node r // N + 1).")
@click.option("--seed", type=int, default=0, help="Random seed: the same seed writes the same files.")
@json_option("json_out")
def twin_traces(
    out: Path,
    ranks: int,
    steps: int,
    kernels: int,
    slow_rank: int | None,
    gpus_per_node: int,
    seed: int,
    json_out: bool,
) -> None:
    """Write a kernel-level Kineto trace set of RANKS ranks, small per rank, for hpcwatch steps at scale."""
    import time

    from hpcwatch.twin.exposition import GpuTraceConfig, with_kernels_per_step, write_gpu_kineto_traces
    from hpcwatch.twin.straggler import GPU_STRAGGLER_BACKWARD_FACTOR

    if ranks < 1 or steps < 1 or gpus_per_node < 1:
        raise ConfigError(f"--ranks, --steps and --gpus-per-node must be >= 1, got {ranks}, {steps}, {gpus_per_node}")
    if slow_rank is not None and not 0 <= slow_rank < ranks:
        raise ConfigError(f"--slow-rank must be a rank in 0..{ranks - 1}, got {slow_rank}")
    cfg = with_kernels_per_step(
        GpuTraceConfig(
            seed=seed,
            slow_rank=slow_rank,
            slow_backward_factor=(GPU_STRAGGLER_BACKWARD_FACTOR if slow_rank is not None else 1.0),
        ),
        kernels,
    )
    t0 = time.perf_counter()
    files = write_gpu_kineto_traces(
        out,
        cfg,
        steps=list(range(1, steps + 1)),
        world_size=ranks,
        nodes_of_rank={r: f"node{r // gpus_per_node + 1}" for r in range(ranks)},
        gpus_per_node=gpus_per_node,
    )
    written = sum(p.stat().st_size for p in out.glob("rank-*.json"))
    summary = {
        "out": str(out),
        "files": files,
        "ranks": ranks,
        "steps": steps,
        "bytes": written,
        "seconds": round(time.perf_counter() - t0, 3),
        "slow_rank": slow_rank,
    }
    if json_out:
        emit_json(summary)
        return
    console.print(
        f"[bold]{out}[/]: {files} Kineto traces ({ranks} ranks × {steps} steps, {written / 1e6:.1f} MB) "
        f"in {summary['seconds']} s. Read them: hpcwatch steps {out}"
    )
