"""Answers of Slurm's REST API (``slurmrestd``) and ``sinfo --json``: jobs, accounting, nodes, partitions.

The job answers have the shapes the ``squeue --json`` / ``sacct --json`` readers already read
(``/slurm/v0.0.38/jobs`` is what ``squeue --json`` prints in 22.05, ``/slurmdb/v0.0.38/jobs`` what
``sacct --json`` prints), so they go through ``sources.slurm``. Nodes and partitions become samples,
one per node or partition per answer, at the answer's time ``t`` (labelled ``node`` so the store's
host column is the Slurm node name):

    slurm_node_up{node,state}          1 when the node takes work (idle, mixed, allocated, completing
                                       and no DRAIN/FAIL/MAINT flag), else 0; label ``partitions`` (its
                                       partitions, comma-joined, sorted) when the answer lists them
    slurm_node_cpus / _alloc_cpus      CPUs configured / allocated
    slurm_node_gpus / _alloc_gpus      ``gres/gpu`` of ``tres`` / ``tres_used``
    slurm_partition_nodes / _cpus      nodes and CPUs of a partition {partition,state}

Node state codes: https://slurm.schedmd.com/sinfo.html#SECTION_NODE-STATE-CODES. 22.05
(``v0.0.38``) writes ``"state": "mixed"`` and flags apart (``state_flags``); 23.02+ write a list
(``["MIXED", "DRAIN"]``); both are read. Every answer carries ``errors``: a non-empty list is an
error (``SlurmApiError``), except ``9003`` "Nothing found", which slurmdbd answers for an empty
window (seen on 22.05.8: HTTP 200 with that error and no ``jobs``). Job answers are decoded one job at a
time (``sources.jsonstream``); their ``errors`` are raised when read, before the first job in v0.0.38
answers, after the last in v0.0.40+ ones (they write ``jobs`` first).

Not checked: fields this module does not read, that nodes named by partitions exist.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from hpcwatch import vocab
from hpcwatch.errors import BackendError, ParseError
from hpcwatch.records import Event, Job, Sample
from hpcwatch.sources.jsonstream import JsonArrayStream
from hpcwatch.sources.lines import file_time, read_text, shown
from hpcwatch.sources.slurm import sacct_records, squeue_jobs, squeue_records

__all__ = [
    "SlurmApiError",
    "load_answer",
    "parse_rest_jobs",
    "parse_rest_job_records",
    "parse_rest_accounting",
    "parse_rest_nodes",
    "parse_rest_partitions",
    "read_rest_nodes",
    "NOTHING_FOUND",
    "UP_STATES",
    "DOWN_FLAGS",
]

#: slurmdbd's "Nothing found with query" (an empty answer, not a failure).
NOTHING_FOUND = 9003
#: Base states of a node that takes work (sinfo(1), NODE STATE CODES).
UP_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
#: Flags that keep a node out of service whatever its base state.
DOWN_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "FAILING",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWER_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
    }
)


class SlurmApiError(BackendError):
    """slurmrestd answered with errors (its ``errors`` list, one line)."""


def load_answer(text: str, *, path: str | os.PathLike[str] = "<slurmrestd>", key: str) -> list[Any]:
    """The ``key`` list of an answer; ``[]`` for "Nothing found"; SlurmApiError for its errors."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ParseError(f"not JSON: {err.msg}", path=path, line=err.lineno) from err
    except (RecursionError, ValueError) as err:
        raise ParseError(f"not JSON: {shown(err, 60)}", path=path) from err
    if not isinstance(doc, dict):
        raise ParseError("not a slurmrestd answer (not an object)", path=path, line=1)
    errors = _raise_errors(doc, path)
    items = doc.get(key)
    if items is None and errors:
        return []
    if not isinstance(items, list):
        raise ParseError(f'not a slurmrestd answer (no "{key}" list)', path=path, line=1)
    return items


def _raise_errors(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> list[Mapping[str, Any]]:
    """The answer's ``errors``; SlurmApiError when one is more than "Nothing found"."""
    listed = doc.get("errors")
    errors = [e for e in listed if isinstance(e, Mapping)] if isinstance(listed, list) else []
    real = [e for e in errors if e.get("error_number", e.get("error_code")) != NOTHING_FOUND]
    if real:
        raise SlurmApiError(f"{path}: " + "; ".join(_error_text(e) for e in real[:3]))
    return errors


def _streamed_jobs(
    text: str, path: str | os.PathLike[str], jobs: JsonArrayStream | None = None
) -> Iterator[tuple[int, Any]]:
    """(line, raw job) of the answer's ``jobs``, decoded one at a time (``sources.jsonstream``: an answer of a
    month of accounting is as big as ``sacct --json``); its errors are raised as soon as they are read: before
    the first job when they come first (v0.0.38), else after the last (v0.0.40+ write ``jobs`` first)."""
    jobs = JsonArrayStream.from_text(text, "jobs", path=path) if jobs is None else jobs
    checked = False
    for item in jobs:
        if not checked:
            _raise_errors(jobs.members, path)
            checked = True
        yield item
    errors = _raise_errors(jobs.members, path)
    if not jobs.found and not errors:
        raise ParseError('not a slurmrestd answer (no "jobs" list)', path=path, line=1)


def _error_text(err: Mapping[str, Any]) -> str:
    parts = [str(err.get(k)) for k in ("error", "description", "source") if err.get(k)]
    number = err.get("error_number", err.get("error_code", err.get("errno")))
    return f"{' / '.join(parts) or 'error'} (error {number})"


def parse_rest_jobs(text: str, *, path: str | os.PathLike[str] = "<slurmrestd>") -> Iterator[Job]:
    """Jobs of ``/slurm/v0.0.3x/jobs`` (the controller's view: pending, running, recently ended)."""
    return squeue_jobs(_streamed_jobs(text, path), path=path)


def parse_rest_job_records(
    text: str, *, path: str | os.PathLike[str] = "<slurmrestd>", t: float | None = None
) -> Iterator[Job | Sample]:
    """``parse_rest_jobs``, then each running job's elapsed time and time limit at the answer's
    ``last_update`` (else ``t``, else now): ``sources.slurm.squeue_records``."""
    stream = JsonArrayStream.from_text(text, "jobs", path=path)
    return squeue_records(_streamed_jobs(text, path, stream), stream.members, path=path, t=t)


def parse_rest_accounting(text: str, *, path: str | os.PathLike[str] = "<slurmdbd>") -> Iterator[Job | Event | Sample]:
    """Jobs of ``/slurmdb/v0.0.3x/jobs`` (slurmdbd's records, sacct's shape), each followed by the samples of
    what it used (CPU seconds, memory, time limit: ``sources.slurm.parse_sacct_records``); "Nothing found" is
    no job."""
    return sacct_records(_streamed_jobs(text, path), path=path)


def _base_state(raw: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    state = raw.get("state")
    parts = [str(s).upper() for s in state] if isinstance(state, list) else [str(state or "UNKNOWN").upper()]
    listed = raw.get("state_flags")
    flags = {str(f).upper() for f in (listed if isinstance(listed, list) else [])} | set(parts[1:])
    return parts[0] if parts else "UNKNOWN", frozenset(flags)


def _tres_gpus(tres: Any) -> float:
    total = 0.0
    for item in str(tres or "").split(","):
        name, _, count = item.partition("=")
        if name == "gres/gpu" and count.isdigit():
            total += int(count)
    return total


def _number(raw: Mapping[str, Any], key: str, where: str) -> float:
    value = raw.get(key, 0)
    if isinstance(value, Mapping):  # 23.11+: {"set": true, "infinite": false, "number": N}
        value = value.get("number", 0) if value.get("set", True) else 0
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParseError(f"{where}: {key} is not a number: {shown(value, 40)}")
    return float(value)


def parse_rest_nodes(
    text: str, *, t: float | None = None, path: str | os.PathLike[str] = "<slurmrestd>"
) -> Iterator[Sample]:
    """The samples of ``/slurm/v0.0.3x/nodes`` or ``sinfo --json`` (see the module docstring), at ``t``
    (default: now, the answer's own time)."""
    t = time.time() if t is None else t
    for i, raw in enumerate(load_answer(text, path=path, key="nodes")):
        if not isinstance(raw, Mapping) or not raw.get("name"):
            raise ParseError(f"nodes[{i}]: a node without a name", path=path)
        base, flags = _base_state(raw)
        labels = {"node": str(raw["name"]), "state": base.lower()}
        if isinstance(listed := raw.get("partitions"), list) and listed:
            labels["partitions"] = ",".join(sorted(str(p) for p in listed))
        where = f"nodes[{i}] ({raw['name']})"
        try:
            values = (
                (vocab.SLURM_NODE_UP, float(base in UP_STATES and not flags & DOWN_FLAGS)),
                (vocab.SLURM_NODE_CPUS, _number(raw, "cpus", where)),
                (vocab.SLURM_NODE_ALLOC_CPUS, _number(raw, "alloc_cpus", where)),
                (vocab.SLURM_NODE_GPUS, _tres_gpus(raw.get("tres"))),
                (vocab.SLURM_NODE_ALLOC_GPUS, _tres_gpus(raw.get("tres_used"))),
            )
        except ParseError as err:
            raise err.at(path) from err
        for metric, value in values:
            yield Sample(metric=metric, labels=labels, t=t, value=value)


def _nested(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``raw[key]`` when it is an object (the newer API nests it there), else ``raw`` itself."""
    inner = raw.get(key)
    return inner if isinstance(inner, Mapping) else raw


def parse_rest_partitions(
    text: str, *, t: float | None = None, path: str | os.PathLike[str] = "<slurmrestd>"
) -> Iterator[Sample]:
    """The samples of ``/slurm/v0.0.3x/partitions`` (see the module docstring), at ``t`` (default: now)."""
    t = time.time() if t is None else t
    for i, raw in enumerate(load_answer(text, path=path, key="partitions")):
        if not isinstance(raw, Mapping) or not raw.get("name"):
            raise ParseError(f"partitions[{i}]: a partition without a name", path=path)
        inner = _nested(raw, "partition")  # 23.11+ nesting
        state = inner.get("state")
        state = state[0] if isinstance(state, list) and state else state
        labels = {"partition": str(raw["name"]), "state": str(state or "unknown").lower()}
        nodes, cpus = _nested(raw, "nodes"), _nested(raw, "cpus")
        where = f"partitions[{i}] ({raw['name']})"
        try:
            n_nodes = _number(nodes, "total" if nodes is not raw else "total_nodes", where)
            n_cpus = _number(cpus, "total" if cpus is not raw else "total_cpus", where)
        except ParseError as err:
            raise err.at(path) from err
        yield Sample(metric=vocab.SLURM_PARTITION_NODES, labels=labels, t=t, value=n_nodes)
        yield Sample(metric=vocab.SLURM_PARTITION_CPUS, labels=labels, t=t, value=n_cpus)


def read_rest_nodes(path: str | os.PathLike[str], *, t: float | None = None) -> Iterator[Sample]:
    """A saved nodes answer; its samples are dated ``t``, else the file's write time."""
    yield from parse_rest_nodes(read_text(path), t=file_time(path) if t is None else t, path=path)
