"""The job page's live verdicts: the newest event of each kind about one job, read without every job's."""

from __future__ import annotations

from hpcwatch.records import Event
from hpcwatch.reports.livejob import live_verdicts
from hpcwatch.store import Store
from hpcwatch.vocab import EventKind


def _event(kind: str, t: float, job: object, **attrs: object) -> Event:
    return Event(kind=kind, t=t, source="collect", attrs={"job": job, **attrs})


def test_the_newest_of_each_kind_about_the_job_and_nothing_of_the_others() -> None:
    with Store() as store:
        store.add(
            [
                _event(EventKind.LIVE_STRAGGLER, 10.0, "41", rank=3),
                _event(EventKind.LIVE_STRAGGLER, 30.0, "41", rank=5),
                _event(EventKind.LIVE_STRAGGLER, 20.0, "41", rank=4),  # committed later, older: not the newest
                _event(EventKind.LIVE_STRAGGLER, 40.0, "42", rank=1),  # another job's
                _event(EventKind.LIVE_HANG, 25.0, 41, missing=[2]),  # the job as a JSON number
                _event(EventKind.LIVE_TRACE, 50.0, "410"),  # an id that only starts alike
                Event(kind=EventKind.LIVE_DUMP, t=60.0, source="collect", attrs={}),  # no job at all
                _event("nccl_rank", 70.0, "41"),  # not a live verdict
            ]
        )
        found = live_verdicts(store, "41")
        assert (found.straggler.t, found.straggler.attrs["rank"]) == (30.0, 5)
        assert found.hang is not None and found.hang.attrs["missing"] == [2]
        assert found.dump is None and found.trace is None
        assert live_verdicts(store, "43").any is False
