"""The training hook's live stream and its control file: the per-node spool layout both ends share.

The hook (``instrument.live.LiveStream``) writes, and ``collect.live`` reads, a folder per job in a
per-node spool folder::

    SPOOL/<job>/rank-<N>.jsonl      the stream (rotated to rank-<N>.jsonl.1 at a size cap: bounded)
    SPOOL/<job>/control.json        written by the collector or ``hpcwatch trace``; polled by the hook
    SPOOL/<job>/fr-<id>_<N>.json    a Flight Recorder dump rank N wrote when asked (id: the request)
    SPOOL/<job>/trace-<id>-rank-<N>.json   a Kineto trace of N steps rank N captured when asked

Over HTTP (the hook pushes to ``[[receive]]``, no folder shared) the same layout is kept on the collector's
side, in its ``live_spool``: the answer to each ``POST /v1/live/<job>/<N>`` carries the job's control file
(``control_doc``), and a rank POSTs a dump or trace to ``answer_path(job, N, kind, id)``, which the receiver
checks and writes under ``answer_name``. Such a body is at most ``MAX_ANSWER_BYTES``.

Stream lines are the hook's JSON lines (``sources.hook``: ``span`` and ``sample`` records; each span's
``attrs.clock`` says which clock timed it, ``cuda_event`` or ``cpu``) plus one kind of its own, written
when a phase begins (so a rank stuck in a collective says where it is)::

    {"kind": "enter", "job", "rank", "step", "phase", "collective"?, "t"}

``closed`` as the phase says the recorder was closed (the rank ended, it is not hung). An ``enter``
becomes an ``Event`` of kind ``hook_enter``. Lines longer than ``MAX_LINE_BYTES`` are refused
before they are parsed.

The control file is one JSON object: ``{"live": bool, "trace": {"id", "steps"}, "dump": {"id"}}``,
every key optional; each request is acted on once per id.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Sample, Span
from hpcwatch.sources.hook import parse_hook_record
from hpcwatch.sources.lines import line_text, shown
from hpcwatch.vocab import EventKind

__all__ = [
    "CONTROL",
    "MAX_LINE_BYTES",
    "MAX_TRACE_STEPS",
    "Control",
    "parse_live_line",
    "read_control",
    "write_control",
    "stream_name",
    "dump_name",
    "trace_name",
    "answer_name",
    "answer_path",
    "parse_answer_path",
    "control_doc",
    "ANSWER_KINDS",
    "MAX_ANSWER_BYTES",
    "rank_of_stream",
    "CLOSED",
]

CONTROL = "control.json"
#: A step's span line is ~200 bytes; 64 KiB leaves room for big attrs and refuses a runaway writer.
MAX_LINE_BYTES = 64 * 1024
#: The most steps one on-demand trace may ask for (a profiler's trace of a step is MBs on a GPU).
MAX_TRACE_STEPS = 100
#: The most bytes a dump or trace POSTed back may have (a few steps of a GPU trace are tens of MB).
MAX_ANSWER_BYTES = 64 << 20
#: What a rank may POST back: the answers to the control file's requests.
ANSWER_KINDS = ("dump", "trace")
#: The phase of the ``enter`` a closed recorder writes.
CLOSED = "closed"
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_STREAM = re.compile(r"rank-(\d{1,9})\.jsonl")
_ANSWER_PATH = re.compile(r"/v1/live/([A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})/(\d{1,9})/(dump|trace)/([A-Za-z0-9_.-]{1,64})")


def stream_name(rank: int) -> str:
    return f"rank-{rank}.jsonl"


def rank_of_stream(name: str) -> int | None:
    """The rank of a stream file's name (``rank-N.jsonl``), None for anything else."""
    found = _STREAM.fullmatch(name)
    return int(found.group(1)) if found else None


def dump_name(request: str, rank: int) -> str:
    """``fr-<id>_<rank>.json``: the rank last, as torch's own loader and ``sources.flight_recorder`` read it."""
    return f"fr-{request}_{rank}.json"


def trace_name(request: str, rank: int) -> str:
    return f"trace-{request}-rank-{rank}.json"


def answer_name(kind: str, request: str, rank: int) -> str:
    """The file an answer is kept in: a dump's or a trace's name, as the folder layout has it."""
    return dump_name(request, rank) if kind == "dump" else trace_name(request, rank)


def answer_path(job: str, rank: int, kind: str, request: str) -> str:
    """Where a rank POSTs its answer to a request: ``/v1/live/<job>/<rank>/<kind>/<id>``."""
    return f"/v1/live/{job}/{rank}/{kind}/{request}"


def parse_answer_path(path: str) -> tuple[str, int, str, str] | None:
    """(job, rank, kind, id) of an answer's path, None for any other path (no ``..``, no other folder)."""
    found = _ANSWER_PATH.fullmatch(path)
    if found is None:
        return None
    return found.group(1), int(found.group(2)), found.group(3), found.group(4)


@dataclass(frozen=True, slots=True)
class Control:
    live: bool = True
    trace_id: str | None = None
    trace_steps: int = 0
    dump_id: str | None = None


def _request_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ValueError(f"{where} id must be 1-64 of [A-Za-z0-9_.-], got {shown(value, 40)}")
    return value


def parse_control(raw: bytes, *, path: str | os.PathLike[str] = CONTROL) -> Control:
    """The control file's requests; a file that is not one of them is one ParseError naming it."""
    try:
        doc = orjson.loads(raw)
        if not isinstance(doc, dict):
            raise TypeError("want a JSON object")
        live = doc.get("live", True)
        if not isinstance(live, bool):
            raise TypeError("live must be true or false")
        trace, dump = doc.get("trace") or {}, doc.get("dump") or {}
        trace_id = _request_id(trace["id"], "trace") if trace else None
        steps = int(trace.get("steps", 0)) if trace else 0
        if trace and not 1 <= steps <= MAX_TRACE_STEPS:
            raise ValueError(f"trace steps must be in 1..{MAX_TRACE_STEPS}, got {steps}")
        dump_id = _request_id(dump["id"], "dump") if dump else None
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError) as err:
        raise ParseError(f"bad control file ({shown(err, 120)})", path=path, line=1) from err
    return Control(live=live, trace_id=trace_id, trace_steps=steps, dump_id=dump_id)


def read_control(job_dir: str | os.PathLike[str]) -> Control | None:
    """The job's control file, None when there is none (a hook then keeps its start-up setting)."""
    path = Path(job_dir) / CONTROL
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LINE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:  # not a folder, unreadable: one line, like a bad file
        raise ParseError(f"cannot read the control file: {err.strerror or err}", path=path, line=1) from err
    if len(raw) > MAX_LINE_BYTES:
        raise ParseError(f"control file over {MAX_LINE_BYTES} bytes", path=path, line=1)
    return parse_control(raw, path=path)


def control_doc(control: Control) -> bytes:
    """The control file's bytes (what ``parse_control`` reads back)."""
    doc: dict[str, Any] = {"live": control.live}
    if control.trace_id is not None:
        doc["trace"] = {"id": _request_id(control.trace_id, "trace"), "steps": control.trace_steps}
    if control.dump_id is not None:
        doc["dump"] = {"id": _request_id(control.dump_id, "dump")}
    return orjson.dumps(doc)


def write_control(job_dir: str | os.PathLike[str], control: Control) -> Path:
    """Replace the job's control file whole (a temporary file renamed: a hook never reads half of one)."""
    folder = Path(job_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CONTROL}.{os.getpid()}"
    tmp.write_bytes(control_doc(control))
    os.replace(tmp, folder / CONTROL)
    return folder / CONTROL


def parse_live_line(line: bytes, *, path: str | os.PathLike[str] = "<input>", number: int = 1) -> Span | Sample | Event:
    """One stream line as a record; ParseError (naming the file and line) for anything else."""
    if len(line) > MAX_LINE_BYTES:
        raise ParseError(f"record of {len(line)} bytes, over the {MAX_LINE_BYTES}-byte cap", path=path, line=number)
    if b'"enter"' not in line:
        return parse_hook_record(line, path, number)
    try:
        doc = orjson.loads(line)
        if not isinstance(doc, dict) or doc.get("kind") != "enter":
            return parse_hook_record(line, path, number)
        attrs: dict[str, Any] = {
            "job": str(doc["job"]),
            "rank": int(doc["rank"]),
            "step": None if doc["step"] is None else int(doc["step"]),  # None: the recorder's close
            "phase": str(doc["phase"])[:64],
        }
        if doc.get("collective") is not None:
            attrs["collective"] = str(doc["collective"])[:64]
        return Event(kind=EventKind.HOOK_ENTER, t=float(doc["t"]), source="hook", attrs=attrs)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as err:
        raise ParseError(
            f"bad live record ({type(err).__name__}: {shown(err, 120)})", path=path, line=number, text=line_text(line)
        ) from err
