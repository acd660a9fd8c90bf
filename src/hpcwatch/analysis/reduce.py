"""One rank's trace reduced to what the cross-rank analyses need: the seam between a rank and the set.

``hpcwatch steps`` splits at this seam whether it runs in one process or on Dask workers::

    rank-0.json.gz ─ read ─ reduce_trace ─┐
    rank-1.json.gz ─ read ─ reduce_trace ─┼─ anatomy_from_timelines ─ find_stragglers ─ report
    …                                     │  (cross-rank: clock offsets, waits, arrivals)
    rank-N.json.gz ─ read ─ reduce_trace ─┘

``reduce_trace`` keeps, per rank, the step table (``analysis.steps.RankTimeline``: each
step's host phases, GPU busy/compute/phase times and its collectives' start and end) and
the rank's GPU tables in HTA's terms (kernel kinds and top kernels, idle time by stream,
comm-compute overlap, launch statistics, collectives by name with their bandwidths). A
rank of 30 steps is a few kB instead of its trace's tens of MB, so a set of thousands of
ranks fits in one process once reduced, while each worker holds one trace at a time.

``to_table`` / ``from_table`` carry reductions as one Arrow table, one row per rank, columns
``reduced_schema()`` (units in the names): a Dask worker sends its row back as an Arrow IPC
stream (``to_ipc``), and ``write_parquet`` keeps a set's table as one Parquet file any
Parquet reader opens (``hpcwatch steps --reduced FILE``). The round trip is exact (float64
throughout), so the set's report is the same whichever path reduced it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np

from hpcwatch.analysis import kernels
from hpcwatch.analysis.kernels import KernelBreakdown, StreamIdle
from hpcwatch.analysis.steps import (
    WORK_PHASES,
    GpuStep,
    RankTimeline,
    StepCell,
    TemporalBreakdown,
    rank_timeline,
    temporal_breakdown,
)
from hpcwatch.errors import InputError, ParseError
from hpcwatch.records import PHASES
from hpcwatch.traces import KinetoTrace

if TYPE_CHECKING:  # pyarrow is loaded only to carry reductions (Dask, files), not on the one-process path
    import pyarrow as pa

__all__ = [
    "LaunchSummary",
    "CollectiveSummary",
    "RankGpu",
    "RankReduction",
    "reduce_trace",
    "rank_gpu",
    "reduced_schema",
    "to_table",
    "from_table",
    "to_ipc",
    "table_of_ipc",
    "write_parquet",
    "read_parquet",
    "is_reduced_parquet",
    "REDUCED_FORMAT_VERSION",
]

#: Written in the table's metadata; a table of another version is refused rather than misread.
REDUCED_FORMAT_VERSION = "2"


class LaunchSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``kernels.LaunchStats`` without its per-launch arrays: the counts and quantiles a report shows."""

    launches: int
    short_kernels: int
    runtime_outliers: int
    launch_delay_outliers: int
    launch_delay_us: Mapping[str, float]
    """p50, p95 and max of the launch delay (empty without launches)."""


class CollectiveSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One collective name of one rank (the kernels whose bus bandwidth is known)."""

    collective: str
    count: int
    msg_bytes: float
    """Median input message size."""
    group_size: int | None
    algbw_bytes_s_max: float
    busbw_bytes_s_max: float
    busbw_bytes_s_median: float


class RankGpu(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's GPU breakdowns (``analysis.kernels``), in HTA's terms."""

    rank: int
    kernels: KernelBreakdown
    idle: tuple[StreamIdle, ...]  # (the field ``kernels`` hides the module here)
    overlap: float | None
    launches: LaunchSummary
    collectives: tuple[CollectiveSummary, ...]


class RankReduction(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``hpcwatch steps`` needs from one rank's trace."""

    timeline: RankTimeline
    gpu: RankGpu | None
    """``None`` for a CPU-only trace (no kernel on a stream)."""
    breakdown: TemporalBreakdown | None
    """HTA's temporal breakdown; ``None`` without GPU activity in the profiled steps."""

    @property
    def rank(self) -> int:
        return self.timeline.rank


def reduce_trace(trace: KinetoTrace) -> RankReduction:
    """The per-rank reduction of ``trace`` (the same function in one process and on a Dask worker)."""
    try:
        breakdown = temporal_breakdown(trace)
    except InputError:
        breakdown = None  # a CPU-only trace has no GPU time to break down
    gpu = rank_gpu(trace) if kernels.has_gpu_activity(trace) else None
    return RankReduction(timeline=rank_timeline(trace), gpu=gpu, breakdown=breakdown)


def rank_gpu(trace: KinetoTrace) -> RankGpu:
    """``trace``'s kernel, idle, overlap, launch and collective tables."""
    kept = kernels.profiled_rows(trace)  # once for the four tables, which each need it
    launches = kernels.launch_stats(trace, kept=kept)
    return RankGpu(
        rank=trace.rank,
        kernels=kernels.kernel_breakdown(trace, kept=kept),
        idle=kernels.idle_breakdown(trace, kept=kept),
        overlap=kernels.comm_compute_overlap(trace, kept=kept),
        launches=LaunchSummary(
            launches=launches.launches,
            short_kernels=launches.short_kernels,
            runtime_outliers=launches.runtime_outliers,
            launch_delay_outliers=launches.launch_delay_outliers,
            launch_delay_us=launches.launch_delay_quantiles_us(),
        ),
        collectives=_collective_summaries(kernels.collectives(trace)),
    )


class _KnownBandwidth(NamedTuple):
    """A collective kernel whose bus bandwidth is known."""

    msg_bytes: float
    group_size: int | None
    algbw_bytes_s: float
    busbw_bytes_s: float


def _collective_summaries(found: Sequence[kernels.Collective]) -> tuple[CollectiveSummary, ...]:
    by_name: dict[str, list[_KnownBandwidth]] = {}
    for c in found:
        # kernels.collectives gives a busbw only with the collective's name and its algbw
        if c.busbw_bytes_s is not None and c.collective is not None and c.algbw_bytes_s is not None:
            known = _KnownBandwidth(c.msg_bytes, c.group_size, c.algbw_bytes_s, c.busbw_bytes_s)
            by_name.setdefault(c.collective, []).append(known)
    return tuple(
        CollectiveSummary(
            collective=name,
            count=len(cs),
            msg_bytes=float(np.median([c.msg_bytes for c in cs])),
            group_size=cs[0].group_size,
            algbw_bytes_s_max=max(c.algbw_bytes_s for c in cs),
            busbw_bytes_s_max=max(c.busbw_bytes_s for c in cs),
            busbw_bytes_s_median=float(np.median([c.busbw_bytes_s for c in cs])),
        )
        for name, cs in sorted(by_name.items())
    )


# --- the Parquet table ---------------------------------------------------------------------------------


def _struct(**fields: Any) -> Any:
    import pyarrow as pa

    return pa.struct([pa.field(name, kind) for name, kind in fields.items()])


@functools.cache
def reduced_schema() -> pa.Schema:
    """One row per rank. Times: ``_us`` on the rank's trace clock, ``_s`` seconds (``start_s`` UTC).

    ``cells``: the rank's profiled steps (``StepCell``): ``phases`` host seconds per phase,
    ``gpu`` (null on CPU-only traces) the step's GPU activity with ``phases`` per work phase
    (null where the step has none), ``coll_starts_us``/``coll_ends_us`` its collectives.
    ``gpu``: the rank's GPU tables (``RankGpu``, null on CPU-only traces). ``breakdown``:
    HTA's temporal breakdown (µs).
    """
    import pyarrow as pa

    f64, i64, text = pa.float64(), pa.int64(), pa.string()
    work = _struct(**dict.fromkeys(WORK_PHASES, f64))
    cell = _struct(
        step=i64,
        lo_us=f64,
        hi_us=f64,
        next_lo_us=f64,
        start_s=f64,
        phases=_struct(**dict.fromkeys(PHASES, f64)),
        gpu=_struct(
            first_us=f64,
            last_us=f64,
            busy_s=f64,
            idle_s=f64,
            overlap_s=f64,
            compute_s=f64,
            comm_s=f64,
            phases=work,
            period_lo_us=f64,
            period_hi_us=f64,
            period_busy_s=f64,
        ),
        coll_starts_us=pa.list_(f64),
        coll_ends_us=pa.list_(f64),
    )
    gpu = _struct(
        kind_us=pa.list_(_struct(kind=text, us=f64)),
        top=pa.list_(_struct(name=text, kind=text, count=i64, total_us=f64, mean_us=f64, min_us=f64, max_us=f64)),
        idle=pa.list_(_struct(stream=i64, host_wait_us=f64, kernel_wait_us=f64, other_us=f64)),
        overlap=f64,
        launches=_struct(
            launches=i64,
            short_kernels=i64,
            runtime_outliers=i64,
            launch_delay_outliers=i64,
            launch_delay_us=_struct(p50=f64, p95=f64, max=f64),
        ),
        collectives=pa.list_(
            _struct(
                collective=text,
                count=i64,
                msg_bytes=f64,
                group_size=i64,
                algbw_bytes_s_max=f64,
                busbw_bytes_s_max=f64,
                busbw_bytes_s_median=f64,
            )
        ),
    )
    return pa.schema(
        [
            ("rank", i64),
            ("world_size", i64),
            ("path", text),
            ("node", text),
            ("gpu_index", i64),
            ("gpu_collectives", pa.bool_()),
            ("cells", pa.list_(cell)),
            ("gpu", gpu),
            ("breakdown", _struct(idle_us=f64, compute_us=f64, non_compute_us=f64, kernel_us=f64)),
        ],
        metadata={"hpcwatch.reduced": REDUCED_FORMAT_VERSION},
    )


def to_table(reductions: Sequence[RankReduction]) -> pa.Table:
    """The reductions as one Arrow table (one row per rank, ``reduced_schema``)."""
    import pyarrow as pa

    return pa.Table.from_pylist([_row(r) for r in reductions], schema=reduced_schema())


def from_table(table: pa.Table, *, path: str = "<reduced>") -> list[RankReduction]:
    """The reductions of a table ``to_table`` made (refused when its format version differs)."""
    version = (table.schema.metadata or {}).get(b"hpcwatch.reduced", b"").decode()
    if version != REDUCED_FORMAT_VERSION:
        raise ParseError(
            f"not a reduced trace table of version {REDUCED_FORMAT_VERSION} (found {version or 'none'})", path=path
        )
    return [_reduction(row) for row in table.to_pylist()]


def to_ipc(reductions: Sequence[RankReduction]) -> bytes:
    """The table as an Arrow IPC stream: how a worker sends its rank back. Parquet's nested encoding costs
    per column (~60 leaf columns here), ~60x IPC's on a one-row table, which for 1,024 ranks read one by one
    in the client was longer than reducing them (benchmarks/RESULTS.md, "Steps on Dask")."""
    import pyarrow as pa

    table = to_table(reductions)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    stream: bytes = sink.getvalue().to_pybytes()  # pyarrow has no stubs: its calls answer Any
    return stream


def table_of_ipc(streams: Iterable[bytes]) -> pa.Table:
    """The tables of many ``to_ipc`` streams as one (rows in order)."""
    import pyarrow as pa

    return pa.concat_tables([pa.ipc.open_stream(s).read_all() for s in streams] or [to_table([])])


def write_parquet(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """The reduced set as one Parquet file (zstd), written to a temporary file and renamed into place."""
    import pyarrow.parquet as pq

    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, target)  # the rename is atomic: a reader sees the old file or the new one
    finally:
        tmp.unlink(missing_ok=True)


def is_reduced_parquet(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Parquet file whose footer names it a reduced trace table (of any version:
    ``read_parquet`` refuses another one in one line); reads the footer only."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, ValueError):  # not Parquet (pyarrow's ArrowInvalid is a ValueError)
        return False
    return b"hpcwatch.reduced" in metadata


def read_parquet(path: str | os.PathLike[str]) -> list[RankReduction]:
    """The reductions of a file ``write_parquet`` wrote."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise ParseError(f"not a Parquet file: {err}", path=str(path)) from err
    return from_table(table, path=str(path))


def _row(r: RankReduction) -> dict[str, Any]:
    t = r.timeline
    return {
        "rank": t.rank,
        "world_size": t.world_size,
        "path": t.path,
        "node": t.node,
        "gpu_index": t.gpu,
        "gpu_collectives": t.gpu_collectives,
        "cells": [_cell_row(c) for c in t.cells],
        "gpu": None if r.gpu is None else _gpu_row(r.gpu),
        "breakdown": None
        if r.breakdown is None
        else {
            "idle_us": r.breakdown.idle_us,
            "compute_us": r.breakdown.compute_us,
            "non_compute_us": r.breakdown.non_compute_us,
            "kernel_us": r.breakdown.kernel_us,
        },
    }


def _cell_row(c: StepCell) -> dict[str, Any]:
    g = c.gpu
    return {
        "step": c.step,
        "lo_us": c.lo_us,
        "hi_us": c.hi_us,
        "next_lo_us": c.next_lo_us,
        "start_s": c.start_s,
        "phases": dict(c.phases),
        "coll_starts_us": c.coll_starts_us.tolist(),
        "coll_ends_us": c.coll_ends_us.tolist(),
        "gpu": None
        if g is None
        else {
            "first_us": g.first_us,
            "last_us": g.last_us,
            "busy_s": g.busy_s,
            "idle_s": g.idle_s,
            "overlap_s": g.overlap_s,
            "compute_s": g.compute_s,
            "comm_s": g.comm_s,
            "phases": dict(g.phases),
            "period_lo_us": g.period_lo_us,
            "period_hi_us": g.period_hi_us,
            "period_busy_s": g.period_busy_s,
        },
    }


def _gpu_row(g: RankGpu) -> dict[str, Any]:
    launches = g.launches
    return {
        "kind_us": [{"kind": k, "us": v} for k, v in g.kernels.kind_us.items()],
        "top": [
            {
                "name": k.name,
                "kind": k.kind,
                "count": k.count,
                "total_us": k.total_us,
                "mean_us": k.mean_us,
                "min_us": k.min_us,
                "max_us": k.max_us,
            }
            for k in g.kernels.top
        ],
        "idle": [
            {
                "stream": i.stream,
                "host_wait_us": i.host_wait_us,
                "kernel_wait_us": i.kernel_wait_us,
                "other_us": i.other_us,
            }
            for i in g.idle
        ],
        "overlap": g.overlap,
        "launches": {
            "launches": launches.launches,
            "short_kernels": launches.short_kernels,
            "runtime_outliers": launches.runtime_outliers,
            "launch_delay_outliers": launches.launch_delay_outliers,
            "launch_delay_us": dict(launches.launch_delay_us) or None,
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


def _reduction(row: Mapping[str, Any]) -> RankReduction:
    rank = row["rank"]
    timeline = RankTimeline(
        rank=rank,
        world_size=row["world_size"],
        path=row["path"],
        node=row["node"],
        gpu=row["gpu_index"],
        gpu_collectives=row["gpu_collectives"],
        cells=tuple(_cell(c) for c in row["cells"]),
    )
    b = row["breakdown"]
    return RankReduction(
        timeline=timeline,
        gpu=None if row["gpu"] is None else _gpu(rank, row["gpu"]),
        breakdown=None if b is None else TemporalBreakdown(rank=rank, **b),
    )


def _cell(c: Mapping[str, Any]) -> StepCell:
    g = c["gpu"]
    gpu = None if g is None else GpuStep(**{**g, "phases": {p: v for p, v in g["phases"].items() if v is not None}})
    return StepCell(
        step=c["step"],
        lo_us=c["lo_us"],
        hi_us=c["hi_us"],
        next_lo_us=c["next_lo_us"],
        start_s=c["start_s"],
        phases=dict(c["phases"]),
        gpu=gpu,
        coll_starts_us=np.asarray(c["coll_starts_us"], dtype=np.float64),
        coll_ends_us=np.asarray(c["coll_ends_us"], dtype=np.float64),
    )


def _gpu(rank: int, g: Mapping[str, Any]) -> RankGpu:
    launches = g["launches"]
    return RankGpu(
        rank=rank,
        kernels=kernels.KernelBreakdown(
            rank=rank,
            kind_us={k["kind"]: k["us"] for k in g["kind_us"]},
            top=tuple(kernels.KernelStat(**k) for k in g["top"]),
        ),
        idle=tuple(kernels.StreamIdle(rank=rank, **i) for i in g["idle"]),
        overlap=g["overlap"],
        launches=LaunchSummary(**{**launches, "launch_delay_us": dict(launches["launch_delay_us"] or {})}),
        collectives=tuple(CollectiveSummary(**c) for c in g["collectives"]),
    )
