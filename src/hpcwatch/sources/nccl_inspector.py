"""Reader of NCCL Inspector output: per-communicator, per-collective timing from NVIDIA's NCCL profiler plugin.

The plugin (``ext-profiler/inspector`` in https://github.com/NVIDIA/nccl, loaded with
``NCCL_PROFILER_PLUGIN=.../libnccl-profiler-inspector.so NCCL_INSPECTOR_ENABLE=1``) appends one JSON
object per collective per communicator to a file under ``NCCL_INSPECTOR_DUMP_DIR``
(``inspector_output_format_version`` "v4.0", its README's "Output Example"):

    {"header": {"id": comm id, "rank", "n_ranks", "nnodes"},
     "metadata": {"inspector_output_format_version", "git_rev", "rec_mechanism", "dump_timestamp_us", "hostname", "pid"},
     "coll_perf": {"coll": "AllReduce", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
                   "coll_timing_source"?, "coll_algobw_gbs", "coll_busbw_gbs", "event_trace_sn"?, "event_trace_ts"?}}

Objects follow one another (one a line, or pretty-printed: both are read, the decoder takes one
object after the other). Each becomes an ``nccl_inspector`` Event dated ``dump_timestamp_us``.
The Prometheus form (``NCCL_INSPECTOR_PROM_DUMP=1``) is Prometheus text and read as such.

Strict about what it reads: text that is not a sequence of JSON objects, or an object without
``header`` / ``coll_perf``, is a ParseError naming the file and the line it starts on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from hpcwatch.errors import ParseError
from hpcwatch.records import Event
from hpcwatch.sources.lines import read_text
from hpcwatch.vocab import EventKind

__all__ = ["parse_nccl_inspector", "read_nccl_inspector", "is_nccl_inspector"]

_DECODER = json.JSONDecoder()


def _event(obj: Any, path: str | os.PathLike[str], line: int) -> Event:
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("header"), dict)
        or not isinstance(obj.get("coll_perf"), dict)
    ):
        raise ParseError("an NCCL Inspector record needs 'header' and 'coll_perf' objects", path=path, line=line)
    header, meta, perf = obj["header"], obj.get("metadata") or {}, obj["coll_perf"]
    attrs = {
        "comm_id": header.get("id"),
        "rank": header.get("rank"),
        "n_ranks": header.get("n_ranks"),
        "nnodes": header.get("nnodes"),
        "host": meta.get("hostname"),
        "node": meta.get("hostname"),
        "pid": meta.get("pid"),
        "format_version": meta.get("inspector_output_format_version"),
        "coll": perf.get("coll"),
        "coll_sn": perf.get("coll_sn"),
        "msg_size_bytes": perf.get("coll_msg_size_bytes"),
        "exec_time_us": perf.get("coll_exec_time_us"),
        "timing_source": perf.get("coll_timing_source"),
        "algobw_gbs": perf.get("coll_algobw_gbs"),
        "busbw_gbs": perf.get("coll_busbw_gbs"),
    }
    t = meta.get("dump_timestamp_us")
    return Event(
        kind=EventKind.NCCL_INSPECTOR,
        t=float(t) / 1e6 if isinstance(t, (int, float)) else 0.0,
        source=str(path),
        attrs=attrs,
    )


def parse_nccl_inspector(text: str, *, path: str | os.PathLike[str] = "<inspector>") -> Iterator[Event]:
    """One Event per JSON object of the text, in order."""
    at, n, line, counted = 0, len(text), 1, 0
    while True:
        while at < n and text[at] in " \t\r\n":
            at += 1
        if at >= n:
            return
        line += text.count("\n", counted, at)  # counted once: linear however many objects
        counted = at
        try:
            obj, at = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError as err:
            raise ParseError(f"not a JSON object: {err.msg}", path=path, line=line, text=text[at : at + 80]) from err
        except (ValueError, RecursionError) as err:  # a 5000-digit number, nesting past the stack
            raise ParseError(
                f"not a JSON object: {type(err).__name__}", path=path, line=line, text=text[at : at + 80]
            ) from err
        yield _event(obj, path, line)


def read_nccl_inspector(path: str | os.PathLike[str]) -> Iterator[Event]:
    yield from parse_nccl_inspector(read_text(path), path=path)


def is_nccl_inspector(head: str) -> bool:
    """Sniff: a JSON object with the Inspector's ``header`` and ``coll_perf``."""
    text = head.lstrip()
    return text.startswith("{") and '"coll_perf"' in text and '"header"' in text
