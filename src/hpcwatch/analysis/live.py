"""A running job's verdicts from its last steps: the straggler, and the hang.

- **Straggler**: the job's last steps (the spans of the steps every rank finished) go through the very
  analysis a finished job's do (``steps.anatomy_from_spans`` then ``stragglers.find_stragglers``), so a
  rank is named live on the same evidence and thresholds as after the fact.
- **Hang**: no rank advanced (began a phase or finished a step) for ``hang_after_s`` while at least one
  rank is not closed. Each rank's last ``enter`` says where it stopped: its step, its phase and the
  collective it was about to wait in. The ranks at the lowest step are ``behind`` (the others are waiting
  for them); when every rank stopped at the same step, the hook alone cannot tell who holds the others,
  and the Flight Recorder dump does (``hang.analyse_hang``: who never issued the collective).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpcwatch.analysis.steps import anatomy_from_spans
from hpcwatch.analysis.stragglers import StragglerConfig, StragglerReport, find_stragglers
from hpcwatch.errors import InputError
from hpcwatch.records import Span

__all__ = ["Stop", "LiveHang", "LiveVerdict", "judge_live", "find_live_hang", "DEFAULT_HANG_AFTER_S"]

#: Seconds without progress on every rank that make a hang. A step of a large job can take seconds, a
#: checkpoint minutes: the collector's ``hang_after_s`` should exceed the job's longest pause.
DEFAULT_HANG_AFTER_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """Where one rank was when it last advanced."""

    rank: int
    t: float
    step: int | None
    phase: str
    collective: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveHang:
    stalled_s: float
    """Seconds since the last progress of any rank."""
    step: int | None
    """The lowest step a rank stopped at."""
    stops: tuple[Stop, ...]
    behind: tuple[int, ...]
    """Ranks at the lowest step while others are further (empty: all stopped at the same step)."""

    @property
    def collectives(self) -> tuple[str, ...]:
        """The collectives (or, unnamed, the phases) the ranks stopped in, each once."""
        return tuple(dict.fromkeys(s.collective or s.phase for s in self.stops))


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveVerdict:
    job: str
    stragglers: StragglerReport | None
    """None when the window holds no complete step."""
    hang: LiveHang | None
    steps: tuple[int, ...] = field(default=())
    """The steps the straggler verdict looked at."""


def find_live_hang(stops: Mapping[int, Stop], last_progress: float, now: float, hang_after_s: float) -> LiveHang | None:
    """The hang, if no rank advanced for ``hang_after_s``; ``stops``: each open rank's last ``enter``."""
    stalled = now - last_progress
    if not stops or stalled < hang_after_s:
        return None
    ordered = tuple(stops[r] for r in sorted(stops))
    steps = [s.step for s in ordered if s.step is not None]
    low = min(steps) if steps else None
    behind = tuple(s.rank for s in ordered if s.step == low) if steps and max(steps) != low else ()
    return LiveHang(stalled_s=stalled, step=low, stops=ordered, behind=behind)


def judge_live(
    job: str,
    spans: Sequence[Span],
    stops: Mapping[int, Stop],
    *,
    last_progress: float,
    now: float,
    hang_after_s: float = DEFAULT_HANG_AFTER_S,
    config: StragglerConfig | None = None,
) -> LiveVerdict:
    """The job's live verdicts from its window of spans and its ranks' last stops."""
    report: StragglerReport | None = None
    steps: tuple[int, ...] = ()
    try:
        anatomy = anatomy_from_spans(spans)
    except InputError:  # no complete step yet
        anatomy = None
    if anatomy is not None and anatomy.steps:
        report, steps = find_stragglers(anatomy, config), anatomy.steps
    return LiveVerdict(
        job=job, stragglers=report, hang=find_live_hang(stops, last_progress, now, hang_after_s), steps=steps
    )
