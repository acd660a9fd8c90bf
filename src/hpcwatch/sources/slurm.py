"""Slurm jobs from ``squeue --json``, ``sacct --json`` and ``scontrol -d [-o] show job``.

Each yields ``records.Job``: who (user, account), where (nodes in nodelist
order, GPU indices per node when Slurm says them), when, and in what state.

The JSON shapes move with Slurm's OpenAPI plugin version
(https://slurm.schedmd.com/rest_api.html): 22.05 (``openapi/v0.0.38``) writes
plain numbers and ``"job_state": "RUNNING"``; from 23.11 (``v0.0.40``) numbers
come wrapped as ``{"set": true, "infinite": false, "number": N}`` and states as
lists (``["RUNNING"]``, first the base state, then flags). Both are read.

Times: JSON times are UTC epoch seconds; ``scontrol`` prints local wall-clock
time without a zone, read as UTC unless ``utc_offset_s`` says otherwise. A
running job's ``end_time`` and a pending job's ``start_time`` are Slurm's
forecasts, not events, so they become ``None``.

``gpus`` is what the job holds, or for a pending job what it asked for.

A running job has no end yet, so its elapsed time is what the snapshot said: ``parse_squeue_records``
(and slurmrestd's ``/slurm/v0.0.4x/jobs``, ``sources.slurmrest.parse_rest_job_records``) yield, after the
jobs, for each running job a ``vocab.SLURM_JOB_ELAPSED_SECONDS`` sample (snapshot time - start) and a
``SLURM_JOB_TIME_LIMIT_SECONDS`` one (``time_limit``, minutes; none when unlimited), both at the snapshot
time, labelled ``job_id``. The snapshot time is the document's ``last_update`` (slurmctld's time of its
last change to the job table, written after the ``jobs`` list by 24.05 and 25.11: at that moment every job listed
as running was running, so the elapsed time is never overstated), else the time the caller gives (the
collector's poll time; for a file, its modification time, 22.05 writes no ``last_update``), else now.
sacct's ``time.elapsed`` of a running job becomes the same sample. ``analysis.attribution`` ends a
running job there, capped by its time limit.

``sacct --json`` also says what a job used, the numbers jobstats prints: ``parse_sacct_records`` yields,
after each started job, ``Sample``s (labels ``job_id``, and ``node`` where per node) of
``vocab.SLURM_JOB_CPUS`` (``tres.allocated`` cpu), ``SLURM_JOB_MEMORY_REQUESTED_BYTES`` (``tres.allocated``
mem, else ``tres.requested`` mem: the job's total over its nodes), ``SLURM_JOB_CPU_SECONDS`` (the steps'
``time.total``, user + system), ``SLURM_JOB_MAX_RSS_BYTES`` per node (largest ``mem`` of the steps'
``tres.requested.max``, i.e. TRESUsageInMax, with its ``node``) and ``SLURM_JOB_TIME_LIMIT_SECONDS``
(``time.limit``), each at the time sacct measured it (start + elapsed). Units, as the real 22.05 capture
in tests/data/slurm/sacct.json shows them: job TRES ``mem`` counts MiB (Slurm's "MB", ``--mem`` "default
units are megabytes", https://slurm.schedmd.com/sbatch.html#OPT_mem; 8000 there is ``--mem=8000``, 16000
for two nodes of it); step usage ``mem`` counts bytes (3178496 there is the 3104K sacct prints as MaxRSS);
``time.limit`` counts minutes (``--time``, https://slurm.schedmd.com/sbatch.html#OPT_time; null or
``infinite``: none).

A requeued job keeps its id, and ``sacct --json`` lists each of its attempts as a record of its own, in
order (the real 22.05 capture tests/data/slurm/sacct_requeued.json: two records in state ``REQUEUED``,
each with the start and end of that attempt, then the running one). The last record is the job's; each
``REQUEUED`` one that ran also becomes a ``job_end`` Event (``state`` REQUEUED, ``start``, ``end``,
``nodes``), so that the nodes and hours of a lost attempt stay on record (goodput's first start, the
detectors' job windows).

The JSON documents are read as a stream (``sources.jsonstream``): one job decoded at a time, so a
gigabyte of ``sacct --json`` (a month of a big cluster) costs a block and a job of memory, not ~11x the
file; jobs decode exactly as ``json.loads`` of the whole document gives them. A GPU count or index past
``MAX_GPUS`` (2**64 + 1 written somewhere) is a ParseError on its job, not a number handed on.

Not checked: that the GPU counts of ``gres_detail`` and TRES agree, that node
names exist, that ids are unique, any field this module does not read (a number
of any size there is no error). Shape errors in JSON name the job's index in the
list and the line where that job starts.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, overload

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.records import Event, Job, Sample
from hpcwatch.sources.jsonstream import JsonArrayStream
from hpcwatch.sources.lines import MAX_STREAM_BYTES, file_time, open_binary, read_text

__all__ = [
    "parse_squeue_json",
    "read_squeue_json",
    "parse_squeue_records",
    "read_squeue_records",
    "squeue_records",
    "parse_sacct_json",
    "read_sacct_json",
    "parse_sacct_records",
    "read_sacct_records",
    "squeue_jobs",
    "sacct_records",
    "MIB",
    "parse_scontrol_show_job",
    "read_scontrol_show_job",
    "expand_hostlist",
    "parse_gres_detail",
    "FINISHED_STATES",
    "MAX_GPUS",
]

#: Base states after which a job has an end time (https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES).
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "COMPLETING",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
#: States in which a job has not started.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})

_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?\Z")
_GRES_RE = re.compile(r"gpu(?::[^:()]+)?:([0-9]+)(?:\(IDX:([^)]*)\))?")
#: More hosts than any cluster has: a hostlist past this is refused rather than expanded.
_MAX_HOSTS = 200_000
#: More GPUs (or a higher GPU index) than any job holds: a count past this is refused, not stored (the
#: store keeps GPU counts as 32-bit integers; a number above 2**64 would otherwise reach it).
MAX_GPUS = 2**31 - 1
#: Slurm's "MB" of memory TRES (module docstring).
MIB = 1024**2


class _Shape(ValueError):
    """A JSON value that is not what the schema says; becomes a ParseError naming the job."""


# -- hostlists and GRES ----------------------------------------------------------------------


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_ranges(inner: str) -> list[str]:
    out: list[str] = []
    for part in inner.split(","):
        m = _RANGE_RE.match(part.strip())
        if m is None:
            raise ValueError(f"bad range {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) > _MAX_HOSTS:
            raise ValueError(f"bad range {part!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
        if len(out) > _MAX_HOSTS:
            raise ValueError("too many hosts")
    return out


def _expand_one(pattern: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", pattern)
    if m is None:
        if "[" in pattern or "]" in pattern:
            raise ValueError("unbalanced brackets")
        return [pattern]
    head, tail = pattern[: m.start()], pattern[m.end() :]
    numbers, rests = _expand_ranges(m.group(1)), _expand_one(tail)
    if len(numbers) * len(rests) > _MAX_HOSTS:
        raise ValueError("too many hosts")
    return [head + n + rest for n in numbers for rest in rests]


def expand_hostlist(hostlist: str) -> list[str]:
    """``"node[1-2,5],gpu[01-02]"`` -> ``["node1", "node2", "node5", "gpu01", "gpu02"]`` (Slurm order).

    Raises ``ValueError`` on a malformed list (the readers turn it into a ParseError).
    """
    text = hostlist.strip()
    if not text or text in ("(null)", "None assigned"):
        return []
    hosts: list[str] = []
    try:
        for part in _split_top(text):
            if not part.strip():
                raise ValueError("empty host name")
            hosts.extend(_expand_one(part.strip()))
            if len(hosts) > _MAX_HOSTS:
                raise ValueError("too long")
    except ValueError as err:
        raise ValueError(f"bad hostlist {hostlist!r}: {err}") from err
    return hosts


def parse_gres_detail(entry: str) -> tuple[int, tuple[int, ...]]:
    """``"gpu:2(IDX:6-7)"`` -> ``(2, (6, 7))``; ``"gpu:a100:1(IDX:3)"`` -> ``(1, (3,))``; no GPU -> ``(0, ())``.

    A count or index past ``MAX_GPUS`` is a ``ValueError``."""
    m = _GRES_RE.search(entry)
    if m is None:
        return 0, ()
    count = _gpus(int(m.group(1)))
    idx = m.group(2)
    if not idx or idx == "N/A":
        return count, ()
    return count, tuple(_gpus(int(i), "GPU index") for i in _expand_ranges(idx))


def _gpus(count: int, what: str = "GPU count") -> int:
    """``count`` when it is a count a job can hold (0 to ``MAX_GPUS``), else a ``ValueError``."""
    if not 0 <= count <= MAX_GPUS:
        digits = str(count) if abs(count) < 10**30 else f"a {len(str(abs(count)))}-digit number"
        raise ValueError(f"{what} {digits} out of range (0 to {MAX_GPUS})")
    return count


def _tres_gpus(tres: str) -> int:
    """``"cpu=2,node=2,gres/gpu=4"`` -> 4 (the untyped count; typed ``gres/gpu:a100=`` only if alone)."""
    typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
        if key.startswith("gres/gpu:") and value.isdigit():
            typed += int(value)
    return typed


# -- JSON values that changed shape between versions ----------------------------------------


def _number(value: Any) -> float | None:
    """Plain number, or ``{"set", "infinite", "number"}``; unset or infinite -> None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _Shape(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return _within_64_bits(value)
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return _number(value.get("number"))
    raise _Shape(f"expected a number, got {value!r}")


#: Slurm's numbers are 64-bit at most (uint64 for NO_VAL64 2^64-2 and memory, int64 for times):
#: anything past is not a Slurm value (a job id or end time of 2^64+1 used to be kept as garbage).
_SLURM_NUMBERS = (-(1 << 63), 1 << 64)


def _within_64_bits(value: float) -> float:
    if isinstance(value, float) and not math.isfinite(value):
        raise _Shape(f"number out of range ({value})")
    if not _SLURM_NUMBERS[0] <= value < _SLURM_NUMBERS[1]:
        digits = len(str(abs(int(value))))
        raise _Shape(f"number out of range (beyond 64 bits: a {digits}-digit number)")
    return value


def _state(value: Any) -> str | None:
    """``"RUNNING"`` or ``["RUNNING", "COMPLETING"]`` -> the base state."""
    if value is None:
        return None
    if isinstance(value, list):
        return _state(value[0]) if value else None
    if isinstance(value, str):
        return value
    raise _Shape(f"expected a job state, got {value!r}")


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise _Shape(f"expected text, got {value!r}")


def _epoch(value: Any) -> float | None:
    """Epoch seconds; Slurm writes 0 for "not yet"."""
    number = _number(value)
    return float(number) if number else None


def _times(state: str | None, start: float | None, end: float | None) -> tuple[float | None, float | None]:
    base = (state or "").split("+")[0]
    if base in WAITING_STATES:
        return None, None
    if base not in FINISHED_STATES:
        end = None
    return start, end


def _job_id(job_id: Any, array_job: Any, array_task: Any) -> str:
    jid = _number(job_id)
    if jid is None:
        raise _Shape("job without job_id")
    array_id, task = _number(array_job), _number(array_task)
    if array_id and task is not None:
        return f"{int(array_id)}_{int(task)}"
    return str(int(jid))


# -- squeue --json ---------------------------------------------------------------------------


def _jobs(text: str | None, path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(line, raw job) of each element of the document's ``"jobs"`` list, streamed (``sources.jsonstream``):
    from ``text``, or read from ``path`` when ``text`` is None, a block at a time."""
    if text is not None:
        yield from _checked(JsonArrayStream.from_text(text, "jobs", path=path))
        return
    with open_binary(path, max_bytes=MAX_STREAM_BYTES) as stream:
        yield from _checked(JsonArrayStream.from_binary(stream, "jobs", path=path))


def _checked(jobs: JsonArrayStream) -> Iterator[tuple[int, Any]]:
    yield from jobs
    if not jobs.found:
        raise ParseError('not a Slurm JSON answer (no "jobs" list)', path=jobs.path, line=1)


def _squeue_job(raw: Mapping[str, Any]) -> Job:
    state = _state(raw.get("job_state"))
    nodes = tuple(expand_hostlist(_text(raw.get("nodes")) or ""))
    details = raw.get("gres_detail") or []
    if not isinstance(details, list):
        raise _Shape("gres_detail is not a list")
    by_node: dict[str, tuple[int, ...]] = {}
    counted = 0
    for node, entry in zip(nodes, details):
        count, idx = parse_gres_detail(str(entry))
        counted += count
        if idx:
            by_node[node] = idx
    # Allocated, else (pending) requested: what the job holds or waits for.
    gpus = _gpus(
        counted
        or _tres_gpus(_text(raw.get("tres_alloc_str")) or "")
        or _tres_gpus(_text(raw.get("tres_req_str")) or "")
    )
    start, end = _times(state, _epoch(raw.get("start_time")), _epoch(raw.get("end_time")))
    return Job(
        id=_job_id(raw.get("job_id"), raw.get("array_job_id"), raw.get("array_task_id")),
        user=_text(raw.get("user_name")),
        account=_text(raw.get("account")),
        partition=_text(raw.get("partition")),
        nodes=nodes,
        gpus=gpus,
        gpus_by_node=by_node,
        start=start,
        end=end,
        state=state,
        name=_text(raw.get("name")),
        mail_user=_text(raw.get("mail_user")),
    )


_Built = TypeVar("_Built")


@overload
def _each(
    jobs: Iterable[tuple[int, Any]],
    build: Callable[[Mapping[str, Any]], _Built],
    path: str | os.PathLike[str],
    *,
    many: Literal[False] = False,
) -> Iterator[_Built]: ...


@overload
def _each(
    jobs: Iterable[tuple[int, Any]],
    build: Callable[[Mapping[str, Any]], Iterable[_Built]],
    path: str | os.PathLike[str],
    *,
    many: Literal[True],
) -> Iterator[_Built]: ...


def _each(
    jobs: Iterable[tuple[int, Any]],
    build: Callable[[Mapping[str, Any]], Any],
    path: str | os.PathLike[str],
    *,
    many: bool = False,
) -> Iterator[Any]:
    """``build(raw)`` of each job (``many``: an iterable of records each), shape errors named by job and its line."""
    for i, (line, raw) in enumerate(jobs):
        if many:
            yield from _built(i, line, raw, lambda r: list(build(r)), path)
        else:
            yield _built(i, line, raw, build, path)


def _built(
    i: int, line: int, raw: Any, build: Callable[[Mapping[str, Any]], _Built], path: str | os.PathLike[str]
) -> _Built:
    """``build(raw)`` of job ``i``, its shape errors a ParseError naming it and its line."""
    try:
        if not isinstance(raw, Mapping):
            raise _Shape("a job is not an object")
        return build(raw)
    except (_Shape, ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as err:
        raise ParseError(f"jobs[{i}]: {err}", path=path, line=line) from err


def parse_squeue_json(text: str, *, path: str | os.PathLike[str] = "<input>") -> Iterator[Job]:
    """Jobs of ``squeue --json`` (or slurmrestd ``/slurm/v0.0.3x-4x/jobs``); see the module docstring."""
    yield from _each(_jobs(text, path), _squeue_job, path)


def read_squeue_json(path: str | os.PathLike[str]) -> Iterator[Job]:
    yield from _each(_jobs(None, path), _squeue_job, path)


def squeue_jobs(jobs: Iterable[tuple[int, Any]], *, path: str | os.PathLike[str] = "<input>") -> Iterator[Job]:
    """Jobs of ``(line, raw job)`` pairs (a ``JsonArrayStream`` of a ``"jobs"`` list in squeue's shape)."""
    yield from _each(jobs, _squeue_job, path)


def parse_squeue_records(
    text: str, *, path: str | os.PathLike[str] = "<input>", t: float | None = None
) -> Iterator[Job | Sample]:
    """Jobs of ``squeue --json``, then the elapsed time and time limit of each running one at the snapshot
    time (module docstring; ``t``: the time to use when the document has no ``last_update``, default now)."""
    stream = JsonArrayStream.from_text(text, "jobs", path=path)
    yield from squeue_records(_checked(stream), stream.members, path=path, t=t)


def read_squeue_records(path: str | os.PathLike[str], *, t: float | None = None) -> Iterator[Job | Sample]:
    """``parse_squeue_records`` of a saved file, streamed; without ``last_update`` the snapshot time is ``t``,
    else the file's modification time (when it was written: the squeue run)."""
    with open_binary(path, max_bytes=MAX_STREAM_BYTES) as binary:
        stream = JsonArrayStream.from_binary(binary, "jobs", path=path)
        yield from squeue_records(_checked(stream), stream.members, path=path, t=file_time(path) if t is None else t)


def squeue_records(
    jobs: Iterable[tuple[int, Any]],
    members: Mapping[str, Any],
    *,
    path: str | os.PathLike[str] = "<input>",
    t: float | None = None,
) -> Iterator[Job | Sample]:
    """Jobs of ``(line, raw job)`` pairs, then the running ones' samples at the snapshot time. ``members``:
    the document's other members, read by the time the pairs are exhausted (``JsonArrayStream.members``)."""
    running: list[tuple[str, float, float | None]] = []  # (id, start, limit s): a few numbers per running job
    for i, (line, raw) in enumerate(jobs):
        job = _built(i, line, raw, _squeue_job, path)
        if job.start is not None and job.end is None:
            running.append((job.id, job.start, _built(i, line, raw, _limit_s, path)))
        yield job
    at = _snapshot_time(members, path, t)
    for job_id, start, limit_s in running:
        yield from _running_samples(job_id, at, max(0.0, at - start), limit_s)


def _limit_s(raw: Mapping[str, Any]) -> float | None:
    """``time_limit`` (minutes) in seconds; None when unlimited or not said."""
    minutes = _number(raw.get("time_limit"))
    return 60.0 * minutes if minutes else None


def _snapshot_time(members: Mapping[str, Any], path: str | os.PathLike[str], t: float | None) -> float:
    """``last_update``, else ``t``, else now (module docstring)."""
    try:
        stamped = _epoch(members.get("last_update"))
        if stamped is not None and not math.isfinite(stamped):
            raise _Shape(f"not a time: {stamped}")
    except (_Shape, OverflowError) as err:
        raise ParseError(f"last_update: {err}", path=path) from err
    if stamped is not None:
        return stamped
    return time.time() if t is None else t


def _running_samples(job_id: str, at: float, elapsed_s: float, limit_s: float | None) -> list[Sample]:
    labels = {"job_id": job_id}
    out = [Sample(metric=vocab.SLURM_JOB_ELAPSED_SECONDS, labels=labels, t=at, value=elapsed_s)]
    if limit_s is not None:
        out.append(Sample(metric=vocab.SLURM_JOB_TIME_LIMIT_SECONDS, labels=labels, t=at, value=limit_s))
    return out


# -- sacct --json ----------------------------------------------------------------------------


def _sacct_gpus(tres: Any) -> int:
    """GPUs in ``tres.allocated``, else (pending) in ``tres.requested``."""
    if not isinstance(tres, Mapping):
        return 0
    return _tres_list_gpus(tres.get("allocated")) or _tres_list_gpus(tres.get("requested"))


def _tres_list_gpus(allocated: Any) -> int:
    """The untyped ``gres/gpu`` count; typed ones (``gpu:h100``) repeat it, so they count only when alone."""
    allocated = allocated or []
    if not isinstance(allocated, list):
        raise _Shape("tres.allocated is not a list")
    untyped, typed = None, 0
    for item in allocated:
        if not isinstance(item, Mapping) or item.get("type") != "gres":
            continue
        name = str(item.get("name") or "")
        count = int(_number(item.get("count")) or 0)
        if name == "gpu":
            untyped = (untyped or 0) + count
        elif name.startswith("gpu:"):
            typed += count
    return untyped if untyped is not None else typed


def _sacct_job(raw: Mapping[str, Any]) -> Job:
    state_doc = raw.get("state")
    state = _state(state_doc.get("current") if isinstance(state_doc, Mapping) else state_doc)
    times = time_doc if isinstance(time_doc := raw.get("time"), Mapping) else {}
    array = array_doc if isinstance(array_doc := raw.get("array"), Mapping) else {}
    start, end = _times(state, _epoch(times.get("start")), _epoch(times.get("end")))
    return Job(
        id=_job_id(raw.get("job_id"), array.get("job_id"), array.get("task_id")),
        user=_text(raw.get("user")),
        account=_text(raw.get("account")),
        partition=_text(raw.get("partition")),
        nodes=tuple(expand_hostlist(_text(raw.get("nodes")) or "")),
        gpus=_gpus(_sacct_gpus(raw.get("tres"))),
        start=start,
        end=end,
        state=state,
        name=_text(raw.get("name")),
    )


def parse_sacct_json(text: str, *, path: str | os.PathLike[str] = "<input>") -> Iterator[Job]:
    """Jobs of ``sacct --json`` (GPU counts from ``tres.allocated``; sacct gives no GPU indices)."""
    yield from _each(_jobs(text, path), _sacct_job, path)


def read_sacct_json(path: str | os.PathLike[str]) -> Iterator[Job]:
    yield from _each(_jobs(None, path), _sacct_job, path)


def parse_sacct_records(text: str, *, path: str | os.PathLike[str] = "<input>") -> Iterator[Job | Event | Sample]:
    """Each job of ``sacct --json``, the event of an attempt it lost to a requeue, then the samples of what it
    used (module docstring)."""
    yield from _each(_jobs(text, path), _sacct_job_and_usage, path, many=True)


def read_sacct_records(path: str | os.PathLike[str]) -> Iterator[Job | Event | Sample]:
    yield from _each(_jobs(None, path), _sacct_job_and_usage, path, many=True)


def sacct_records(
    jobs: Iterable[tuple[int, Any]], *, path: str | os.PathLike[str] = "<input>"
) -> Iterator[Job | Event | Sample]:
    """``parse_sacct_records`` of ``(line, raw job)`` pairs (a ``JsonArrayStream`` in sacct's shape)."""
    yield from _each(jobs, _sacct_job_and_usage, path, many=True)


def _sacct_job_and_usage(raw: Mapping[str, Any]) -> list[Job | Event | Sample]:
    job = _sacct_job(raw)
    return [job, *_requeued_attempt(raw, job), *_sacct_usage(raw, job)]


def _requeued_attempt(raw: Mapping[str, Any], job: Job) -> list[Event]:
    """The ``job_end`` event of an attempt Slurm requeued (module docstring); none for any other record,
    nor for a requeue before the job ever started (its times are 0)."""
    if (job.state or "").split("+")[0] != "REQUEUED":
        return []
    times = _mapping(raw.get("time"), "time")
    start, end = _epoch(times.get("start")), _epoch(times.get("end"))
    if start is None or end is None:
        return []
    return [
        Event(
            kind=vocab.EventKind.JOB_END,
            t=end,
            source="slurm",
            attrs={
                "job": job.id,
                "user": job.user,
                "state": "REQUEUED",
                "start": start,
                "end": end,
                "nodes": list(expand_hostlist(_text(raw.get("nodes")) or "")),
            },
        )
    ]


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Shape(f"{what} is not an object")
    return value


def _tres_items(value: Any, what: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise _Shape(f"{what} is not a list of TRES")
    return value


def _tres_count(items: list[Mapping[str, Any]], kind: str) -> float | None:
    """Count of the first TRES of ``type`` kind (cpu, mem), or None when absent."""
    return next((_number(i.get("count")) for i in items if i.get("type") == kind), None)


def _cpu_seconds(time_doc: Mapping[str, Any]) -> float | None:
    """``time.total`` ({seconds, microseconds}), else user + system; None when sacct wrote none."""

    def seconds(part: Any) -> float | None:
        part = _mapping(part, "time.total")
        if not part:
            return None
        return float(_number(part.get("seconds")) or 0) + float(_number(part.get("microseconds")) or 0) / 1e6

    total = seconds(time_doc.get("total"))
    if total is not None:
        return total
    user, system = seconds(time_doc.get("user")), seconds(time_doc.get("system"))
    return None if user is None and system is None else (user or 0.0) + (system or 0.0)


def _steps(raw: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    steps = raw.get("steps") or []
    if not isinstance(steps, list) or not all(isinstance(s, Mapping) for s in steps):
        raise _Shape("steps is not a list of objects")
    return steps


def _max_rss_by_node(steps: list[Mapping[str, Any]]) -> dict[str, int]:
    """Largest step ``tres.requested.max`` mem (bytes) per node it names."""
    out: dict[str, int] = {}
    for step in steps:
        usage = _mapping(_mapping(step.get("tres"), "steps[].tres").get("requested"), "steps[].tres.requested")
        for item in _tres_items(usage.get("max"), "steps[].tres.requested.max"):
            count, node = _number(item.get("count")), _text(item.get("node"))
            if item.get("type") == "mem" and count is not None and node:
                out[node] = max(out.get(node, 0), int(count))
    return out


def _sacct_usage(raw: Mapping[str, Any], job: Job) -> list[Sample]:
    """The SLURM_JOB_* samples of one started job (module docstring); none for a job that has not run."""
    if job.start is None:
        return []
    times = _mapping(raw.get("time"), "time")
    elapsed = _number(times.get("elapsed"))
    at = job.end if job.end is not None else job.start + float(elapsed or 0)
    tres = _mapping(raw.get("tres"), "tres")
    allocated = _tres_items(tres.get("allocated"), "tres.allocated")
    requested = _tres_items(tres.get("requested"), "tres.requested")
    steps = _steps(raw)
    step_cpu = [c for c in (_cpu_seconds(_mapping(s.get("time"), "steps[].time")) for s in steps) if c is not None]
    memory_mib = _tres_count(allocated, "mem") or _tres_count(requested, "mem")
    limit_min = _number(times.get("limit"))
    values = {
        vocab.SLURM_JOB_CPUS: _tres_count(allocated, "cpu"),
        vocab.SLURM_JOB_MEMORY_REQUESTED_BYTES: memory_mib * MIB if memory_mib else None,
        vocab.SLURM_JOB_CPU_SECONDS: sum(step_cpu) if step_cpu else _cpu_seconds(times),
        vocab.SLURM_JOB_TIME_LIMIT_SECONDS: 60.0 * limit_min if limit_min else None,
        # a finished job's elapsed is end - start, already in the Job; a running one's is only said here
        vocab.SLURM_JOB_ELAPSED_SECONDS: float(elapsed) if job.end is None and elapsed is not None else None,
    }
    labels = {"job_id": job.id}
    out = [Sample(metric=m, labels=labels, t=at, value=float(v)) for m, v in values.items() if v is not None]
    out += [
        Sample(metric=vocab.SLURM_JOB_MAX_RSS_BYTES, labels={**labels, "node": node}, t=at, value=float(rss))
        for node, rss in sorted(_max_rss_by_node(steps).items())
    ]
    return out


# -- scontrol -d show job --------------------------------------------------------------------

_FIELD_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=(\S*)")


def _scontrol_time(value: str, utc_offset_s: float) -> float | None:
    if value in ("", "Unknown", "None", "N/A", "(null)"):
        return None
    try:
        when = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError as err:
        raise ValueError(f"bad time {value!r}") from err
    return when.timestamp() - utc_offset_s


def _scontrol_job(fields: list[tuple[str, str]], utc_offset_s: float) -> Job:
    first = dict(reversed(fields))  # the first occurrence of each key wins
    if "JobId" not in first:
        raise ValueError("record without JobId")
    by_node: dict[str, tuple[int, ...]] = {}
    counted, current = 0, []
    for key, value in fields:  # "Nodes=node1 CPU_IDs=.. GRES=gpu:2(IDX:6-7)" repeats per node group
        if key == "Nodes":
            current = expand_hostlist(value)
        elif key == "GRES" and current:
            count, idx = parse_gres_detail(value)
            counted += count * len(current)
            for node in current:
                if idx:
                    by_node[node] = idx
    state = first.get("JobState")
    user = first.get("UserId", "").split("(")[0] or None
    array_job, array_task = first.get("ArrayJobId"), first.get("ArrayTaskId")
    job_id = f"{array_job}_{array_task}" if array_job and array_task and array_task.isdigit() else first["JobId"]
    start, end = _times(
        state,
        _scontrol_time(first.get("StartTime", ""), utc_offset_s),
        _scontrol_time(first.get("EndTime", ""), utc_offset_s),
    )
    return Job(
        id=job_id,
        user=user,
        account=_none(first.get("Account")),
        partition=_none(first.get("Partition")),
        nodes=tuple(expand_hostlist(first.get("NodeList", ""))),
        gpus=_gpus(counted or _tres_gpus(first.get("TRES", ""))),
        gpus_by_node=by_node,
        start=start,
        end=end,
        state=state,
        name=_none(first.get("JobName")),
        mail_user=_none(first.get("MailUser")),
    )


def _none(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A") else value


def _scontrol_records(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each job: one line each with ``-o``, else blank-line separated blocks."""
    block: list[str] = []
    start = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if line.startswith("JobId=") and block:
            yield start, " ".join(block)
            block = []
        if not line:
            if block:
                yield start, " ".join(block)
                block = []
            continue
        if not block:
            start = number
        block.append(line)
    if block:
        yield start, " ".join(block)


def parse_scontrol_show_job(
    text: str, *, path: str | os.PathLike[str] = "<input>", utc_offset_s: float = 0.0
) -> Iterator[Job]:
    """Jobs of ``scontrol -d show job`` (with or without ``-o``); GPU indices from each node group's ``GRES=``."""
    for number, record in _scontrol_records(text):
        if not record.startswith("JobId="):
            raise ParseError("not a 'scontrol show job' record (want JobId=...)", path=path, line=number, text=record)
        try:
            yield _scontrol_job(_FIELD_RE.findall(record), utc_offset_s)
        except (ValueError, OverflowError) as err:
            raise ParseError(str(err), path=path, line=number, text=record[:80]) from err


def read_scontrol_show_job(path: str | os.PathLike[str], *, utc_offset_s: float = 0.0) -> Iterator[Job]:
    yield from parse_scontrol_show_job(read_text(path), path=path, utc_offset_s=utc_offset_s)
