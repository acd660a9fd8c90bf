"""`hpcwatch whatif`, `hpcwatch mfu`, `hpcwatch simulate stragglers`: views over reports.whatif."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

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
    safe_text,
    simulate_app,
)
from hpcwatch.cli.defaults import MFU_GPU, STRAGGLER_SIM_STEPS
from hpcwatch.errors import ConfigError, InputError, ParseError

if TYPE_CHECKING:  # numpy and the reports are imported when a command runs, not for --help
    import numpy as np

    from hpcwatch.analysis.whatif import WhatIf

__all__ = ["whatif", "mfu", "stragglers"]

# How many workers the human report lists.
_WORKERS_SHOWN = 8


@app.command()
@argument("trace", type=PATH, help="Per-operation trace (Parquet, ByteDance straggler format).")
@click.option("--job", help="Use this job's step spans from the store instead.")
@db_option()
@json_option()
def whatif(trace: Path | None, job: str | None, db: str | None, as_json: bool) -> None:
    """What-if slowdown S: how much faster the steps would be if no worker straggled."""
    from hpcwatch.reports.whatif import whatif_document, whatif_of_job, whatif_of_ops

    if (trace is None) == (job is None):
        raise ConfigError("whatif: give a TRACE file or --job ID (one of them)")
    if trace is not None:
        result = whatif_of_ops(_read_op_trace(trace))
    elif job is not None:
        with open_store(db) as store:
            result = whatif_of_job(store, job)
    if as_json:
        emit_json(whatif_document(result))
    else:
        _print_whatif(result)


def _read_op_trace(path: Path):
    """The op table of ``path``, which the format registry must recognise as one."""
    from hpcwatch.sources.registry import Input, plan_inputs

    inputs: list[Input | None] = [i for i in plan_inputs([path]) if isinstance(i, Input)]
    (item,) = inputs or [None]
    if item is None or item.format is None or item.format.yields != "op-table":
        what = item.format.name if item is not None and item.format else "empty or a folder"
        raise InputError(f"{path}: whatif reads a per-operation Parquet trace, not {what}")
    return item.format.read(item.path, item.context)


def _print_whatif(r: WhatIf) -> None:
    from rich.table import Table

    from hpcwatch.reports.whatif import step_time_means

    console.print(
        f"[bold]{safe_text(r.verdict)}[/bold]  ({r.dp_size} data-parallel × {r.pp_size} pipeline workers, "
        f"{len(r.steps)} steps)"
    )
    if r.slowdown is None:
        return  # the model misses the steps: its shares of S would explain a step that did not happen
    means = step_time_means(r)
    console.print(
        f"step time: measured {means.actual_s:.4f} s, replayed {means.replay_s:.4f} s, "
        f"without stragglers {means.ideal_s:.4f} s (trace/replay {r.replay_ratio:.3f})"
    )
    table = Table(title="S if only this kept its measured durations")
    table.add_column("group")
    table.add_column("S", justify="right")
    for name, value in r.by_optype.items():
        table.add_row(f"op {safe_text(name)}", f"{value:.3f}")
    for w in r.by_worker[:_WORKERS_SHOWN]:
        table.add_row(f"worker dp {w.dp_rank} stage {w.stage} (rank {w.rank})", f"{w.slowdown:.3f}")
    console.print(table)
    for label, share in (("last stage (M_S)", r.last_stage), ("slowest workers (M_W)", r.top_workers)):
        if share is not None:
            console.print(
                f"{label}: removing them removes {share.removed:.0%} of the slowdown; "
                f"alone they cause {share.added:.0%}"
            )


@app.command()
@click.option("--params", type=Number(min=0.0, min_open=True), required=True, help="Non-embedding parameters N.")
@click.option("--layers", type=int, required=True, help="Transformer layers L.")
@click.option("--d-model", type=int, required=True, help="Hidden size d.")
@click.option("--seq", type=int, required=True, help="Sequence length T.")
@click.option("--tokens-per-step", type=Number(min=0.0, min_open=True), required=True, help="Global batch, tokens.")
@click.option("--step-time", type=Number(min=0.0, min_open=True), required=True, help="Step time, seconds.")
@click.option("--gpus", type=int, default=1, help="GPUs sharing the step.")
@click.option("--gpu", default=MFU_GPU, help="GPU type (catalog key or driver name).")
@click.option("--recompute", is_flag=True, default=False, help="Full activation recomputation (reports HFU).")
@json_option()
def mfu(
    params: float,
    layers: int,
    d_model: int,
    seq: int,
    tokens_per_step: float,
    step_time: float,
    gpus: int,
    gpu: str,
    recompute: bool,
    as_json: bool,
) -> None:
    """Model FLOPs utilisation (PaLM: 6N + 12·L·d·T per token) against the GPU's dense BF16 peak."""
    from hpcwatch.reports.whatif import model_mfu, model_mfu_document

    r = model_mfu(
        params=params,
        layers=layers,
        d_model=d_model,
        seq=seq,
        tokens_per_step=tokens_per_step,
        step_time_s=step_time,
        gpus=gpus,
        gpu=gpu,
        recompute=recompute,
    )
    if as_json:
        emit_json(model_mfu_document(r))
        return
    console.print(
        f"MFU [bold]{r.mfu:.1%}[/bold] on {gpus} × {safe_text(r.gpu)}: {r.achieved_flops / 1e12:.1f} of "
        f"{r.peak_flops / 1e12:.1f} TFLOP/s per GPU, {r.tokens_per_s:,.0f} tokens/s, "
        f"{r.flops_per_token:.4g} FLOPs/token" + (f"; HFU {r.hfu:.1%}" if r.hfu is not None else "")
    )


@simulate_app.command("stragglers")
@click.option("--gpus", default="8,64,512,1024,4096,16384,100000", help="Job sizes, comma-separated.")
@click.option("--cv", type=Number(min=0.0), help="Coefficient of variation of a GPU's step (normal).")
@click.option("--sample", type=PATH, help="Measured per-GPU step times: JSON list or one number a line.")
@click.option("--job", help="Take the per-GPU step times from this job's spans.")
@click.option("--p-slow", type=Number(min=0.0, max=1.0), default=0.0, help="Probability that a GPU is a slow one.")
@click.option("--slow-factor", type=Number(min=1.0), default=1.0, help="How many times slower a slow GPU is.")
@click.option("--steps", type=int, default=STRAGGLER_SIM_STEPS, help="Monte-Carlo steps per job size.")
@click.option("--seed", type=int, default=0, help="Random seed.")
@db_option()
@json_option()
def stragglers(
    gpus: str,
    cv: float | None,
    sample: Path | None,
    job: str | None,
    p_slow: float,
    slow_factor: float,
    steps: int,
    seed: int,
    db: str | None,
    as_json: bool,
) -> None:
    """Synchronous efficiency vs job size: one GPU's mean step over the slowest-of-N's, exact and Monte-Carlo."""
    from rich.table import Table

    from hpcwatch.reports.whatif import job_busy_times, step_over_one_gpu, straggler_efficiency

    sizes = _parse_gpus(gpus)
    if sum(x is not None for x in (cv, sample, job)) != 1:
        raise ConfigError("simulate stragglers: give exactly one of --cv, --sample, --job")
    values = None
    if sample is not None:
        values = _read_sample(sample)
    elif job is not None:
        with open_store(db) as store:
            values = job_busy_times(store, job)
    curve = straggler_efficiency(
        sizes, cv=cv, sample=values, p_slow=p_slow, slow_factor=slow_factor, steps=steps, seed=seed
    )
    if as_json:
        emit_json(dataclasses.asdict(curve))
        return
    table = Table(
        title=f"Synchronous efficiency ({curve.distribution}, cv {curve.cv:.3f}, "
        f"p_slow {p_slow:g}, slow ×{slow_factor:g})"
    )
    for col in ("GPUs", "efficiency", "Monte-Carlo", "step / one GPU's", "P(a slow GPU)"):
        table.add_column(col, justify="right")
    for p, relative in zip(curve.points, step_over_one_gpu(curve), strict=True):
        table.add_row(
            f"{p.gpus:,}",
            f"{p.efficiency:.2%}",
            f"{p.efficiency_mc:.2%}",
            f"{relative:.3f}",
            f"{p.p_any_slow:.1%}",
        )
    console.print(table)


def _parse_gpus(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as err:
        raise ConfigError(f"--gpus: comma-separated whole numbers, got {text!r}") from err


def _read_sample(path: Path) -> np.ndarray:
    import numpy as np

    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from err
    if text.lstrip().startswith("["):
        try:
            return np.asarray(orjson.loads(text), dtype=float)
        except (orjson.JSONDecodeError, TypeError, ValueError) as err:
            raise ParseError("not a JSON list of numbers", path=path) from err
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                values.append(float(line))
            except ValueError as err:
                raise ParseError("not a number", path=path, line=number, text=line) from err
    return np.asarray(values, dtype=float)
