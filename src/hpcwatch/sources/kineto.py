"""Read a PyTorch profiler (Kineto) Chrome trace into columns, one file per rank.

``torch.profiler`` writes one JSON document per rank (``.json`` or ``.json.gz``):
``{"distributedInfo": {"rank", "world_size", "backend", ...}, "deviceProperties": [...],
"traceEvents": [...]}``. Step anatomy needs every event's time, category and name,
so the reader turns the events into numpy columns in one pass, reading, un-gzipping and
decoding the file 64 KiB at a time, and keeps no Python object per event (STYLE §3).
A 12 MB trace of 35k events loads in ~0.2 s and ~6 MB over the interpreter's own
memory, 10× faster and 1/10 of the memory growth of HTA's loader
(``benchmarks/bench_steps_vs_hta.py``).

The columns of ``KinetoTrace.events`` (``EVENT_COLUMNS``, complete events ``ph == "X"``
only, in file order):

===============  =======  ============================================================
column           dtype    meaning
===============  =======  ============================================================
``ts_us``        float64  start, µs on the trace's clock (Kineto: µs since boot-ish
                          origin; ``KinetoTrace.base_time_ns`` anchors it to UTC)
``dur_us``       float64  duration, µs (0 when missing)
``cat``          int8     category code, index into ``CATEGORIES`` (``OTHER`` = unknown)
``name_id``      int32    index into ``KinetoTrace.names``
``stream``       int32    GPU stream for GPU activities, ``-1`` for host events
``pid``          int64    process (host) or device (GPU) id
``tid``          int64    thread (host) or stream id (GPU)
``correlation``  int64    CUDA correlation id linking a launch to its kernel; -1 when none
``comm``         bool     a collective: NCCL kernel (``ncclKernel_*``, ``ncclDevKernel_*``),
                          ``nccl:*`` / ``gloo:*`` annotation or ``c10d::`` op
``coll_id``      int32    ``Collective name`` arg (index into ``names``); -1 when none
``msg_bytes``    float64  ``In msg nelems`` × element size (NaN when unknown)
===============  =======  ============================================================

Flow events (``ph`` ``s``/``f``: ``ac2g`` launch→kernel, ``fwdbwd`` forward→backward)
are in ``KinetoTrace.flows`` with columns ``id`` (int64), ``ts_us`` (float64),
``start`` (bool, True for ``s``) and ``cat`` (int8).

Lenient on purpose: instant (``i``), counter (``C``) and metadata (``M``) events are
skipped except process labels; unknown categories get ``OTHER``; a missing ``dur``
is 0. The reader does not check that events nest or that flows pair up.
"""

from __future__ import annotations

import zlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Mapping

import numpy as np
import orjson

from hpcwatch.errors import ParseError

__all__ = [
    "KinetoTrace",
    "CATEGORIES",
    "CAT",
    "EVENT_COLUMNS",
    "GPU_CATEGORIES",
    "parse_kineto",
    "read_kineto",
    "is_comm_name",
]

#: Event categories we tell apart; the code of a category is its index here.
#: https://github.com/pytorch/kineto/blob/main/libkineto/include/ActivityType.h
CATEGORIES: tuple[str, ...] = (
    "other", "cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy",
    "gpu_memset", "cuda_runtime", "cuda_driver", "python_function", "overhead", "Trace",
)
CAT: Mapping[str, int] = {name: code for code, name in enumerate(CATEGORIES)}
#: Codes of activities that run on the GPU (they have a stream).
GPU_CATEGORIES: tuple[int, ...] = (CAT["kernel"], CAT["gpu_memcpy"], CAT["gpu_memset"])

EVENT_COLUMNS: tuple[str, ...] = ("ts_us", "dur_us", "cat", "name_id", "stream", "pid", "tid", "correlation",
                                  "comm", "coll_id", "msg_bytes")

# HTA's rule for NCCL kernels (hta/utils/utils.py NCCL_KERNEL_RE), plus the host-side names
# c10d gives collectives: "nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_".
_NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")
_RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

# Bytes per element of c10d's "dtype" arg (torch scalar type names).
_DTYPE_BYTES: Mapping[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
    "Short": 2, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}


def is_comm_name(name: str) -> bool:
    """Whether an event name is a collective (NCCL kernel or a host-side c10d collective)."""
    return name.startswith(_COMM_PREFIXES) or _NCCL_KERNEL_RE.match(name) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class KinetoTrace:
    """One rank's trace as columns (see the module docstring for each column)."""

    path: str
    rank: int
    world_size: int | None
    rank_from: str
    """Where ``rank`` came from: ``distributedInfo`` or ``filename``."""
    names: tuple[str, ...]
    events: Mapping[str, np.ndarray]
    flows: Mapping[str, np.ndarray]
    base_time_ns: int | None = None
    """UTC ns of the trace clock's origin (``baseTimeNanoseconds``), when written."""
    backend: str | None = None
    """``distributedInfo.backend`` (``nccl``, ``gloo``)."""
    devices: tuple[str, ...] = ()
    """GPU names of ``deviceProperties`` (device index order)."""
    hostname: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The other top-level keys (without ``traceEvents``)."""

    def __len__(self) -> int:
        return len(self.events["ts_us"])

    def name_ids(self, predicate) -> np.ndarray:
        """Sorted ids of the names for which ``predicate(name)`` is true."""
        return np.array([i for i, n in enumerate(self.names) if predicate(n)], dtype=np.int32)

    def to_utc_s(self, ts_us: np.ndarray | float) -> np.ndarray | float:
        """Trace µs to UTC seconds (trace seconds when the origin is unknown)."""
        origin_s = (self.base_time_ns or 0) / 1e9
        return origin_s + np.asarray(ts_us) / 1e6


class _Names:
    """Interns names: the first time a name is seen it gets the next id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.ids)
        return found


def _int_or(value: Any, default: int) -> int:
    if type(value) is int:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _msg_bytes(args: Mapping[str, Any]) -> float:
    nelems = args.get("In msg nelems")
    size = _DTYPE_BYTES.get(args.get("dtype", ""))
    if isinstance(nelems, (int, float)) and size:
        return float(nelems) * size
    return float("nan")


_NO_ARGS: Mapping[str, Any] = {}
#: Size of the pieces a trace's text is decoded in (see ``_Pieces``); small pieces stay in the CPU cache.
_PIECE_BYTES = 1 << 16
#: Size of the blocks a trace file is read in.
_READ_BYTES = 1 << 16


def _complete_events(events: list, path: str, names: _Names, offset: int) -> tuple[list[tuple], list[tuple]]:
    """Rows (ts, dur, cat, name, stream, pid, tid, correlation, coll, msg) of the ``X`` events,
    and (index, event) of the flow and metadata events.

    The hot loop of the reader: one short-lived tuple per event and no function call
    per field; values are checked when the piece becomes numpy columns (``_as_column``).
    """
    cat_of, ids, intern = CAT.get, names.ids, names
    rows: list[tuple] = []
    others: list[tuple] = []
    append = rows.append
    nan = np.nan
    for index, ev in enumerate(events):
        try:
            ph = ev.get("ph")
            if ph != "X":
                if ph == "s" or ph == "f" or ph == "M":
                    others.append((index, ev))
                continue
            name = ev.get("name", "")
            nid = ids.get(name)
            if nid is None:
                nid = intern(name)
            args = ev.get("args") or _NO_ARGS
            coll = args.get("Collective name")
            append((ev["ts"], ev.get("dur", 0.0), cat_of(ev.get("cat", ""), 0), nid, args.get("stream", -1),
                    ev.get("pid", -1), ev.get("tid", -1), args.get("correlation", -1),
                    -1 if coll is None else intern(str(coll)), nan if coll is None else _msg_bytes(args)))
        except (KeyError, TypeError, AttributeError) as err:
            raise ParseError(f"traceEvents[{offset + index}]: bad event ({type(err).__name__}: {err})", path=path,
                             text=str(ev)[:200]) from err
    return rows, others


def _flow_events(events: list[tuple], path: str, offset: int) -> tuple[dict[str, np.ndarray], str | None]:
    """Flow columns and the host name from (index, event) pairs."""
    flow_id: list[int] = []
    flow_ts: list[float] = []
    flow_start: list[bool] = []
    flow_cat: list[int] = []
    hostname = None
    for index, ev in events:
        ph = ev.get("ph")
        if ph == "s" or ph == "f":
            try:
                flow_ts.append(float(ev["ts"]))
            except (KeyError, TypeError, ValueError) as err:
                raise ParseError(f"traceEvents[{offset + index}]: flow event without a time", path=path,
                                 text=str(ev)[:200]) from err
            flow_id.append(_int_or(ev.get("id"), -1))
            flow_start.append(ph == "s")
            flow_cat.append(1 if ev.get("cat") == "ac2g" else 2)
        elif ph == "M" and hostname is None and ev.get("name") == "process_name":
            hostname = (ev.get("args") or _NO_ARGS).get("hostname")
    flows = {
        "id": np.asarray(flow_id, dtype=np.int64),
        "ts_us": np.asarray(flow_ts, dtype=np.float64),
        "start": np.asarray(flow_start, dtype=bool),
        "cat": np.asarray(flow_cat, dtype=np.int8),
    }
    return flows, hostname


_DTYPES = (np.float64, np.float64, np.int8, np.int32, np.int32, np.int64, np.int64, np.int64, np.int32, np.float64)
_ROW_COLUMNS = ("ts_us", "dur_us", "cat", "name_id", "stream", "pid", "tid", "correlation", "coll_id", "msg_bytes")


# Columns whose values may be strings in some traces (Kineto writes pid "Spans", stream "N/A"):
# those become -1 instead of failing the file.
_LENIENT_COLUMNS = frozenset({"stream", "pid", "tid", "correlation"})


def _as_column(name: str, values: tuple, dtype: type, path: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        if name not in _LENIENT_COLUMNS:
            raise ParseError(f"an event has a non-numeric {name} ({err})", path=path) from err
        return np.asarray([_int_or(v, -1) for v in values], dtype=dtype)


def _piece_columns(events: list, path: str, names: _Names, offset: int) -> tuple[dict[str, np.ndarray], list]:
    rows, others = _complete_events(events, path, names, offset)
    cols = list(zip(*rows)) if rows else [()] * len(_ROW_COLUMNS)
    return {name: _as_column(name, col, dtype, path) for name, col, dtype in zip(_ROW_COLUMNS, cols, _DTYPES)}, others


def _columns(pieces: Iterable[list], path: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str],
                                                          str | None]:
    """Columns of the events, built piece by piece (each piece a list of decoded events)."""
    names = _Names()
    tables, flow_parts, hostname, offset = [], [], None, 0
    for events in pieces:
        table, others = _piece_columns(events, path, names, offset)
        tables.append(table)
        flows, host = _flow_events(others, path, offset)
        flow_parts.append(flows)
        hostname = hostname or host
        offset += len(events)
    table = {k: np.concatenate([t[k] for t in tables]) if tables else np.zeros(0, dtype=d)
             for k, d in zip(_ROW_COLUMNS, _DTYPES)}
    flows = {k: np.concatenate([f[k] for f in flow_parts]) for k in ("id", "ts_us", "start", "cat")} \
        if flow_parts else _flow_events([], path, 0)[0]
    name_list = list(names.ids)
    comm_names = np.array([is_comm_name(str(n)) for n in name_list] + [False], dtype=bool)
    table["comm"] = comm_names[table["name_id"]]
    return table, flows, name_list, hostname


def _rank(doc: Mapping[str, Any], path: str) -> tuple[int, int | None, str]:
    info = doc.get("distributedInfo")
    if isinstance(info, Mapping) and isinstance(info.get("rank"), int):
        world = info.get("world_size")
        return info["rank"], world if isinstance(world, int) else None, "distributedInfo"
    found = _RANK_IN_NAME_RE.search(Path(path).name)
    if found is None:
        warnings.warn(f"{path}: no distributedInfo.rank and no rank-N in the file name; assuming rank 0",
                      stacklevel=3)
        return 0, None, "default"
    warnings.warn(f"{path}: no distributedInfo.rank; rank {found.group(1)} taken from the file name", stacklevel=3)
    return int(found.group(1)), None, "filename"


def _load(data: bytes | str, path: str) -> Mapping[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err.msg} (column {err.colno}, byte {err.pos})", path=path,
                         line=err.lineno) from err
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
        self.buf = b""
        self.pos = 0
        """Where the undecoded text starts in ``buf`` (slicing it off each time would copy it)."""
        self.done = False

    def _more(self) -> bool:
        block = next(self.blocks, None)
        if block is None:
            self.done = True
            return False
        self.buf = self.buf[self.pos:] + block
        self.pos = 0
        return True

    def _head(self) -> dict[str, Any]:
        while True:
            key = self.buf.find(b'"traceEvents"')
            open_at = self.buf.find(b"[", key) if key >= 0 else -1
            if open_at >= 0:
                break
            if not self._more():
                raise _NotSplittable
        head = _decode_or_none(self.buf[:open_at + 1] + b"]}")
        if not isinstance(head, dict):
            raise _NotSplittable
        self.pos = open_at + 1
        return head

    def __iter__(self) -> Iterator[list]:
        head = self._head()
        search = _PIECE_BYTES
        while True:
            cut = self.buf.find(b"},", self.pos + search)
            if cut < 0:
                if self.done or not self._more():
                    break
                continue
            piece = _decode_or_none(b"[" + self.buf[self.pos:cut + 1] + b"]")
            if piece is None:
                search = cut + 2 - self.pos
                continue
            yield piece
            self.pos, search = cut + 2, _PIECE_BYTES
        tail = _decode_or_none(b'{"traceEvents": [' + self.buf[self.pos:])
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


def _decode(blocks: Callable[[], Iterator[bytes]], path: str) -> tuple[Mapping[str, Any], tuple]:
    """(document without its events, columns of the events) of the text ``blocks()`` yields."""
    pieces = _Pieces(blocks())
    try:
        columns = _columns(pieces, path)
        return pieces.doc, columns
    except _NotSplittable:
        doc = _load(b"".join(blocks()), path)   # decode it whole (and say where it is broken)
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


def _trace(path: str | Path, doc: Mapping[str, Any], columns: tuple) -> KinetoTrace:
    path = str(path)
    events, flows, names, hostname = columns
    rank, world, rank_from = _rank(doc, path)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), Mapping) else {}
    devices = tuple(str(d.get("name", "")) for d in doc.get("deviceProperties") or () if isinstance(d, Mapping))
    base = doc.get("baseTimeNanoseconds")
    meta = {k: v for k, v in doc.items() if k not in ("traceEvents", "deviceProperties")}
    return KinetoTrace(path=path, rank=rank, world_size=world, rank_from=rank_from, names=tuple(str(n) for n in names),
                       events=events, flows=flows, base_time_ns=base if isinstance(base, int) else None,
                       backend=info.get("backend"), devices=devices, hostname=hostname or meta.get("hostname"),
                       metadata=meta)


def read_kineto(path: str | Path) -> KinetoTrace:
    """Read ``path`` (``.json`` or ``.json.gz``, by content) as one rank's trace, a block at a time."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
    except OSError as err:
        raise ParseError(f"cannot read trace: {err}", path=path) from err
    blocks = (lambda: _gunzip_blocks(path)) if gzipped else (lambda: _file_blocks(path))
    return _trace(path, *_decode(blocks, str(path)))


def _file_blocks(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb") as fh:
            while block := fh.read(_READ_BYTES):
                yield block
    except OSError as err:
        raise ParseError(f"cannot read trace: {err}", path=path) from err


def _gunzip_blocks(path: Path) -> Iterator[bytes]:
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)   # gzip header and trailer
    try:
        for block in _file_blocks(path):
            if out := inflate.decompress(block):
                yield out
            if inflate.eof:
                break
    except zlib.error as err:
        raise ParseError(f"cannot read trace: not valid gzip ({err})", path=path) from err
    if not inflate.eof:
        raise ParseError("cannot read trace: the gzip stream is truncated", path=path)
