"""Read a PyTorch profiler (Kineto) Chrome trace into columns, one file per rank.

``torch.profiler`` writes one JSON document per rank (``.json`` or ``.json.gz``):
``{"distributedInfo": {"rank", "world_size", "backend", ...}, "deviceProperties": [...],
"traceEvents": [...]}``. Step anatomy needs every event's time, category and name,
so the reader turns the events into numpy columns, reading, un-gzipping and decoding the
file 64 KiB at a time, and keeps no Python object per event past its piece (memory stays bounded by the piece, not the file).
Each piece is decoded by msgspec straight into small typed structs of the fields we read
(``_Complete``; other phases are read past), then each column is one list comprehension and one numpy conversion; a
piece holding anything those types do not take is decoded by orjson into dicts and read
by the dict scan instead, which gives the same columns and names what is wrong.
Measured (2-core VM, best of 5, in-process, 2026-12): the H200 trace (0.75 MB gz, 11.7 MB of
JSON) reads in 44 ms; the twin's 8 ranks × 60 steps (39.5 MB of JSON) in 189 ms. Of one twin rank
(31.5 MB of JSON, 207k events), zlib takes ~34 ms, msgspec's decode ~68 ms and the columns ~45 ms
(~75 ms while the flow events had columns too: see ``hpcwatch.traces``).

The columns of ``KinetoTrace.events`` are described in ``hpcwatch.traces``. Flow events (``s``/``f``)
are skipped with the other non-complete ones: see ``hpcwatch.traces`` for why.

A trace without a single complete event is a ParseError. Lenient on purpose: instant
(``i``), counter (``C``), flow (``s``/``f``) and metadata (``M``) events are skipped, except
process labels; unknown categories get ``OTHER``; a missing ``dur`` is 0. The reader does not
check that events nest.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple, Union

import msgspec
import numpy as np
import orjson

from hpcwatch.errors import ParseError
from hpcwatch.sources.lines import MAX_FILE_BYTES, open_binary, shown
from hpcwatch.traces import CAT, CATEGORIES, EVENT_COLUMNS, GPU_CATEGORIES, KinetoTrace, gc_paused

__all__ = [
    "KinetoTrace",
    "MAX_TRACE_BYTES",
    "CATEGORIES",
    "CAT",
    "EVENT_COLUMNS",
    "GPU_CATEGORIES",
    "parse_kineto",
    "read_kineto",
    "is_comm_name",
]

# HTA's rule for NCCL kernels (hta/utils/utils.py NCCL_KERNEL_RE), plus the host-side names
# c10d gives collectives: "nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_".
_NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")
_RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

# Bytes per element of c10d's "dtype" arg (torch scalar type names).
_DTYPE_BYTES: Mapping[str, int] = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Byte": 1,
    "Char": 1,
    "Short": 2,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}


def is_comm_name(name: str) -> bool:
    """Whether an event name is a collective (NCCL kernel or a host-side c10d collective)."""
    return name.startswith(_COMM_PREFIXES) or _NCCL_KERNEL_RE.match(name) is not None


class _Names(dict[str, int]):
    """Interns names: the first time a name is seen it gets the next id (``names[name]``, or
    ``map(names.__getitem__, many)``: a C call per name, a Python one only for a new name)."""

    def __missing__(self, name: str) -> int:
        found = self[name] = len(self)
        return found

    __call__ = dict.__getitem__

    @property
    def ids(self) -> dict[str, int]:
        return self


class _Codes(dict[str, int]):
    """``CAT`` plus the unknown categories met so far (code 0, ``OTHER``)."""

    def __missing__(self, cat: str) -> int:
        self[cat] = 0
        return 0


def _int_or(value: Any, default: int, bits: int = 64) -> int:
    """``value`` as an int of ``bits`` (signed), else ``default`` (Kineto writes stream
    4294967295, unsigned -1, for "Context Sync"; pid "Spans"; stream "N/A")."""
    try:
        number = value if type(value) is int else int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -(1 << (bits - 1)) <= number < 1 << (bits - 1) else default


def _msg_bytes(args: Mapping[str, Any]) -> float:
    return _msg_bytes_of(args.get("In msg nelems"), args.get("dtype", ""))


def _msg_bytes_of(nelems: Any, dtype: Any) -> float:
    """``In msg nelems`` × the size of ``dtype``; NaN when either is unknown."""
    size = _DTYPE_BYTES.get(dtype)
    if isinstance(nelems, (int, float)) and size:
        return float(nelems) * size
    return float("nan")


def _group_size(args: Mapping[str, Any]) -> int:
    """c10d's ``Group size`` arg (ranks in the collective), -1 when absent."""
    return _int_or(args.get("Group size"), -1, 32)


_NO_ARGS: Mapping[str, Any] = {}
_NAN = float("nan")
#: Size of the pieces a trace's text is decoded in (see ``_Pieces``); small pieces stay in the CPU cache.
_PIECE_BYTES = 1 << 16
#: Most text (inflated) a trace may have.
MAX_TRACE_BYTES = MAX_FILE_BYTES
#: Cuts tried at the next "}," before a piece's length is doubled instead (see ``_Pieces``).
_CUT_TRIES = 4
#: Size of the blocks a trace file is read in.
_READ_BYTES = 1 << 16
#: The fields every complete event of Kineto has, fetched in one call.
_X_FIELDS = itemgetter("ts", "dur", "cat", "name", "pid", "tid", "args")


#: A complete event's row: ts, dur, category code, name id, stream, pid, tid, correlation (as the JSON has them).
_Row = tuple[Any, Any, int, int, Any, Any, Any, Any]
#: A collective's (row in its piece, name id of its collective, msg_bytes, group_size).
_Coll = tuple[int, int, float, int]
#: A CUDA event wait's (row in its piece, ``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``): a few
#: ``cuda_sync`` events in thousands carry them, so, like collectives, they are not in every row.
_Wait = tuple[int, Any, Any]
#: A CUPTI profiler range's (row in its piece, its numeric args: the counters the range measured).
_Counters = tuple[int, dict[str, float]]
#: The category of CUPTI range-profiler events (one per kernel, ``args`` its counters).
_PROFILER_RANGE = CAT["cuda_profiler_range"]
#: What ``_columns`` returns: the event columns, the names by id, the host's name.
_Columns = tuple[dict[str, np.ndarray], list[str], str | None, dict[int, dict[str, float]]]


class _Unusual(Exception):
    """A piece has an event the fast scan does not take; the lenient scan reads that piece."""


def _scan(
    events: list[Any],
    names: _Names,
    codes: _Codes,
    rows: list[_Row],
    colls: list[_Coll],
    waits: list[_Wait],
    counters: list[_Counters],
) -> str | None:
    """Append the row of each ``X`` event, the (row, coll_id, msg_bytes, group_size) of each collective
    (a few in thousands, so they are not in every row).

    The hot loop of the reader: one C call fetches an event's fields, one short-lived tuple
    per event, no function call per field; values are checked when the rows become numpy
    columns (``_as_column``). Anything unusual (a missing ``ph``, ``args`` not a dict…)
    raises, and the piece is read by
    ``_scan_lenient`` instead, which says what is wrong and where. ``codes`` is ``CAT``
    plus the unknown categories met so far (code 0). Returns the host name of a
    ``process_name`` metadata event, if the piece has one.
    """
    ids, intern = names.ids, names
    append = rows.append
    host = None
    for ev in events:
        ph = ev["ph"]
        if ph == "X":
            try:
                ts, dur, cat, name, pid, tid, args = _X_FIELDS(ev)
            except KeyError:  # a field is missing: Kineto leaves out args of some events
                ts, dur, cat, name, pid, tid, args = _x_fields(ev)
            nid, code = ids[name], codes[cat]  # subscripts, not calls: both intern what is new
            correlation = args.get("correlation", -1)  # also fails, as it should, when args is not a dict
            if "Collective name" in args and args["Collective name"] is not None:
                colls.append((len(rows), intern(str(args["Collective name"])), _msg_bytes(args), _group_size(args)))
            if "wait_on_stream" in args:
                waits.append(_wait_of(len(rows), args))
            if code == _PROFILER_RANGE:
                counters.append((len(rows), _counters_of(args)))
            append((ts, dur, code, nid, args.get("stream", -1), pid, tid, correlation))
        elif ph == "M" and host is None:
            host = _hostname(ev)
    return host


# --- the typed scan: most pieces ---------------------------------------------------------------------------
#
# msgspec decodes a piece straight into these structs: only the fields we read are kept (a kernel's
# ~15 args are skipped unread), one small object per event instead of two dicts, and no cyclic GC
# tracking (gc=False: they hold only scalars, strings and ``_Args``). Their types are what Kineto
# writes; a piece with anything else (a name that is not a string, a pid as a float, args that are
# not an object…) fails to validate and is read by the dict scan above instead, so both scans give
# the same columns and the same errors. On a real trace it decodes in well under half orjson's time
# (benchmarks/RESULTS.md, "Kineto reader").


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of an event that the columns need."""

    stream: int | str = -1
    correlation: int | str = -1
    collective: str | None = msgspec.field(default=None, name="Collective name")
    nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = ""
    group_size: Any = msgspec.field(default=None, name="Group size")
    hostname: str | None = None
    wait_stream: Any = msgspec.field(default=None, name="wait_on_stream")
    wait_corr: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")


_NO_TYPED_ARGS = _Args()


class _Complete(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event (``ph`` ``X``) with the fields we read (JSON has no NaN: a NaN ``ts`` is a missing one)."""

    cat: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = math.nan
    dur: float = 0.0
    args: _Args = _NO_TYPED_ARGS


class _Metadata(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    """A metadata event: ``process_name`` may carry the host's name."""

    name: str = ""
    args: _Args = _NO_TYPED_ARGS


#: Every other phase of the Trace Event Format (its spec, "Event Descriptions"), decoded into a struct
#: without fields: msgspec reads past the event and makes no string of it. Flows, instants and counters
#: are most of a kernel-level trace's events besides the complete ones, and decoding them into no fields costs
#: about two thirds of one struct type for every event (benchmarks/RESULTS.md, "Kineto reader"). A phase not in the
#: list (or an event without ``ph``) fails to validate: its piece goes to the dict scan, which skips it.
_SKIPPED_PHASES = (
    "B",
    "E",
    "i",
    "I",
    "C",
    "b",
    "n",
    "e",
    "S",
    "T",
    "p",
    "F",
    "s",
    "t",
    "f",
    "P",
    "N",
    "O",
    "D",
    "V",
    "v",
    "R",
    "c",
    "(",
    ")",
)
_SKIPPED = tuple(
    msgspec.defstruct(f"_Skipped{i}", [], tag_field="ph", tag=ph, gc=False) for i, ph in enumerate(_SKIPPED_PHASES)
)
#: The union of every event type; built at run time, as the skipped phases' structs are (mypy has no spelling
#: for a union of those: statically a piece is a list of structs, ``type(e) is _Complete`` picks the ones read).
_EVENT_UNION: Any = Union.__getitem__((_Complete, _Metadata, *_SKIPPED))
_TYPED_EVENTS: msgspec.json.Decoder[list[msgspec.Struct]] = msgspec.json.Decoder(list[_EVENT_UNION])


class _TypedPiece(NamedTuple):
    """A piece decoded into typed events, with its text for the dict scan should it hold something unusual."""

    events: list[msgspec.Struct]
    text: bytes


def _decode_piece(text: bytes) -> _TypedPiece | list[Any] | None:
    """The events of ``[...]`` text: typed, else as dicts (valid JSON of other types), else ``None`` (not JSON)."""
    try:
        return _TypedPiece(_TYPED_EVENTS.decode(text), text)
    except msgspec.ValidationError:
        events = _decode_or_none(text)
        return events if isinstance(events, list) else None  # always a list: the text is "[...]"
    except msgspec.DecodeError:
        return None


def _typed_rows(events: list[msgspec.Struct], names: _Names, codes: _Codes, path: str) -> dict[str, np.ndarray]:
    """The row table (``_row_table``) of a typed piece's complete events, a list comprehension per column."""
    xs = [e for e in events if type(e) is _Complete]
    cats = list(map(codes.__getitem__, [e.cat for e in xs]))
    if _PROFILER_RANGE in cats:
        raise _Unusual  # CUPTI counters are args the typed events skip: the dict scan keeps them
    args = [e.args for e in xs]
    colls, name_ids = _typed_names(xs, args, names)
    cols = (
        [e.ts for e in xs],
        [e.dur for e in xs],
        cats,
        name_ids,
        [a.stream for a in args],
        [e.pid for e in xs],
        [e.tid for e in xs],
        [a.correlation for a in args],
    )
    waits = [(i, a.wait_stream, a.wait_corr) for i, a in enumerate(args) if a.wait_stream is not None]
    table = _row_table(cols, colls, path, waits)
    if np.isnan(table["ts_us"]).any():  # a complete event without a time: the dict scan says which
        raise _Unusual
    return table


def _typed_names(xs: list[_Complete], args: list[_Args], names: _Names) -> tuple[list[_Coll], list[int]]:
    """(collectives, name id of each event), interned in the order of the dict scan (each collective's
    name after its event's) so both scans number names alike."""
    at = [(i, a, a.collective) for i, a in enumerate(args) if a.collective is not None]
    intern, done = names.__getitem__, 0
    name_ids: list[int] = []
    colls: list[_Coll] = []
    for i, a, collective in at:
        name_ids += map(intern, [e.name for e in xs[done : i + 1]])
        colls.append((i, intern(collective), _msg_bytes_of(a.nelems, a.dtype), _int_or(a.group_size, -1, 32)))
        done = i + 1
    name_ids += map(intern, [e.name for e in xs[done:]])
    return colls, name_ids


def _typed_hostname(events: list[msgspec.Struct]) -> str | None:
    return next(
        (
            e.args.hostname
            for e in events
            if type(e) is _Metadata and e.name == "process_name" and e.args.hostname is not None
        ),
        None,
    )


def _x_fields(ev: Mapping[str, Any]) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
    """The fields of a complete event, with the defaults of missing ones (``ts`` is required)."""
    return (
        ev["ts"],
        ev.get("dur", 0.0),
        ev.get("cat", ""),
        ev.get("name", ""),
        ev.get("pid", -1),
        ev.get("tid", -1),
        ev.get("args") or _NO_ARGS,
    )


def _hostname(ev: Mapping[str, Any]) -> str | None:
    if ev.get("name") != "process_name":
        return None
    return (ev.get("args") or _NO_ARGS).get("hostname")


def _scan_lenient(
    events: list[Any],
    path: str,
    names: _Names,
    offset: int,
    rows: list[_Row],
    colls: list[_Coll],
    waits: list[_Wait],
    counters: list[_Counters],
) -> str | None:
    """``_scan`` for pieces with unusual events: each event on its own, a ParseError naming it."""
    host = None
    for index, ev in enumerate(events):
        try:
            ph = ev.get("ph")
            if ph == "X":
                ts, dur, cat, name, pid, tid, args = _x_fields(ev)
                row = (
                    ts,
                    dur,
                    CAT.get(cat, 0),
                    names(name),
                    args.get("stream", -1),
                    pid,
                    tid,
                    args.get("correlation", -1),
                )
                if (coll := args.get("Collective name")) is not None:
                    colls.append((len(rows), names(str(coll)), _msg_bytes(args), _group_size(args)))
                if "wait_on_stream" in args:
                    waits.append(_wait_of(len(rows), args))
                if row[2] == _PROFILER_RANGE:
                    counters.append((len(rows), _counters_of(args)))
                rows.append(row)
            elif ph == "M" and host is None:
                host = _hostname(ev)
        except (KeyError, TypeError, AttributeError) as err:
            raise ParseError(
                f"traceEvents[{offset + index}]: bad event ({type(err).__name__}: {shown(err, 120)})",
                path=path,
                text=str(ev)[:200],
            ) from err
    return host


_DTYPES = (np.float64, np.float64, np.int8, np.int32, np.int32, np.int64, np.int64, np.int64)
_ROW_COLUMNS = ("ts_us", "dur_us", "cat", "name_id", "stream", "pid", "tid", "correlation")
_TABLE_COLUMNS = _ROW_COLUMNS + ("coll_id", "msg_bytes", "group_size", "wait_stream", "wait_corr")


# Columns whose values may be strings in some traces (Kineto writes pid "Spans", stream "N/A"):
# those become -1 instead of failing the file.
_LENIENT_COLUMNS = frozenset({"stream", "pid", "tid", "correlation"})


def _as_column(name: str, values: Sequence[Any], dtype: type, path: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        if name not in _LENIENT_COLUMNS:
            raise ParseError(f"an event has a non-numeric {name} ({shown(err, 120)})", path=path) from err
        bits = np.iinfo(dtype).bits
        return np.asarray([_int_or(v, -1, bits) for v in values], dtype=dtype)


#: Kineto writes ts and dur as int64 microseconds: past 2^63 (292,000 years) a value is not a time,
#: and the analyses' int64 arithmetic on it would overflow.
_MAX_TIME_US = float(1 << 63)


def _check_times(table: Mapping[str, np.ndarray], path: str) -> None:
    for name in ("ts_us", "dur_us"):
        column = table[name]
        out = np.abs(column) >= _MAX_TIME_US  # infinities too; NaN (an event without dur) is no number
        if out.any():
            found = column[out.argmax()]
            raise ParseError(f"an event's {name} is beyond 64 bits of microseconds ({found:.4g})", path=path)


#: Most counters kept of one profiler range (CUPTI measures a few dozen per kernel at most).
_MAX_COUNTERS = 256


def _counters_of(args: Mapping[str, Any]) -> dict[str, float]:
    """The numeric args of a profiler range (its counters; booleans and text are not counters)."""
    found: dict[str, float] = {}
    for key, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and len(found) < _MAX_COUNTERS:
            found[str(key)[:200]] = float(value)
    return found


def _wait_of(row: int, args: Mapping[str, Any]) -> _Wait:
    return (row, args.get("wait_on_stream"), args.get("wait_on_cuda_event_record_corr_id"))


def _row_table(
    cols: Sequence[Sequence[Any]], colls: list[_Coll], path: str, waits: Sequence[_Wait] = ()
) -> dict[str, np.ndarray]:
    """The event columns of one piece from its ``_ROW_COLUMNS`` values, its collectives and its CUDA event waits."""
    table = {name: _as_column(name, col, dtype, path) for name, col, dtype in zip(_ROW_COLUMNS, cols, _DTYPES)}
    _check_times(table, path)
    n = len(table["ts_us"])
    table["coll_id"] = np.full(n, -1, dtype=np.int32)
    table["msg_bytes"] = np.full(n, np.nan)
    table["group_size"] = np.full(n, -1, dtype=np.int32)
    if colls:
        at, coll_ids, msg_bytes, groups = zip(*colls)
        table["coll_id"][list(at)] = coll_ids
        table["msg_bytes"][list(at)] = msg_bytes
        table["group_size"][list(at)] = groups
    table["wait_stream"] = np.full(n, -1, dtype=np.int32)
    table["wait_corr"] = np.full(n, -1, dtype=np.int64)
    for row, stream, corr in waits:
        table["wait_stream"][row] = _int_or(stream, -1, 32)
        table["wait_corr"][row] = _int_or(corr, -1)
    return table


class _Tables:
    """Rows of the pieces read so far, turned into numpy columns a piece at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.names = _Names()
        self.codes = _Codes(CAT)
        self.parts: list[dict[str, np.ndarray]] = []
        self.hostname: str | None = None
        self.counters: dict[int, dict[str, float]] = {}
        self.n_rows = 0

    def add(self, piece: _TypedPiece | list[Any], offset: int) -> int:
        """Add a piece's columns; the number of events it had."""
        if isinstance(piece, _TypedPiece):
            try:
                self._add_typed(piece.events)
                return len(piece.events)
            except (_Unusual, KeyError, TypeError, ValueError, OverflowError):
                events: list[Any] = orjson.loads(piece.text)  # something unusual: the dict scan reads it again
        else:
            events = piece
        self._add_dicts(events, offset)
        return len(events)

    def _add_typed(self, events: list[msgspec.Struct]) -> None:
        # Should this fail half-way, the names it interned are those the dict scan interns first, in the same order.
        # A piece with CUPTI counters (cuda_profiler_range events) is refused before any name is interned.
        rows = _typed_rows(events, self.names, self.codes, self.path)
        self.hostname = self.hostname or _typed_hostname(events)
        self.parts.append(rows)
        self.n_rows += len(rows["ts_us"])

    def _add_dicts(self, events: list[Any], offset: int) -> None:
        rows: list[_Row] = []
        colls: list[_Coll] = []
        waits: list[_Wait] = []
        counters: list[_Counters] = []
        try:
            host = _scan(events, self.names, self.codes, rows, colls, waits, counters)
        except (_Unusual, KeyError, TypeError, AttributeError):
            rows, colls, waits, counters = [], [], [], []  # the lenient scan reads the piece again
            host = _scan_lenient(events, self.path, self.names, offset, rows, colls, waits, counters)
        self.hostname = self.hostname or host
        for row, values in counters:
            self.counters[self.n_rows + row] = values
        self._flush(rows, colls, waits)

    def _flush(self, rows: list[_Row], colls: list[_Coll], waits: list[_Wait] | None = None) -> None:
        cols = list(zip(*rows)) if rows else [()] * len(_ROW_COLUMNS)
        self.parts.append(_row_table(cols, colls, self.path, waits or ()))
        self.n_rows += len(rows)

    def columns(self) -> dict[str, np.ndarray]:
        if not self.parts:
            self._flush([], [])
        return {k: np.concatenate([part[k] for part in self.parts]) for k in _TABLE_COLUMNS}


def _columns(pieces: Iterable[_TypedPiece | list[Any]], path: str) -> _Columns:
    """Columns of the events, built piece by piece (each piece a list of decoded events)."""
    tables, offset = _Tables(path), 0
    with gc_paused():
        for events in pieces:
            offset += tables.add(events, offset)
            del events  # see _Pieces: one piece's objects alive at a time
    table = tables.columns()
    name_list = list(tables.names.ids)
    comm_names = np.array([is_comm_name(str(n)) for n in name_list] + [False], dtype=bool)
    table["comm"] = comm_names[table["name_id"]]
    return table, name_list, tables.hostname, tables.counters


def _rank(doc: Mapping[str, Any], path: str) -> tuple[int, int | None, str]:
    info = doc.get("distributedInfo")
    if isinstance(info, Mapping) and isinstance(info.get("rank"), int):
        world = info.get("world_size")
        return info["rank"], world if isinstance(world, int) else None, "distributedInfo"
    found = _RANK_IN_NAME_RE.search(Path(path).name)
    if found is None:
        warnings.warn(f"{path}: no distributedInfo.rank and no rank-N in the file name; assuming rank 0", stacklevel=3)
        return 0, None, "default"
    warnings.warn(f"{path}: no distributedInfo.rank; rank {found.group(1)} taken from the file name", stacklevel=3)
    return int(found.group(1)), None, "filename"


def _load(data: bytes | str, path: str) -> Mapping[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ParseError(
            f"not JSON: {err.msg} (column {err.colno}, byte {err.pos})", path=path, line=err.lineno
        ) from err
    if not isinstance(doc, Mapping) or not isinstance(doc.get("traceEvents"), list):
        raise ParseError("not a Chrome trace: no traceEvents list", path=path)
    return doc


class _NotSplittable(Exception):
    """The text does not split the way ``_Pieces`` expects; decode it whole instead."""


class _Pieces:
    """The events of a trace's text, decoded a piece of about ``_PIECE_BYTES`` at a time.

    A trace decoded at once costs ~10× its size in Python objects; decoding a piece at a
    time, from text that is itself read (and un-gzipped) a block at a time, keeps only one
    piece alive. Pieces are cut after a ``},`` and kept only if ``[piece]`` decodes: a cut
    inside a string or a nested value cannot decode, so every kept piece is a run of whole
    top-level events. After iterating, ``doc`` holds the rest of the document
    (``distributedInfo``, ``deviceProperties``…).
    """

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.doc: dict[str, Any] = {}
        self.buf = bytearray()
        self.pos = 0
        """Where the undecoded text starts in ``buf`` (slicing it off each time would copy it)."""
        self.done = False

    def _more(self) -> bool:
        """Append the next block; False at the end. The decoded text before ``pos`` is dropped
        only once it is most of the buffer, so a long event costs each byte a bounded number of copies."""
        block = next(self.blocks, None)
        if block is None:
            self.done = True
            return False
        if self.pos > len(self.buf) // 2:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += block
        return True

    def _head(self) -> dict[str, Any]:
        searched = 0
        while True:
            key = self.buf.find(b'"traceEvents"', max(0, searched - 16))
            open_at = self.buf.find(b"[", key) if key >= 0 else -1
            if open_at >= 0:
                break
            searched = len(self.buf) if key < 0 else key
            if not self._more():
                raise _NotSplittable
        head = _decode_or_none(bytes(self.buf[: open_at + 1]) + b"]}")
        if not isinstance(head, dict):
            raise _NotSplittable
        self.pos = open_at + 1
        return head

    def __iter__(self) -> Iterator[_TypedPiece | list[Any]]:
        head = self._head()
        search, failed = _PIECE_BYTES, 0
        while True:
            cut = self.buf.find(b"},", self.pos + search)
            if cut < 0:
                # Nothing to cut at yet: look only at new text next time (no rescan of a long event).
                search = max(search, len(self.buf) - self.pos - 1)
                if self.done or not self._more():
                    break
                continue
            piece = _decode_piece(b"[" + self.buf[self.pos : cut + 1] + b"]")
            if piece is None:
                # A cut inside a string or a nested value. After a few, double the piece, so that
                # a long run of "}," inside one string costs a bounded number of decodes per byte.
                failed += 1
                length = cut + 2 - self.pos
                search = length if failed < _CUT_TRIES else 2 * length
                continue
            yield piece
            piece = None  # free it before the next piece is decoded, into the memory it leaves
            self.pos, search, failed = cut + 2, _PIECE_BYTES, 0
        tail = _decode_or_none(b'{"traceEvents": [' + self.buf[self.pos :])
        if not isinstance(tail, dict) or not isinstance(tail.get("traceEvents"), list):
            raise _NotSplittable
        yield tail.pop("traceEvents")
        head.pop("traceEvents", None)
        head.update(tail)
        self.doc = head


def _decode_or_none(text: bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _decode(blocks: Callable[[], Iterator[bytes]], path: str) -> tuple[Mapping[str, Any], _Columns]:
    """(document without its events, columns of the events) of the text ``blocks()`` yields."""
    pieces = _Pieces(blocks())
    try:
        columns = _columns(pieces, path)
        return pieces.doc, columns
    except _NotSplittable:
        doc = _load(b"".join(blocks()), path)  # decode it whole (and say where it is broken)
        return doc, _columns([doc["traceEvents"]], path)


def parse_kineto(data: bytes | str | Mapping[str, Any], *, path: str | Path = "<input>") -> KinetoTrace:
    """One rank's trace from its JSON text (or an already decoded document)."""
    path = str(path)
    if isinstance(data, Mapping):
        if not isinstance(data.get("traceEvents"), list):
            raise ParseError("not a Chrome trace: no traceEvents list", path=path)
        return _trace(path, data, _columns([data["traceEvents"]], path))
    raw = data.encode() if isinstance(data, str) else data
    return _trace(path, *_decode(lambda: iter((raw,)), path))


def _trace(path: str | Path, doc: Mapping[str, Any], columns: _Columns) -> KinetoTrace:
    path = str(path)
    events, names, hostname, counters = columns
    if not len(events["ts_us"]):
        # Every analysis of a trace reads its complete events; without them it is not a profile.
        raise ParseError('a trace without complete events (ph "X"): nothing was profiled', path=path)
    rank, world, rank_from = _rank(doc, path)
    info = info_doc if isinstance(info_doc := doc.get("distributedInfo"), Mapping) else {}
    devices = tuple(str(d.get("name", "")) for d in doc.get("deviceProperties") or () if isinstance(d, Mapping))
    base = doc.get("baseTimeNanoseconds")
    meta = {k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties")}
    return KinetoTrace(
        path=path,
        rank=rank,
        world_size=world,
        rank_from=rank_from,
        names=tuple(str(n) for n in names),
        events=events,
        base_time_ns=base if isinstance(base, int) else None,
        backend=info.get("backend"),
        devices=devices,
        hostname=hostname or meta.get("hostname"),
        metadata=meta,
        counters=counters,
    )


def read_kineto(path: str | Path) -> KinetoTrace:
    """Read ``path`` (``.json`` or ``.json.gz``, by content) as one rank's trace, a block at a time.

    At most ``MAX_TRACE_BYTES`` of text (inflated): a trace that does not split into
    pieces is decoded whole, and must fit.
    """
    path = Path(path)
    return _trace(path, *_decode(lambda: _file_blocks(path), str(path)))


def _file_blocks(path: Path) -> Iterator[bytes]:
    with open_binary(path, max_bytes=MAX_TRACE_BYTES) as stream:
        while block := stream.read(_READ_BYTES):
            yield block
