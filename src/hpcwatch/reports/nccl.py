"""Two questions about the ML stack's communication: what did NCCL build (and what is wrong with it), and
why does the job hang. Inputs are files (read through the format registry) or the store.

``nccl_report`` reads NCCL debug logs (``nccl-log``) into a topology, the rules that fired, WARN lines
and watchdog timeouts; ``hang_report`` reads Flight Recorder dumps (``flight-recorder``) into the
wavefront, mismatches and last completed collective. Both also take the events already stored
(``nccl_report_of`` / ``hang_report_of``), so the CLI, the web card and the Observer agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpcwatch.analysis.hang import HangReport, analyse_hang
from hpcwatch.analysis.nccl import (
    FORCING_VARIABLES,
    NcclConfig,
    NcclRule,
    NcclTopology,
    communicator_groups,
    nccl_rules,
    summarize_nccl,
)
from hpcwatch.errors import InputError, ParseError
from hpcwatch.records import Event, Job
from hpcwatch.sources.registry import Input, plan_inputs
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind

__all__ = [
    "NcclReport",
    "nccl_report",
    "nccl_report_of",
    "hang_report",
    "hang_report_of",
    "read_events",
    "NCCL_LOG_KINDS",
]

NCCL_LOG_KINDS = (EventKind.NCCL_RANK, EventKind.NCCL_WARN, EventKind.NCCL_TIMEOUT)
#: WARN lines and timeouts kept in a report (a flapping link can print thousands).
MAX_LINES_KEPT = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclReport:
    topology: NcclTopology
    rules: tuple[NcclRule, ...]
    warns: tuple[dict[str, Any], ...]
    timeouts: tuple[dict[str, Any], ...]
    files: tuple[str, ...] = ()
    bad_lines: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": list(self.files),
            "topology": self.topology.to_dict(),
            "rules": [r.to_dict() for r in self.rules],
            "warns": list(self.warns),
            "timeouts": list(self.timeouts),
            "bad_lines": list(self.bad_lines),
        }


def read_events(paths: Iterable[str | os.PathLike[str]], format_name: str) -> tuple[list[Event], list[str], list[str]]:
    """(events, files read, bad lines) of the files of ``format_name`` under ``paths``; a file named
    on the command line that is another format is an error, a folder's others are passed over."""
    named = {os.fspath(p) for p in paths}
    bad: list[ParseError] = []
    events: list[Event] = []
    files: list[str] = []
    for item in plan_inputs(paths, on_bad_line=bad.append):
        if not isinstance(item, Input) or item.format is None:
            continue
        if item.format.name != format_name:
            if os.fspath(item.path) in named:
                raise InputError(f"{item.path}: not a {format_name} file (it reads as {item.format.name})")
            continue
        events.extend(item.format.read(item.path, item.context))
        files.append(str(item.path))
    if not files:
        raise InputError(f"{', '.join(map(str, named))}: no {format_name} file found")
    return events, files, [str(e) for e in bad]


def nccl_report_of(
    events: Sequence[Event],
    *,
    config: NcclConfig = NcclConfig(),
    files: Sequence[str] = (),
    bad_lines: Sequence[str] = (),
) -> NcclReport:
    """The report of one job's NCCL log events."""
    ranks = [dict(e.attrs) for e in events if e.kind == EventKind.NCCL_RANK]
    topology = summarize_nccl(ranks)
    # a followed log's nccl_rank is stored at Init COMPLETE, before the WARN lines that come later
    warn_lines = sum(1 for e in events if e.kind == EventKind.NCCL_WARN)
    topology = replace(topology, warns=max(topology.warns, warn_lines))
    return NcclReport(
        topology=topology,
        rules=tuple(nccl_rules(topology, config=config)),
        warns=tuple(dict(e.attrs) for e in events if e.kind == EventKind.NCCL_WARN)[:MAX_LINES_KEPT],
        timeouts=tuple(dict(e.attrs) for e in events if e.kind == EventKind.NCCL_TIMEOUT)[:MAX_LINES_KEPT],
        files=tuple(files),
        bad_lines=tuple(bad_lines[:MAX_LINES_KEPT]),
    )


def nccl_report(paths: Iterable[str | os.PathLike[str]], *, config: NcclConfig = NcclConfig()) -> NcclReport:
    """Read the NCCL logs under ``paths`` (one job) and report on them."""
    events, files, bad = read_events(list(paths), "nccl-log")
    return nccl_report_of(events, config=config, files=files, bad_lines=bad)


def hang_report_of(events: Sequence[Event]) -> HangReport:
    """The hang report of one job's Flight Recorder dump events (the newest dump of each rank)."""
    newest: dict[Any, Event] = {}
    for e in sorted(events, key=lambda e: e.t):
        if e.kind == EventKind.FLIGHT_RECORDER_DUMP:
            newest[e.attrs.get("rank")] = e
    return analyse_hang([dict(e.attrs) for e in newest.values()])


def hang_report(paths: Iterable[str | os.PathLike[str]]) -> HangReport:
    """Read the Flight Recorder dumps under ``paths`` (one per rank) and say why the job hangs."""
    events, _, _ = read_events(list(paths), "flight-recorder")
    return hang_report_of(events)


def stored_nccl_report(store: Store, *, config: NcclConfig = NcclConfig()) -> NcclReport:
    """The report of every NCCL log event in the store (one job's store)."""
    return nccl_report_of(nccl_log_events(store), config=config)


def stored_hang_report(store: Store) -> HangReport:
    return hang_report_of(store.events(EventKind.FLIGHT_RECORDER_DUMP))


__all__ += ["stored_nccl_report", "stored_hang_report"]


def _communicators(ranks: Sequence[Event]) -> list[list[Event]]:
    """The processes grouped by the communicators they share (``comm_ids``; one job's ranks all share its
    world communicator); a process that logged no commId is a group of its own host."""
    return communicator_groups(ranks, lambda e: ("host", e.attrs.get("host")))


def _job_of(hosts: set[str], t: float, nranks: int, jobs: Sequence[Job]) -> str | None:
    """The job that ran on all these hosts at ``t`` (NCCL lines name no job): of those, the one spread
    over fewest other nodes, then the one whose GPU count is nearest the ranks, then the newest."""
    found = [
        j
        for j in jobs
        if hosts <= set(j.nodes or ()) and j.start is not None and j.start <= t and (j.end is None or t <= j.end)
    ]
    best = min(
        found, key=lambda j: (len(j.nodes) - len(hosts), abs((j.gpus or 0) - nranks), -(j.start or 0.0)), default=None
    )
    return best.id if best is not None else None


def job_of_processes(jobs: Sequence[Job]) -> Callable[[Sequence[Event]], str | None] | None:
    """For ``analysis.nccl.nccl_jobs``: the Slurm job that ran a group of ``nccl_rank`` events (``_job_of``),
    or None when the store holds no job."""
    if not jobs:
        return None

    def job_of(group: Sequence[Event]) -> str | None:
        hosts = {str(e.attrs.get("host")) for e in group}
        nranks = max([int(e.attrs.get("nranks") or 0) for e in group] + [len(group)])
        return _job_of(hosts, min(e.t for e in group), nranks, jobs)

    return job_of


def _by_job(events: Sequence[Event], jobs: Sequence[Job]) -> dict[str | None, list[Event]]:
    groups: dict[str | None, list[Event]] = {}
    host_job: dict[str, str | None] = {}
    for group in _communicators([e for e in events if e.kind == EventKind.NCCL_RANK]):
        hosts = {str(e.attrs.get("host")) for e in group}
        nranks = max([int(e.attrs.get("nranks") or 0) for e in group] + [len(group)])
        job = _job_of(hosts, min(e.t for e in group), nranks, jobs)
        groups.setdefault(job, []).extend(group)
        for h in hosts:
            host_job.setdefault(h, job)
    for e in events:  # WARN lines and timeouts: the job of their host's processes, else the job on the host
        if e.kind != EventKind.NCCL_RANK:
            host = str(e.attrs.get("host") or e.attrs.get("node"))
            job = host_job[host] if host in host_job else _job_of({host}, e.t, 0, jobs)
            groups.setdefault(job, []).append(e)
    return groups


def nccl_log_events(store: Store) -> list[Event]:
    """Every stored NCCL log event (``NCCL_LOG_KINDS``)."""
    return [e for kind in NCCL_LOG_KINDS for e in store.events(kind)]


def nccl_hosts(events: Iterable[Event]) -> frozenset[str]:
    """The hosts NCCL log ``events`` name (``host``, or a WARN line's ``node``): an event is told the job of a job
    listing its hosts (``_job_of``), so only the jobs on these hosts change what ``stored_nccl_by_job`` says."""
    return frozenset(
        name for e in events for name in (str(e.attrs.get("host")), str(e.attrs.get("host") or e.attrs.get("node")))
    )


def stored_nccl_by_job(
    store: Store,
    *,
    config: NcclConfig = NcclConfig(),
    events: Sequence[Event] | None = None,
    jobs: Sequence[Job] | None = None,
) -> list[tuple[str | None, NcclReport]]:
    """(job id, report) per job whose processes logged NCCL events while it ran (``_job_of``); events no
    job explains are reported together under None. Jobs in the order they started. ``events``: the store's NCCL
    log events already read (``nccl_log_events``); ``jobs``: its jobs, or those on the events' hosts
    (``nccl_hosts``), in ``Store.jobs`` order: the same answer."""
    jobs = store.jobs() if jobs is None else jobs
    groups = _by_job(nccl_log_events(store) if events is None else events, jobs)
    start = {j.id: j.start or 0.0 for j in jobs}
    order = sorted(groups, key=lambda j: (j is None, start.get(j, 0.0) if j else 0.0, j or ""))
    return [(job, nccl_report_of(groups[job], config=config)) for job in order]


def nccl_card(
    store: Store,
    *,
    config: NcclConfig = NcclConfig(),
    events: Sequence[Event] | None = None,
    jobs: Sequence[Job] | None = None,
) -> list[dict[str, Any]]:
    """What the ML-stack card shows per job (plain values for the page): ``job``, ``versions`` (NCCL version ->
    hosts), ``networks``, ``transports`` (kind -> connections), ``coll_channels``, ``rings_max``, ``env`` (the
    NCCL_* variables set), ``forcing`` (those of them that force NCCL's tuning), ``rules`` (rule, verdict, title,
    hosts), ``processes``, ``warns``, ``timeouts``. ``events``, ``jobs``: as ``stored_nccl_by_job`` takes them."""
    out = []
    for job, report in stored_nccl_by_job(store, config=config, events=events, jobs=jobs):
        top = report.topology
        out.append(
            {
                "job": job,
                "processes": top.processes,
                "hosts": list(top.hosts),
                "versions": {v: list(h) for v, h in top.versions.items()},
                "networks": dict(top.networks),
                "transports": dict(top.transports),
                "gdr": top.gdr,
                "coll_channels": list(top.coll_channels),
                "rings_max": top.rings_max,
                "env": dict(top.env),
                "forcing": sorted(k for k in top.env if k in FORCING_VARIABLES),
                "rules": [
                    {"rule": r.rule, "verdict": r.verdict, "title": r.title, "hosts": list(r.hosts)}
                    for r in report.rules
                ],
                "warns": top.warns,
                "timeouts": len(report.timeouts),
            }
        )
    return out


__all__ += ["nccl_log_events", "nccl_hosts", "stored_nccl_by_job", "nccl_card"]
