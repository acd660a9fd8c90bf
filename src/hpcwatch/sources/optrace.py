"""Read a per-operation training trace: one row per GPU operation of a 3D-parallel job.

This is the trace format of ByteDance's straggler study (OSDI'25, "Understanding
Stragglers in Large Model Training Using What-if Analysis",
https://github.com/ByteDance-Seed/StragglerAnalysis): a Parquet file, one row per
Megatron-LM operation (``forward-compute``, ``backward-recv``, ``grads-reduce-scatter``,
``optimizer``…) on one worker, a worker being one (data-parallel rank, pipeline
stage) pair whose tensor-parallel ranks move in lock-step.

The reader returns a columnar batch (a ``pyarrow.Table``), never one object per
row. Its columns, in this order (``OP_TRACE_COLUMNS``):

====================  ========  ====================================================
column                type      meaning
====================  ========  ====================================================
``dp_rank``           int32     data-parallel rank of the worker
``stage``             int32     pipeline stage of the worker
``rank``              int32     global rank of the worker's GPU
``step``              int64     training iteration
``optype``            string    operation type (Megatron name)
``seq_id``            int32     index of this operation among those of its type
                                on the worker in this step (micro-batch order)
``mc``                int32     model chunk (virtual pipeline); -1 when none
``start_s``           float64   start, seconds (any common origin)
``dur_s``             float64   duration, seconds
====================  ========  ====================================================

When the trace has one row per tensor-parallel rank, an int32 ``tp_rank`` column
follows (the artifact's traces hold one rank per worker and have none).

Lenient on purpose: extra columns (``mb_id``, ``gmc``) are dropped, and the
reader does not check that the operations form a schedule it can replay; the
what-if analysis does that and says which operation is missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hpcwatch.errors import ParseError

__all__ = ["OP_TRACE_COLUMNS", "read_optrace", "parse_optrace"]

#: Output columns and their Arrow types (see the module docstring).
OP_TRACE_COLUMNS: dict[str, pa.DataType] = {
    "dp_rank": pa.int32(),
    "stage": pa.int32(),
    "rank": pa.int32(),
    "step": pa.int64(),
    "optype": pa.string(),
    "seq_id": pa.int32(),
    "mc": pa.int32(),
    "start_s": pa.float64(),
    "dur_s": pa.float64(),
}

# The artifact's column names for the two time columns (seconds).
_RENAMED = {"start_ts": "start_s", "duration": "dur_s"}


def read_optrace(path: str | Path) -> pa.Table:
    """Open a Parquet operation trace and return the documented columnar batch."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise ParseError(f"not a readable Parquet file: {err}", path=path) from err
    return parse_optrace(table, path=path)


def parse_optrace(table: pa.Table, *, path: str | Path = "<table>") -> pa.Table:
    """Check and normalise an operation trace already in memory (names, types, values)."""
    table = table.rename_columns([_RENAMED.get(name, name) for name in table.column_names])
    missing = [name for name in OP_TRACE_COLUMNS if name not in table.column_names and name != "mc"]
    if missing:
        raise ParseError(f"missing column(s) {', '.join(missing)}", path=path, text=",".join(table.column_names))
    columns = {}
    for name, typ in OP_TRACE_COLUMNS.items():
        if name == "mc" and name not in table.column_names:
            columns[name] = pa.array(np.full(table.num_rows, -1, dtype=np.int32))
            continue
        columns[name] = _cast(table[name], typ, name, path)
    if "tp_rank" in table.column_names:
        columns["tp_rank"] = _cast(table["tp_rank"], pa.int32(), "tp_rank", path)
    out = pa.table(columns)
    _check_values(out, path)
    return out


def _cast(column: pa.ChunkedArray, typ: pa.DataType, name: str, path: str | Path) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if column.null_count:
        raise ParseError(f"column {name} has {column.null_count} empty value(s)", path=path)
    try:
        return column.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ParseError(f"column {name} is {column.type}, expected {typ}", path=path) from err


def _check_values(table: pa.Table, path: str | Path) -> None:
    dur = table["dur_s"].to_numpy()
    bad = np.flatnonzero(~np.isfinite(dur) | (dur < 0))
    if bad.size:
        row = int(bad[0])
        raise ParseError(
            f"row {row}: duration must be a finite number >= 0", path=path, text=str(table.slice(row, 1).to_pylist()[0])
        )
    if not pc.all(pc.is_finite(table["start_s"])).as_py():
        raise ParseError("column start_s has a non-finite value", path=path)
    for name in ("dp_rank", "stage", "seq_id", *(["tp_rank"] if "tp_rank" in table.column_names else [])):
        if table.num_rows and pc.min(table[name]).as_py() < 0:
            raise ParseError(f"column {name} has a negative value", path=path)
