"""``[[live]]``: the training hook's live stream, read as the job runs, judged every run.

Each run tails every ``PATH/<job>/rank-N.jsonl`` (``sources.livehook``'s layout) from where it left off,
keeps per job and rank the spans of the last ``window_steps`` steps and the rank's last ``enter`` (where
it is), stores the spans (the web's step player plays the live job from them) and judges the job
(``reports.livejob.judge``: the straggler analysis of finished jobs, and the hang rule):

- a straggler newly named -> one ``live_straggler`` event;
- a hang -> one ``live_hang`` event (where each rank stopped: step, phase, collective) and, with
  ``dump_on_hang``, a dump request in the job's control file; the ranks' dumps are read when every rank
  that streamed answered (or ``DUMP_WAIT_S`` later, those that did) -> the ``flight_recorder_dump``
  events and one ``live_dump`` event (the ``analysis.hang`` verdict: who never issued the collective);
- an on-demand trace landing (``hpcwatch trace JOB --steps N`` asked for it) -> one ``live_trace`` event.

Hostile streams cost the collector one log line, never its loop: per rank and run, lines that are not
records, over ``MAX_LINE_BYTES``, of another job or rank than their file, or past the rate cap
(``max_records_per_s``; a backlog past the cap is skipped, never read) are refused, counted, logged once
with the first reason, and stored as one ``live_refused`` event. Per rank at most ``_SPANS_PER_STEP``
spans a step are kept; at most ``MAX_JOBS`` job folders and ``MAX_RANKS`` streams a job are read.

Over HTTP (``[[receive]]``'s ``live_spool`` as ``path``) nothing changes here: the receiver hands each
rank the job's control file with every answer to its stream (``control_for``) and writes the dumps and
traces the ranks POST back into the same layout (``land_answer``), once it has read them and found them
to answer a request of the control file.

A rotated stream (the hook renames it to ``.1`` past its size cap) is read from its start again; the
lines written between the last run and the rename are lost to the live view (the store has the steps).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcwatch.collect.base import RunResult
from hpcwatch.collect.config import LiveSection
from hpcwatch.errors import InputError, ParseError, one_line
from hpcwatch.records import Event, Sample, Span
from hpcwatch.reports.livejob import Stop, judge, read_dumps, read_trace
from hpcwatch.sources.flight_recorder import parse_flight_recorder
from hpcwatch.sources.kineto import parse_kineto
from hpcwatch.sources.lines import shown
from hpcwatch.sources.livehook import (
    CLOSED,
    MAX_ANSWER_BYTES,
    MAX_LINE_BYTES,
    MAX_TRACE_STEPS,
    Control,
    answer_name,
    control_doc,
    dump_name,
    parse_live_line,
    rank_of_stream,
    read_control,
    write_control,
)
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = [
    "LiveCollector",
    "MAX_JOBS",
    "MAX_RANKS",
    "DUMP_WAIT_S",
    "request_trace",
    "request_dump",
    "control_for",
    "land_answer",
    "UnknownRequest",
    "AlreadyAnswered",
]

log = logging.getLogger(__name__)

MAX_JOBS = 256
MAX_RANKS = 4096
#: Seconds a dump request waits for every rank before the dumps that landed are read.
DUMP_WAIT_S = 30.0
#: Bytes a line is assumed to take when the rate cap is turned into a read budget.
_BYTES_PER_RECORD = 400
_SPANS_PER_STEP = 64
#: A rank's allowance builds up for at most this many seconds (a burst after a quiet spell).
_BURST_S = 5.0
_JOB = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")


@dataclass
class _Rank:
    ino: int = -1
    offset: int = 0
    partial: bytes = b""
    skipping: bool = False  # inside a line over the cap: drop up to its end
    line: int = 0
    allowance: float = 0.0
    seen_at: float = 0.0
    steps: OrderedDict[int, list[Span]] = field(default_factory=OrderedDict)
    stop: Stop | None = None
    closed: bool = False
    progress: float = 0.0


@dataclass
class _Job:
    ranks: dict[int, _Rank] = field(default_factory=dict)
    named: int | None = None  # the straggler last named
    hang_since: float | None = None  # last_progress of the hang reported
    dump: tuple[str, float] | None = None  # (request id, asked at), until read
    traces: set[str] = field(default_factory=set)


@dataclass
class _Refusals:
    count: int = 0
    first: str = ""

    def add(self, why: str, n: int = 1) -> None:
        self.count += n
        self.first = self.first or why


class LiveCollector:
    def __init__(self, store: Store, section: LiveSection) -> None:
        self.store, self.section = store, section
        self.path = Path(section.path)
        self.jobs: dict[str, _Job] = {}
        self.refused = 0

    def close(self) -> None:
        pass

    def run(self) -> RunResult:
        now = time.time()
        out: list[Span | Sample | Event] = []
        notes: list[str] = []
        folders = self._job_folders()
        self.jobs = {f.name: self.jobs[f.name] for f in folders if f.name in self.jobs}  # a removed job is forgotten
        for folder in folders:
            job = self.jobs.setdefault(folder.name, _Job())
            out += self._read_job(folder, job, now, notes)
            out += self._judge(folder, job, now)
            out += self._collect_answers(folder, job, now)
        if out:
            self.store.add(out)
        return RunResult(records=len(out), note="; ".join(notes[:3]))

    # -- reading the streams ----------------------------------------------------------------------

    def _job_folders(self) -> list[Path]:
        try:
            folders = sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
        except FileNotFoundError:
            return []
        return folders[:MAX_JOBS]

    def _read_job(self, folder: Path, job: _Job, now: float, notes: list[str]) -> list[Span | Sample | Event]:
        out: list[Span | Sample | Event] = []
        streams = sorted((r, p) for p in folder.iterdir() if (r := rank_of_stream(p.name)) is not None)
        for rank, path in streams[:MAX_RANKS]:
            state = job.ranks.get(rank)
            if state is None:  # a new stream starts with a full allowance
                cap = self.section.max_records_per_s
                state = job.ranks[rank] = _Rank(seen_at=now, allowance=cap * _BURST_S)
            refusals: dict[str, _Refusals] = defaultdict(_Refusals)
            for record in self._tail(path, folder.name, rank, state, now, refusals):
                out += self._keep(record, state)
            for why, refused in refusals.items():
                self.refused += refused.count
                log.warning("live %s: refused %d line(s) (%s), first: %s", path, refused.count, why, refused.first)
                notes.append(f"{one_line(str(path))}: {refused.count} line(s) refused ({why})")
                attrs = {"job": folder.name, "rank": rank, "why": why, "count": refused.count, "first": refused.first}
                out.append(Event(kind=EventKind.LIVE_REFUSED, t=now, source="hpcwatch-live", attrs=attrs))
        return out

    def _tail(
        self, path: Path, job: str, rank: int, state: _Rank, now: float, refusals: dict[str, _Refusals]
    ) -> list[Span | Sample | Event]:
        cap = self.section.max_records_per_s
        state.allowance = min(state.allowance + cap * (now - state.seen_at), cap * _BURST_S)
        state.seen_at = now
        try:
            st = path.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != state.ino or st.st_size < state.offset:  # new or rotated: from the start
            state.ino, state.offset, state.partial, state.skipping, state.line = st.st_ino, 0, b"", False, 0
        budget = int(max(state.allowance, 1) * _BYTES_PER_RECORD)
        backlog = st.st_size - state.offset
        if backlog > budget:  # a flood: skip what the cap does not allow, never read it
            refusals["over the rate cap"].add(f"a backlog of {backlog - budget} bytes skipped")
            state.offset, state.partial, state.skipping = st.st_size - budget, b"", True
        with open(path, "rb") as f:
            f.seek(state.offset)
            data = f.read(budget)
        state.offset += len(data)
        return self._lines(state.partial + data, path, job, rank, state, refusals)

    def _lines(
        self, data: bytes, path: Path, job: str, rank: int, state: _Rank, refusals: dict[str, _Refusals]
    ) -> list[Span | Sample | Event]:
        *lines, state.partial = data.split(b"\n")
        if len(state.partial) > MAX_LINE_BYTES:
            refusals["over the size cap"].add(f"a line of over {MAX_LINE_BYTES} bytes")
            state.partial, state.skipping = b"", True
        records: list[Span | Sample | Event] = []
        for line in lines:
            state.line += 1
            if state.skipping:  # the rest of a line already refused
                state.skipping = False
                continue
            if not line.strip():
                continue
            if state.allowance < 1:
                refusals["over the rate cap"].add(f"line {state.line}")
                continue
            state.allowance -= 1
            try:
                record = parse_live_line(line, path=path, number=state.line)
            except ParseError as err:
                why = "over the size cap" if len(line) > MAX_LINE_BYTES else "not a record"
                refusals[why].add(one_line(str(err)))
                continue
            if _owner(record) != (job, rank):
                refusals["not this stream's job and rank"].add(f"line {state.line}: {shown(_owner(record), 60)}")
                continue
            records.append(record)
        return records

    def _keep(self, record: Span | Sample | Event, state: _Rank) -> list[Span | Sample | Event]:
        """Update the rank's window; what to store (spans and samples; the enters stay here)."""
        window = self.section.window_steps
        if isinstance(record, Event):
            phase = str(record.attrs["phase"])
            state.closed = phase == CLOSED
            step = record.attrs.get("step")
            state.stop = Stop(
                rank=int(record.attrs["rank"]),
                t=record.t,
                step=None if step is None else int(step),
                phase=phase,
                collective=record.attrs.get("collective"),
            )
            state.progress = max(state.progress, record.t)
            return []
        if isinstance(record, Span):
            spans = state.steps.setdefault(record.step, [])
            if record in spans:  # a batch the hook sent again after its answer was lost: once is enough
                return []
            if len(spans) < _SPANS_PER_STEP:
                spans.append(record)
            while len(state.steps) > window:
                state.steps.popitem(last=False)
            state.progress = max(state.progress, record.start + record.dur)
        return [record]

    # -- judging -----------------------------------------------------------------------------------

    def _judge(self, folder: Path, job: _Job, now: float) -> list[Event]:
        if not job.ranks:
            return []
        spans = [s for r in job.ranks.values() for step in r.steps.values() for s in step]
        stops = {rank: r.stop for rank, r in job.ranks.items() if r.stop is not None and not r.closed}
        last = max(r.progress for r in job.ranks.values())
        try:
            verdict = judge(
                folder.name, spans, stops, last_progress=last, now=now, hang_after_s=self.section.hang_after_s
            )
        except InputError as err:
            log.warning("live %s: no verdict: %s", folder, one_line(str(err)))
            return []
        out: list[Event] = []
        named = verdict.stragglers.stragglers if verdict.stragglers is not None else ()
        if named and named[0].rank != job.named:
            top = named[0]
            job.named = top.rank
            attrs = {
                "job": folder.name,
                "rank": top.rank,
                "node": top.node,
                "gpu": top.gpu,
                "phase": top.phase,
                "score": top.score,
                "steps": list(verdict.steps),
            }
            out.append(Event(kind=EventKind.LIVE_STRAGGLER, t=now, source="hpcwatch-live", attrs=attrs))
        hang = verdict.hang
        if hang is None:
            job.hang_since = None
        elif job.hang_since != last:
            job.hang_since = last
            attrs = {
                "job": folder.name,
                "step": hang.step,
                "stalled_s": round(hang.stalled_s, 3),
                "collectives": list(hang.collectives),
                "behind": list(hang.behind),
                "stops": [
                    {"rank": s.rank, "step": s.step, "phase": s.phase, "collective": s.collective} for s in hang.stops
                ],
            }
            if self.section.dump_on_hang:
                request = f"hang-{int(now)}"
                _ask(folder, dump_id=request)
                job.dump = (request, now)
                attrs["dump_request"] = request
            out.append(Event(kind=EventKind.LIVE_HANG, t=now, source="hpcwatch-live", attrs=attrs))
        return out

    # -- what the ranks wrote when asked ----------------------------------------------------------

    def _collect_answers(self, folder: Path, job: _Job, now: float) -> list[Event]:
        out: list[Event] = []
        if job.dump is not None:
            request, asked = job.dump
            dumps = sorted(p for r in job.ranks if (p := folder / dump_name(request, r)).exists())
            if dumps and (len(dumps) == len(job.ranks) or now - asked > DUMP_WAIT_S):
                job.dump = None
                out += self._read_dumps(folder, request, dumps, now)
        for path in sorted(folder.glob("trace-*-rank-*.json")):
            if path.name in job.traces or len(job.traces) >= MAX_RANKS:
                continue
            job.traces.add(path.name)
            try:
                attrs = read_trace(path)
            except InputError as err:
                log.warning("live %s: %s", path, one_line(str(err)))
                continue
            attrs.update(job=folder.name, request=path.name.split("-rank-")[0].removeprefix("trace-"))
            out.append(Event(kind=EventKind.LIVE_TRACE, t=now, source="hpcwatch-live", attrs=attrs))
        return out

    def _read_dumps(self, folder: Path, request: str, dumps: list[Path], now: float) -> list[Event]:
        try:
            events, summary = read_dumps(dumps)
        except InputError as err:
            log.warning("live %s: dump %s unreadable: %s", folder, request, one_line(str(err)))
            return []
        summary.update(job=folder.name, request=request, paths=[str(p) for p in dumps])
        return [*events, Event(kind=EventKind.LIVE_DUMP, t=now, source="hpcwatch-live", attrs=summary)]


def _owner(record: Span | Sample | Event) -> tuple[str, int] | Any:
    """The (job, rank) a record says it is from."""
    try:
        if isinstance(record, Span):
            return record.job, record.rank
        if isinstance(record, Sample):
            return str(record.labels.get("job")), int(record.labels.get("rank", -1))
        return str(record.attrs.get("job")), int(record.attrs.get("rank", -1))
    except (TypeError, ValueError):
        return None


def _ask(
    folder: Path, *, dump_id: str | None = None, trace: tuple[str, int] | None = None, live: bool | None = None
) -> None:
    """Add a request to the job's control file, keeping what it already asks."""
    try:
        current = read_control(folder) or Control()
    except ParseError:
        current = Control()
    write_control(
        folder,
        Control(
            live=current.live if live is None else live,
            trace_id=trace[0] if trace else current.trace_id,
            trace_steps=trace[1] if trace else current.trace_steps,
            dump_id=dump_id or current.dump_id,
        ),
    )


def _job_folder(spool: str | os.PathLike[str], job: str) -> Path:
    if not _JOB.fullmatch(job):
        raise InputError(f"job id {shown(job, 40)} is not 1-64 of [A-Za-z0-9_.-] (it names a folder)")
    return Path(spool) / job


def request_trace(spool: str | os.PathLike[str], job: str, steps: int) -> str:
    """Ask every rank of ``job`` to trace its next ``steps`` steps; returns the request id."""
    if not 1 <= steps <= MAX_TRACE_STEPS:
        raise InputError(f"--steps must be in 1..{MAX_TRACE_STEPS}, got {steps}")
    request = f"t{int(time.time() * 1000)}"
    _ask(_job_folder(spool, job), trace=(request, steps))
    return request


def request_live(spool: str | os.PathLike[str], job: str, *, on: bool) -> None:
    """Pause (``on=False``) or resume every rank's stream of ``job``; a pending trace or dump request stays."""
    _ask(_job_folder(spool, job), live=on)


def request_dump(spool: str | os.PathLike[str], job: str) -> str:
    """Ask every rank of ``job`` for its Flight Recorder dump; returns the request id."""
    request = f"d{int(time.time() * 1000)}"
    _ask(_job_folder(spool, job), dump_id=request)
    return request


# -- the HTTP side of requests and answers (collect/receive.py calls these) ------------------------------


class UnknownRequest(InputError):
    """An answer to no request of the job's control file."""


class AlreadyAnswered(UnknownRequest):
    """A second answer of one rank to one request (the first one stays)."""


def control_for(spool: str | os.PathLike[str], job: str) -> bytes | None:
    """The job's control file as the answer to a push carries it; None when there is none or it is bad."""
    try:
        control = read_control(_job_folder(spool, job))
    except InputError as err:  # a bad control file stays where it is, said once a push
        log.warning("live %s: %s", job, one_line(str(err)))
        return None
    return None if control is None else control_doc(control)


def land_answer(spool: str | os.PathLike[str], job: str, rank: int, kind: str, request: str, body: bytes) -> Path:
    """Check a dump or trace a rank POSTed and write it where ``[[live]]`` reads it; its path.

    UnknownRequest when the job's control file asks for no such thing or the rank already answered;
    InputError when the body is over ``MAX_ANSWER_BYTES`` or not what it says it is (read by the reader
    ``[[live]]`` reads it with, so what lands is readable)."""
    folder = _job_folder(spool, job)
    try:
        control = read_control(folder)
    except ParseError:
        control = None
    asked = None if control is None else control.dump_id if kind == "dump" else control.trace_id
    if asked != request:
        raise UnknownRequest(f"job {job} asked for no {kind} {shown(request, 64)}")
    target = folder / answer_name(kind, request, rank)
    if target.exists():
        raise AlreadyAnswered(f"rank {rank} already answered {kind} {request}")
    if len(body) > MAX_ANSWER_BYTES:
        raise InputError(f"a {kind} of {len(body)} bytes, over the {MAX_ANSWER_BYTES}-byte cap")
    if kind == "dump":
        if not body.lstrip().startswith(b"{"):  # the hook posts the JSON form: no pickle reaches the reader
            raise InputError(f"{target.name}: a dump is posted as JSON (the hook's _dump_fr_trace_json)")
        parse_flight_recorder(body, path=target.name, rank=rank)
    else:
        trace = parse_kineto(body, path=target.name)
        if trace.rank_from == "distributedInfo" and trace.rank != rank:
            raise InputError(f"{target.name}: a trace of rank {trace.rank} posted as rank {rank}")
    tmp = folder / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
    tmp.write_bytes(body)
    os.replace(tmp, target)
    return target
