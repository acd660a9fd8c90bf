"""Reader of PyTorch Flight Recorder dumps (one per rank), the pickle and the JSON form, without running code.

PyTorch's c10d keeps the last ``TORCH_FR_BUFFER_SIZE`` (formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
collectives of each rank and dumps them on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) to
``TORCH_FR_DUMP_TEMP_FILE<rank>``, or when asked (``torch._C._distributed_c10d._dump_fr_trace`` /
``_dump_fr_trace_json``; ``_dump_nccl_trace`` for NCCL). The schema, from torch 2.13
(``torch/csrc/distributed/c10d/FlightRecorder.hpp`` constants, ``FlightRecorderDetail.hpp``
``getCollectiveTrace`` / ``dump_json``; read by ``torch/distributed/flight_recorder/components/loader.py``):

    {"version": "2.10", "comm_lib_version": str,
     "pg_config": {pg_name: {"name", "desc", "ranks": "[0, 1, 2, 3]"}},
     "pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}},
     "entries": [{"record_id", "pg_id", "process_group": [pg_name, pg_desc], "collective_seq_id", "p2p_seq_id",
                  "op_id", "is_p2p", "profiling_name" ("nccl:all_reduce"), "time_created_ns", "duration_ms"?,
                  "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                  "state" ("scheduled" | "started" | "completed"), "retired", "timeout_ms",
                  "time_discovered_started_ns", "time_discovered_completed_ns", "frames"?, "thread_id",
                  "thread_name"}],
     "nccl_comm_state"?: {...}}

**The pickle is never unpickled with the standard unpickler** (``pickle.load`` runs whatever a
pickle names: ``os.system`` through ``REDUCE``). ``load_restricted_pickle`` first walks the opcodes
(``pickletools.genops``, which parses without executing) and refuses any that names or calls
something (``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``,
``EXT*``, persistent ids, out-of-band buffers); then it loads with an Unpickler whose
``find_class`` refuses everything. What comes out is plain dicts, lists, tuples, sets, strings,
bytes, numbers, bools and None. The rank comes from the file name (``..._<rank>``, as torch's
loader takes it) unless the caller gives it.

Strict: a dump that is not one of these, or lacks ``entries``, is one ParseError naming the file.
Unknown keys are kept; absent optional keys (``duration_ms``, ``frames``) stay absent.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import file_time, read_bytes
from hpcwatch.vocab import EventKind

__all__ = [
    "load_restricted_pickle",
    "parse_flight_recorder",
    "read_flight_recorder",
    "is_flight_recorder",
    "ALLOWED_OPCODES",
    "MAX_DUMP_BYTES",
]

#: A dump of the default 2000 entries is ~1 MB; 256 MiB leaves room for stack frames on large buffers.
MAX_DUMP_BYTES = 256 << 20

#: Opcodes that build plain data only (pickletools names). Everything else is refused before loading.
ALLOWED_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_DICT",
        "DICT",
        "SETITEM",
        "SETITEMS",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
        "GET",
        "BINGET",
        "LONG_BINGET",
    }
)

_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json)?$")


class _NoClasses(pickle.Unpickler):
    """An Unpickler that can name no class or function: the second lock, behind the opcode walk."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: the pickle uses a persistent id")


def load_restricted_pickle(data: bytes, *, path: str | os.PathLike[str] = "<pickle>") -> Any:
    """Plain data of a pickle, or a ParseError; nothing the pickle names is imported or called."""
    try:
        for opcode, arg, pos in pickletools.genops(data):
            if opcode.name not in ALLOWED_OPCODES:
                what = f" ({arg})" if isinstance(arg, str) else ""
                raise ParseError(
                    f"refused: pickle opcode {opcode.name}{what} at byte {pos} could run code "
                    "(a Flight Recorder dump holds plain data only)",
                    path=path,
                )
    except ParseError:
        raise
    except (ValueError, EOFError, IndexError) as err:
        raise ParseError(f"not a readable pickle: {err}", path=path) from err
    try:
        return _NoClasses(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, IndexError, KeyError, MemoryError) as err:
        raise ParseError(f"not a readable pickle: {err}", path=path) from err


def _rank_from_name(path: str | os.PathLike[str]) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m[1]) if m else None


def parse_flight_recorder(
    data: bytes, *, path: str | os.PathLike[str] = "<dump>", rank: int | None = None, t: float = 0.0
) -> Event:
    """One ``flight_recorder_dump`` Event: rank, version, pg_config, pg_status, entries (as written)."""
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        try:
            dump = orjson.loads(data)
        except orjson.JSONDecodeError as err:
            raise ParseError(f"not JSON: {err}", path=path) from err
        form = "json"
    else:
        dump, form = load_restricted_pickle(data, path=path), "pickle"
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list) or "version" not in dump:
        raise ParseError("not a Flight Recorder dump (needs 'version' and a list of 'entries')", path=path)
    entries = [e for e in dump.get("entries", []) if isinstance(e, dict)]
    attrs = {
        "rank": rank if rank is not None else _rank_from_name(path),
        "version": str(dump["version"]),
        "form": form,
        "comm_lib_version": dump.get("comm_lib_version"),
        "pg_config": _plain(dump.get("pg_config") or {}),
        "pg_status": _plain(dump.get("pg_status") or {}),
        "entries": [_plain(e) for e in entries],
    }
    return Event(kind=EventKind.FLIGHT_RECORDER_DUMP, t=t, source=str(path), attrs=attrs)


def _plain(value: Any) -> Any:
    """JSON-able: tuples become lists, bytes are decoded, keys become strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value


def read_flight_recorder(path: str | os.PathLike[str], *, rank: int | None = None) -> Event:
    """The dump in ``path`` (pickle or JSON), dated by the file's write time."""
    return parse_flight_recorder(read_bytes(path, max_bytes=MAX_DUMP_BYTES), path=path, rank=rank, t=file_time(path))


def is_flight_recorder(raw: bytes) -> bool:
    """Sniff: a protocol-2+ pickle of a dict, or a JSON object, naming ``pg_config`` and ``entries``/``version``."""
    head = raw[:65536]
    if head[:1] == b"\x80" and head[2:3] in (b"}", b"\x95"):
        return b"pg_config" in head and b"version" in head
    text = head.lstrip()
    return text.startswith(b"{") and b'"pg_config"' in head and (b'"entries"' in head or b'"pg_status"' in head)
