"""What every detector asks of the scheduler: which job ran on this node (and GPU) at time t.

Detectors tie a signal to a job through Slurm's records: ``Job.nodes``,
``Job.gpus_by_node``, ``Job.start``/``Job.end`` (``end`` is None while it runs).
A pending job (no start) never owns a node. A requeued job's lost attempts
(``job_end`` events of state REQUEUED, from ``sacct --json``) held their nodes
too: ``with_requeued_attempts`` adds each as a job of the same id.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from hpcwatch.records import Event, Job
from hpcwatch.vocab import EventKind

__all__ = ["JobIndex", "HostJobs", "host_of", "once_per_labels", "with_requeued_attempts"]

_HOST_KEYS = ("host", "Hostname", "hostname", "node", "node_name", "instance")
_ENDED_STATES = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
)


def host_of(attrs: Mapping[str, object]) -> str | None:
    """The node a sample's labels or an event's attrs name (``instance`` loses its ``:port``)."""
    for key in _HOST_KEYS:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value.rsplit(":", 1)[0] if key == "instance" else value
    return None


_T = TypeVar("_T")


def once_per_labels(read: Callable[[Mapping[str, str]], _T]) -> Callable[[Mapping[str, str]], _T]:
    """``read``, computed once per labels mapping: the store's samples share one labels dict per series
    (``store.queries.samples_of_table``), so a detector reads a series' labels once, not once a sample. The
    memo holds each mapping, so no other object takes its id while the memo lives (make one a scan)."""
    memo: dict[int, tuple[Mapping[str, str], _T]] = {}

    def cached(labels: Mapping[str, str]) -> _T:
        hit = memo.get(id(labels))
        if hit is None:
            hit = memo[id(labels)] = (labels, read(labels))
        return hit[1]

    return cached


def with_requeued_attempts(jobs: list[Job], events: Iterable[Event]) -> list[Job]:
    """``jobs``, then one ended job per attempt Slurm requeued (each distinct (job, start) once), so that the
    traffic of a lost attempt is its job's, not nobody's. After the jobs: ``JobIndex.by_id`` finds the
    current record first."""
    known = {j.id: j for j in jobs}
    attempts: dict[tuple[str, float], Job] = {}
    for event in events:
        attrs = event.attrs
        if event.kind != EventKind.JOB_END or attrs.get("state") != "REQUEUED" or attrs.get("start") is None:
            continue
        job_id, start = str(attrs.get("job")), float(attrs["start"])
        current = known.get(job_id)
        nodes = tuple(attrs.get("nodes") or (current.nodes if current is not None else ()))
        attempts.setdefault(
            (job_id, start),
            Job(
                id=job_id,
                user=attrs.get("user") or (current.user if current else None),
                account=current.account if current else None,
                nodes=nodes,
                gpus=current.gpus if current else 0,
                start=start,
                end=float(attrs.get("end", event.t)),
                state="REQUEUED",
                name=current.name if current else None,
            ),
        )
    return jobs + list(attempts.values())


@dataclass(frozen=True, slots=True)
class HostJobs:
    """The jobs that list one node (``JobIndex.on``'s candidates, in its order), with their starts and ends
    (``JobIndex.end_of``) as arrays: which held the node is asked of every job and many times at once."""

    jobs: tuple[Job, ...]
    starts: np.ndarray
    ends: np.ndarray

    def covering(self, times: np.ndarray, *, grace_s: float = 0.0) -> np.ndarray:
        """jobs x ``times``: whether each job held the node at each time (``grace_s`` widens each job's window
        at both ends), as ``JobIndex.on`` says."""
        return (self.starts[:, None] - grace_s <= times[None, :]) & (times[None, :] <= self.ends[:, None] + grace_s)


@dataclass(frozen=True, slots=True)
class JobIndex:
    jobs: tuple[Job, ...]
    by_host: Mapping[str, tuple[Job, ...]] = field(default_factory=dict, compare=False, repr=False)
    """The jobs that list each node, in ``jobs``' order: ``on`` asks it thousands of times a scan."""
    _holding: dict[str, HostJobs] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, jobs: Iterable[Job]) -> JobIndex:
        started = tuple(j for j in jobs if j.start is not None)
        by_host: dict[str, list[Job]] = {}
        for job in started:
            for node in dict.fromkeys(job.nodes):  # a node listed twice holds the job once
                by_host.setdefault(node, []).append(job)
        return cls(started, {node: tuple(held) for node, held in by_host.items()})

    @staticmethod
    def end_of(job: Job) -> float:
        """When the job ended; +inf while it runs (squeue gives a running job's time limit as end_time)."""
        if job.end is None or (job.state or "").upper() in (
            "RUNNING",
            "PENDING",
            "SUSPENDED",
            "CONFIGURING",
            "COMPLETING",
        ):
            return math.inf
        return job.end

    def on(self, host: str | None, t: float, *, grace_s: float = 0.0) -> list[Job]:
        """Jobs holding ``host`` at ``t`` (``grace_s`` widens each job's window at both ends)."""
        if host is None:
            candidates = self.jobs
        elif self.by_host or not self.jobs:
            candidates = self.by_host.get(host, ())
        else:  # made without ``of``: no index
            candidates = tuple(j for j in self.jobs if host in j.nodes)
        return [
            j
            for j in candidates
            if j.start is not None  # always: ``of`` keeps started jobs only
            and j.start - grace_s <= t <= self.end_of(j) + grace_s
        ]

    def holding(self, host: str) -> HostJobs:
        """The jobs that list ``host``, as ``HostJobs`` (made once a host)."""
        held = self._holding.get(host)
        if held is None:
            listing = (
                self.by_host.get(host, ())
                if self.by_host or not self.jobs
                else (j for j in self.jobs if host in j.nodes)
            )
            jobs = tuple(j for j in listing if j.start is not None)
            held = self._holding[host] = HostJobs(
                jobs,
                np.array([j.start for j in jobs], dtype=np.float64),
                np.array([self.end_of(j) for j in jobs], dtype=np.float64),
            )
        return held

    def on_gpu(self, host: str, gpu: int | str, t: float, *, grace_s: float = 0.0) -> list[Job]:
        """Jobs holding GPU ``gpu`` of ``host`` at ``t``; a job with no per-GPU detail holds all of the node's."""
        out = []
        for job in self.on(host, t, grace_s=grace_s):
            held = job.gpus_by_node.get(host)
            if not held or int(gpu) in held:
                out.append(job)
        return out

    def ended(self) -> list[Job]:
        return [j for j in self.jobs if self.end_of(j) != math.inf]

    def by_id(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs if j.id == job_id), None)
