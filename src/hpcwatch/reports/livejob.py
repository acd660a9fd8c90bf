"""A running job, live: its verdicts from the hook's stream, and what its Flight Recorder dumps and
on-demand traces say. ``collect.live`` calls the first three as it reads the stream; the job page calls
``live_verdicts`` to show what the collector stored.

- ``judge``            the window of spans and each rank's last stop -> ``analysis.live.LiveVerdict``
- ``read_dumps``       the dumps a hang asked for -> the ``analysis.hang`` verdict, as event attrs
- ``read_trace``       an on-demand trace -> its rank and steps, as event attrs
- ``live_verdicts``    the job's newest straggler, hang, dump and trace events (``JobLive``)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcwatch.analysis.hang import analyse_hang
from hpcwatch.analysis.live import DEFAULT_HANG_AFTER_S, LiveVerdict, Stop, judge_live
from hpcwatch.analysis.steps import rank_timeline
from hpcwatch.records import Event, Span
from hpcwatch.sources.flight_recorder import read_flight_recorder
from hpcwatch.sources.kineto import read_kineto
from hpcwatch.store import queries
from hpcwatch.vocab import EventKind

if TYPE_CHECKING:
    from hpcwatch.store import Store

__all__ = ["judge", "read_dumps", "read_trace", "JobLive", "live_verdicts", "LIVE_KINDS", "Stop", "LiveVerdict"]

#: The events ``collect.live`` stores about a running job.
LIVE_KINDS = (EventKind.LIVE_STRAGGLER, EventKind.LIVE_HANG, EventKind.LIVE_DUMP, EventKind.LIVE_TRACE)


def judge(
    job: str,
    spans: Sequence[Span],
    stops: Mapping[int, Stop],
    *,
    last_progress: float,
    now: float,
    hang_after_s: float = DEFAULT_HANG_AFTER_S,
) -> LiveVerdict:
    return judge_live(job, spans, stops, last_progress=last_progress, now=now, hang_after_s=hang_after_s)


def read_dumps(paths: Sequence[Path]) -> tuple[list[Event], dict[str, Any]]:
    """The dumps' events (to store, as ``hpcwatch hang`` reads them) and the hang verdict's summary."""
    events = [read_flight_recorder(p) for p in paths]
    report = analyse_hang([e.attrs for e in events])
    summary: dict[str, Any] = {"verdict": report.verdict, "ranks_dumped": list(report.ranks)}
    for group in report.groups:
        if group.wavefront is not None:
            front = group.wavefront
            summary.update(
                wavefront_op=front.op, wavefront_seq=front.seq, arrived=list(front.arrived), missing=list(front.missing)
            )
            break
    return events, summary


def read_trace(path: Path) -> dict[str, Any]:
    """What an on-demand trace holds: its rank and the steps it covers."""
    timeline = rank_timeline(read_kineto(path))
    return {"rank": timeline.rank, "steps": sorted({c.step for c in timeline.cells}), "path": str(path)}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLive:
    job: str
    straggler: Event | None
    hang: Event | None
    dump: Event | None
    trace: Event | None

    @property
    def any(self) -> bool:
        return any((self.straggler, self.hang, self.dump, self.trace))


def live_verdicts(store: Store, job: str) -> JobLive:
    """The newest live event of each kind about ``job``."""
    newest = {event.kind: event for event in queries.newest_job_events(store, LIVE_KINDS, job)}
    return JobLive(
        job=job,
        straggler=newest.get(EventKind.LIVE_STRAGGLER),
        hang=newest.get(EventKind.LIVE_HANG),
        dump=newest.get(EventKind.LIVE_DUMP),
        trace=newest.get(EventKind.LIVE_TRACE),
    )
